"""`hopmeter report RECORDS... [--html OUT]`: what flow records say, for people.

Text to stdout (a fleet summary, then one line per flow); with --html, one self-contained HTML
file that draws each trace as lanes, one per hop, from the measured event times. Reads JSON
files only: no mitmproxy here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hopmeter.errors import HopmeterError
from hopmeter.export.records import read_records
from hopmeter.report.fleet import summarise
from hopmeter.report.html import render as render_html
from hopmeter.report.text import render as render_text
from hopmeter.report.traces import stall_threshold, traces_of

# Traces drawn in one HTML file; past this the worst are drawn and the rest counted. A trace's
# lanes are ~100 KB of SVG at most (events are capped per record), so the file stays openable.
DEFAULT_MAX_TRACES = 200
# what reading a record that is not as hopmeter writes it (cut, edited, made by hand) raises
UNREADABLE = (KeyError, TypeError, AttributeError, ValueError, IndexError)


def add_parser(sub: Any) -> None:
    """The `report` subcommand, added to an argparse subparsers object."""
    p = sub.add_parser("report", help="summarise flow records; --html draws each hop as a lane")
    p.add_argument("records", nargs="+", metavar="RECORDS", help='JSON lines files ("-" = stdin)')
    p.add_argument("--html", default="", metavar="OUT", help="write a self-contained HTML report")
    p.add_argument(
        "--stall-threshold",
        type=float,
        default=None,
        metavar="SECONDS",
        help="gaps at or above this are coloured as stalls (default: what the records used)",
    )
    p.add_argument(
        "--max-traces",
        type=int,
        default=DEFAULT_MAX_TRACES,
        metavar="N",
        help=f"draw at most N traces in the HTML, worst first (default {DEFAULT_MAX_TRACES})",
    )
    p.add_argument("--quiet", action="store_true", help="no text on stdout (with --html)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read the records, print the text report, write the HTML one; 1 when there are none."""
    out = Path(args.html).expanduser() if args.html else None
    if out is not None and not out.parent.is_dir():
        raise HopmeterError(f"--html {args.html}: folder {out.parent} does not exist")
    if args.max_traces < 0:
        raise HopmeterError("--max-traces must be 0 or more")
    if args.stall_threshold is not None and args.stall_threshold <= 0:
        raise HopmeterError("--stall-threshold must be above 0 seconds")
    records = list(read_records(args.records))
    if not records:
        print(
            "hopmeter report: no hopmeter.flow/1 records in " + ", ".join(args.records),
            file=sys.stderr,
        )
        return 1
    try:
        threshold = args.stall_threshold or stall_threshold(records)
        traces = traces_of(records, threshold)
        fleet = summarise(records, traces)
        text = render_text(fleet, traces)
        page = (
            ""
            if out is None
            else render_html(fleet, traces, threshold_s=threshold, max_traces=args.max_traces)
        )
    except UNREADABLE as exc:
        raise HopmeterError(_unreadable(records, args.records, exc)) from None
    if not args.quiet:
        sys.stdout.write(text)
    if out is not None:
        try:
            out.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise HopmeterError(
                f"--html {args.html}: cannot write it ({exc.strerror}); pick a file path in a "
                f"folder you can write to"
            ) from None
        if not args.quiet:
            print(f"hopmeter report: wrote {out}")
    return 0


def _unreadable(records: list[dict[str, Any]], paths: list[str], exc: Exception) -> str:
    """Which record the report could not read, found by reading each alone, and why."""
    where = f"of {', '.join(paths)}"
    for n, rec in enumerate(records, 1):
        try:
            alone = traces_of([rec], stall_threshold([rec]))
            render_text(summarise([rec], alone), alone)
        except UNREADABLE as own:
            where = f"{n} {where} (flow_id {rec.get('flow_id')!r})"
            exc = own
            break
    return (
        f"hopmeter.flow/1 record {where} is not as hopmeter writes it "
        f"({type(exc).__name__}: {exc}): was it cut or edited? (if not, it is a bug in hopmeter "
        f"report: please report it with the record)"
    )
