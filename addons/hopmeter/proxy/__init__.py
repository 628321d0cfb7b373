"""The mitmproxy layer: the only package that imports mitmproxy.

`tap` holds the stream callables (the code that keeps the "never holds a byte" promise), `addon`
the addon whose hooks hand each flow to the sans-I/O core, `outputs` one small addon per place a
finished flow goes. `runner` assembles them (`default_addons()`, also what `mitmdump -s` loads
through `mitmdump/script.py`) into a master and runs it; `config` and `command` are `hopmeter
run`, `workers` its `--workers`, `listen` how its sockets listen.

Importing this package imports nothing: the command line reads `config` and `command` for every
command, and mitmproxy costs most of a second to import.
"""
