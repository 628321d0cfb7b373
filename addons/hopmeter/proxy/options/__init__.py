"""Each setting of `hopmeter run` and of hopmeter's addons declared once, and everything else
derived from that declaration.

`declared.SETTINGS` is the table: per setting its flag, its mitmproxy option (`hopmeter_*`), the
addon that owns the option, its kind (text, switch, duration, size, ...), default and help.
From it come `hopmeter run`'s flags (`add_flags`, in `hopmeter.proxy.run.command`), their
HOPMETER_* variables (hopmeter.env, named after the flags), the options each addon declares in
its `load` (`declare`) and reads in its `configure` (`read`: a duration or a size read once, by
hopmeter.argtypes), the options `hopmeter run` sets on its master (`run_options`) and
docs/cli.md (`.venv/bin/python -m hopmeter.proxy.options.docs > docs/cli.md`).

No mitmproxy here: the command line imports this package for every command.
"""

from hopmeter.proxy.options.declared import (
    BROWSER,
    CONSOLE,
    DRAIN,
    GUARD,
    MEASURING,
    METRICS,
    OTEL,
    PASSAGE,
    QUEUES,
    READINESS,
    RECORDS,
    RELAY,
    SETTINGS,
    UI,
)
from hopmeter.proxy.options.setting import Kind, Setting
from hopmeter.proxy.options.table import (
    FLAGS,
    OPTIONS,
    add_flags,
    declare,
    default,
    read,
    run_options,
    said_by_flag,
)

__all__ = [
    "BROWSER",
    "CONSOLE",
    "DRAIN",
    "FLAGS",
    "GUARD",
    "MEASURING",
    "METRICS",
    "OPTIONS",
    "OTEL",
    "PASSAGE",
    "QUEUES",
    "READINESS",
    "RECORDS",
    "RELAY",
    "SETTINGS",
    "UI",
    "Kind",
    "Setting",
    "add_flags",
    "declare",
    "default",
    "read",
    "run_options",
    "said_by_flag",
]
