"""`hopmeter`: the command line (every command: docs/design.md §3; `hopmeter run`'s flags, their
variables and options: docs/cli.md). Errors here are one line and an exit code.

Each command family owns its flags and its run in its own package (`add_parser(sub)` and
`run(args)`); this module only assembles them and turns expected failures into one line.
`hopmeter run` imports only its own family: the others' modules (report, probe, the demo
upstream) are ~1 MiB of a long-running proxy's memory that it never uses.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hopmeter import __version__, env
from hopmeter.core.secrets import scrub
from hopmeter.errors import HopmeterError

# The modules of the commands, in the order `--help` lists them; "run" is the first's.
COMMANDS = (
    "hopmeter.proxy.run.command",
    "hopmeter.upstream.command",
    "hopmeter.report.join",
    "hopmeter.report.command",
    "hopmeter.probe.command",
    "hopmeter.demo.command",
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it and the fix, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"hopmeter: {message} (see `{self.prog} --help`)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; for `command` "run", with only that command."""
    p = _Parser(prog="hopmeter", description="A transparent measuring proxy for LLM token streams.")
    p.add_argument("--version", action="version", version=f"hopmeter {__version__}")
    p.add_argument(
        "--addon-path", action="store_true", help="print the script path for `mitmdump -s` and exit"
    )
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    for module in COMMANDS[:1] if command == "run" else COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return p


def addon_path() -> Path:
    """The script plain mitmproxy loads hopmeter from (`mitmdump -s`)."""
    return Path(__file__).parent / "proxy" / "mitmdump" / "script.py"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hopmeter` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
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
        # the one line may quote a URL or a value the user gave: never its password or key
        print(f"hopmeter: {scrub(env.as_given(str(exc), args))}", file=sys.stderr)
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
