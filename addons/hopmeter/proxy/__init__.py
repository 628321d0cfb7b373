"""The mitmproxy layer: the only package that imports mitmproxy.

By kind: `addon/` is what mitmproxy loads (`chain.default_addons()`, also what `mitmdump -s`
loads through `mitmdump/script.py`), `delivery/` follows each chunk out to the client, `run/` is
the `hopmeter run` process (its command, master, drain, workers), `fastpath/` holds every private
reach into mitmproxy, h11 and asyncio behind a version gate, and `options/` declares each setting
once: the flags of `hopmeter run`, their variables, the addons' options and docs/cli.md are made
from it.

Importing this package imports nothing: the command line reads `options/` and `run/command` for
every command, and mitmproxy costs most of a second to import.
"""
