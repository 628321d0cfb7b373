"""`hopmeter`: the command line (docs/cli.md). Errors here are one line and an exit code.

Each command family owns its flags and its run in its own package (`add_parser(sub)` and
`run(args)`); this module only assembles them and turns expected failures into one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hopmeter import __version__, env
from hopmeter.errors import HopmeterError
from hopmeter.probe import command as probe
from hopmeter.proxy import command as proxy
from hopmeter.report import command as report
from hopmeter.report import join
from hopmeter.upstream import command as upstream
from hopmeter.upstream import demo

# In the order `--help` lists them.
COMMANDS = (proxy, upstream, join, report, probe, demo)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it and the fix, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"hopmeter: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    p = _Parser(prog="hopmeter", description="A transparent measuring proxy for LLM token streams.")
    p.add_argument("--version", action="version", version=f"hopmeter {__version__}")
    p.add_argument(
        "--addon-path", action="store_true", help="print the script path for `mitmdump -s` and exit"
    )
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def addon_path() -> Path:
    """The script plain mitmproxy loads hopmeter from (`mitmdump -s`)."""
    return Path(__file__).parent / "proxy" / "mitmdump" / "script.py"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hopmeter` command."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = env.parse_args(parser, argv, os.environ)  # flags, then HOPMETER_* for those left out
    if args.addon_path:
        print(addon_path())
        return 0
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    args.argv = argv  # `run --workers N` starts N copies of this command line
    try:
        status: int = args.func(args)
    except HopmeterError as exc:
        print(f"hopmeter: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`hopmeter report ... | head`): not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return status


if __name__ == "__main__":
    sys.exit(main())
