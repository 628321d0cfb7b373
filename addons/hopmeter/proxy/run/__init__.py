"""The `hopmeter run` process: its command line (`command`, `config`), the master it runs
(`runner`, `master`: mitmdump's addons with hopmeter's where `-s` loads scripts), its signals
(`drain`), `--workers` (`workers`), how its sockets listen (`listen`) and its event loop
(`loops`). What it changes process-wide it may: it owns the process."""
