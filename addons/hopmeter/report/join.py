"""`hopmeter join RECORDS...`: per-hop holds from records written by separate hopmeters.

Each host's hopmeter writes its own records; the flows of one request share a trace id. Joining
them gives the same per-segment holds as two listeners of one process, with the clock skew
between hosts bounded by causality (see hopmeter.core.hops).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import orjson

from hopmeter.core.hops import chain
from hopmeter.export.records import read_records


def join(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per trace seen at two or more hops: {trace_id, hops: [segment, ...]}."""
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if rec.get("trace_id") and rec.get("events") is not None:
            by_trace[rec["trace_id"]].append(rec)
    out = []
    for trace_id, recs in by_trace.items():
        if len(recs) < 2:
            continue
        segments = chain(recs)
        out.append({"trace_id": trace_id, "hops": [s.as_dict() for s in segments]})
    return out


def add_parser(sub: Any) -> None:
    """The `join` subcommand."""
    p = sub.add_parser("join", help="per-hop holds from records written on different hosts")
    p.add_argument("records", nargs="+", metavar="RECORDS", help='JSON lines files ("-" = stdin)')
    p.add_argument("--json", action="store_true", help="one JSON object per trace")
    p.set_defaults(func=run)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}ms"


def run(args: argparse.Namespace) -> int:
    """Print each trace's segments."""
    joined = join(read_records(args.records))
    for entry in joined:
        if args.json:
            sys.stdout.buffer.write(orjson.dumps(entry) + b"\n")
            continue
        for seg in entry["hops"]:
            kinds = ",".join(f["kind"] for f in seg["findings"]) or "-"
            print(
                f"{entry['trace_id']} {seg['segment']} first_token_hold="
                f"{_ms(seg['first_token_hold_s'])} p50={_ms(seg['hold_p50_s'])} "
                f"p99={_ms(seg['hold_p99_s'])} max={_ms(seg['hold_max_s'])} "
                f"inner_p99={_ms(seg.get('inner_hold_p99_s'))} "
                f"wire_p99={_ms(seg.get('wire_hold_p99_s'))} "
                f"whole_body={'yes' if seg['whole_body'] else 'no'} "
                f"skew={_ms(seg['skew_s'])} findings={kinds}"
            )
    if not joined:
        print("hopmeter join: no trace was seen at two hops", file=sys.stderr)
        return 1
    return 0
