"""`hopmeter join RECORDS...`: per-hop holds from records written by separate hopmeters.

Each host's hopmeter writes its own records; the flows of one request share a trace id, or, behind
a gateway that drops it, the fingerprint of their reply (hopmeter.core.matching). Joining them
gives the same per-segment holds as two listeners of one process, with the clock skew between
hosts bounded by causality (see hopmeter.core.hops).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

import orjson

from hopmeter.core.matching import JOIN_SLACK_S, match_records, segments
from hopmeter.core.vocab import PairedBy, PairingMatch
from hopmeter.errors import UsageError
from hopmeter.export.records import read_records


def join(
    records: Iterable[dict[str, Any]], max_skew_s: float = JOIN_SLACK_S
) -> list[dict[str, Any]]:
    """One entry per request seen at two or more hops: {trace_id, paired_by, flow_ids, hops}.

    `trace_id` is the outermost flow's; `paired_by` is "content" when any segment's two sides
    carried different trace ids.
    """
    recs = [r for r in records if r.get("events") is not None]
    out = []
    for refs in match_records(recs, max_skew_s).groups:
        group = [recs[i] for i in refs]
        segs = [s.as_dict() for s in segments(group)]
        by_content = any(s["paired_by"] == PairedBy.CONTENT for s in segs)
        out.append(
            {
                "trace_id": group[0].get("trace_id"),
                "paired_by": PairedBy.CONTENT if by_content else PairedBy.TRACE,
                "flow_ids": [r.get("flow_id") for r in group],
                "hops": segs,
            }
        )
    return out


def ambiguous(records: Iterable[dict[str, Any]], max_skew_s: float = JOIN_SLACK_S) -> int:
    """Flows that several others could have been one request with: left unpaired."""
    recs = [r for r in records if r.get("events") is not None]
    outcomes = match_records(recs, max_skew_s).outcomes.values()
    return sum(o.match == PairingMatch.AMBIGUOUS for o in outcomes)


def add_parser(sub: Any) -> None:
    """The `join` subcommand."""
    p = sub.add_parser("join", help="per-hop holds from records written on different hosts")
    p.add_argument("records", nargs="+", metavar="RECORDS", help='JSON lines files ("-" = stdin)')
    p.add_argument("--json", action="store_true", help="one JSON object per trace")
    p.add_argument(
        "--max-skew",
        type=float,
        default=JOIN_SLACK_S,
        metavar="SECONDS",
        help="how far the hosts' clocks may disagree: flows without a shared trace id pair by "
        "their reply only when their times agree within it (default 1)",
    )
    p.set_defaults(func=run)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}ms"


def run(args: argparse.Namespace) -> int:
    """Print each trace's segments."""
    if not args.max_skew >= 0:
        raise UsageError("--max-skew must be 0 or more seconds, e.g. --max-skew 0.5")
    records = list(read_records(args.records))
    joined = join(records, args.max_skew)
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
                f"whole_body={'yes' if seg['whole_body'] else 'no'} "
                f"skew={_ms(seg['skew_s'])} findings={kinds} "
                f"request_delay={_ms(seg['request_delay_s'])} paired_by={seg['paired_by']}"
            )
    unsure = ambiguous(records, args.max_skew)
    if unsure:
        print(
            f"hopmeter join: {unsure} flows carried a reply that several others at another hop "
            "carried at the same time; they were left unpaired (ambiguous)",
            file=sys.stderr,
        )
    if not joined:
        print("hopmeter join: no trace was seen at two hops", file=sys.stderr)
        return 1
    return 0
