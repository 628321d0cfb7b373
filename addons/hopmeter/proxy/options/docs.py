"""docs/cli.md, made from the table of settings:
`.venv/bin/python -m hopmeter.proxy.options.docs > docs/cli.md` (tests/proxy/options/test_docs.py
checks the committed file is what this writes)."""

from __future__ import annotations

import sys

from hopmeter.env import variable
from hopmeter.proxy.options.setting import Kind, Setting
from hopmeter.proxy.options.table import FLAGS, OPTIONS

HEADER = """\
# `hopmeter run`: flags, variables, options

<!-- Made by `.venv/bin/python -m hopmeter.proxy.options.docs > docs/cli.md` from the settings
declared in addons/hopmeter/proxy/options/declared.py: change them there, then remake this file.
-->

`hopmeter run [UPSTREAM_URL] [FLAGS]` measures a reverse proxy in front of UPSTREAM_URL (or the
listeners `--listener` names). Each setting is declared once
(`addons/hopmeter/proxy/options/declared.py`); its flag, its environment variable, its mitmproxy
option, `hopmeter run --help` and this page are made from that declaration.

## Flags

"""

ENVIRONMENT = """
Every flag can come from its environment variable instead (a container's usual configuration); a
flag on the command line wins over its variable. Switches take `1`/`true`/`yes`/`on` or
`0`/`false`/`no`/`off`; repeatable flags take several values separated by spaces (shell-quoted
when one holds a space), and given on the command line they replace the variable's list. A bad
value is one line naming the variable. `hopmeter run --help` shows each flag's variable. Only
`hopmeter run` reads the environment: the other commands' flags share names with it
(`hopmeter upstream --listen`) and must not pick up the proxy's settings.

A duration reads the same in a flag, a variable and an option: seconds as `0.5`, `0.5s` or
`500ms`.

## Options

Plain mitmproxy loads the same addons (`mitmdump -s "$(hopmeter --addon-path)"`) and takes these
options with `--set NAME=VALUE`; `hopmeter run --set NAME=VALUE` sets them too, after its flags.
The durations and sizes are text (`--set hopmeter_stall_threshold=500ms`): mitmproxy's `--set`
cannot set a number with a fraction. `hopmeter_drain_timeout` and `hopmeter_relay` act in
`hopmeter run` only, which owns the process's signals and its fast paths. The last column names
the flag of `hopmeter run` that sets the option, or the value `hopmeter run` gives it where that
differs from plain mitmproxy's.

"""


def render() -> str:
    """The whole of docs/cli.md."""
    flags = [_flag_row(s) for s in FLAGS if not s.hidden]
    options = [_option_row(s) for s in OPTIONS.values()]
    return (
        HEADER
        + _table(("flag", "environment", "option", "meaning", "default"), flags)
        + ENVIRONMENT
        + _table(("option", "meaning", "default", "`hopmeter run`"), options)
    )


def _flag_row(s: Setting) -> list[str]:
    spelling = s.metavar if s.positional and s.metavar else s.flag
    if s.kind is Kind.ON_OFF:
        spelling += " on|off"
    elif s.choices:
        spelling += " " + "|".join(map(str, s.choices))
    elif s.kind is not Kind.SWITCH and s.metavar and not s.positional:
        spelling += f" {s.metavar}"
    if s.sets is not None:
        option = f"`{s.sets[0]}={_value(s.sets[1])}`"
    else:
        option = f"`{s.option}`" if s.option else ""
    name = s.attribute if s.positional else s.flag
    return [f"`{spelling}`", f"`{variable(name)}`", option, _meaning(s), _default(s)]


def _option_row(s: Setting) -> list[str]:
    flags = [f"`{f.flag}`" for f in FLAGS if f.option == s.option and not f.positional]
    flags += [f"`{f.flag}`" for f in FLAGS if f.sets is not None and f.sets[0] == s.option]
    run = ", ".join(flags) if flags else f"`{_value(s.run)}`" if s.run is not None else ""
    return [f"`{s.option}`", _meaning(s), _default(s), run]


def _meaning(s: Setting) -> str:
    if not s.more:
        return s.help
    return s.help + (s.more if s.more[0] in ";:,." else " " + s.more)


def _default(s: Setting) -> str:
    if s.default_doc or s.kind in (Kind.SWITCH, Kind.ON_OFF) or s.default_words() == "none":
        return s.default_words()
    return f"`{s.default_words()}`"


def _value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _table(head: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = [head, tuple("---" for _ in head), *rows]
    cells = [[c.replace("|", r"\|") for c in line] for line in lines]  # | inside a cell
    return "".join("| " + " | ".join(line) + " |\n" for line in cells)


def main() -> int:
    """Write docs/cli.md to standard output."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
