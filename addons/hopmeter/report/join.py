"""`hopmeter join FILES...` and `hopmeter join --serve`: per-hop holds across hosts.

Each host's hopmeter writes its own records, or exports its spans over OTLP; the flows of one
request share a trace id, or, behind a gateway that drops it, the fingerprint of their reply
(records only: hopmeter.core.matching). Joining them gives the same per-segment holds as two
listeners of one process, with the clock skew between hosts bounded by causality (see
hopmeter.core.hops). Files may be records or OTLP traces, told apart by content
(hopmeter.join.files); `--serve` runs the join as an OTLP receiver (hopmeter.join.service,
docs/fleet.md).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from hopmeter.argtypes import parse_hostport, positive_int, positive_seconds
from hopmeter.core.hops import node
from hopmeter.core.matching import JOIN_SLACK_S, match_records, segments, trace_dropped
from hopmeter.core.order import HopOrder
from hopmeter.core.vocab import PairedBy, PairingMatch
from hopmeter.errors import UsageError
from hopmeter.join.files import OTEL_EXTRA, read_flows

JOIN_SCHEMA = "hopmeter.join/1"  # one line of `--json` (and of `--serve --records`)
WINDOW_S = 30.0  # --serve: above the SDK's 5 s batch delay and a Collector's 20 s of retries
MAX_TRACES = 200_000  # --serve's defaults: hopmeter.join.window says what they cost
MAX_EVENTS = 16_000_000
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def join(
    records: Iterable[dict[str, Any]],
    max_skew_s: float = JOIN_SLACK_S,
    order: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One entry per request seen at two or more hops: {trace_id, paired_by, flow_ids, hops}
    (a trace an instrumented client shared between calls is one entry per call).

    `trace_id` is the outermost flow's; `paired_by` is "content" when any segment's two sides
    carried different trace ids. Which hop is outer comes from the parent links, else from the
    order those links show between the same hops anywhere in the input, else from `order`
    (hops outermost first, `--order`); else the pair is reported unordered.
    """
    recs = [r for r in records if r.get("events") is not None]
    groups = [[recs[i] for i in refs] for refs in match_records(recs, max_skew_s).groups]
    hop_order = HopOrder(order)
    for group in groups:
        hop_order.learn_links([node(r) for r in group])
    out = []
    for group in groups:
        for members, found in segments(group, hop_order):
            segs = [s.as_dict() for s in found]
            for seg, dropped in zip(segs, map(trace_dropped, ([s] for s in found)), strict=True):
                if dropped:  # paired by content: a hop between them dropped the trace context
                    seg["findings"] = [*seg["findings"], *dropped]
            by_content = any(s["paired_by"] == PairedBy.CONTENT for s in segs)
            out.append(
                {
                    "schema": JOIN_SCHEMA,
                    "trace_id": group[members[0]].get("trace_id"),
                    "paired_by": PairedBy.CONTENT if by_content else PairedBy.TRACE,
                    "flow_ids": [group[i].get("flow_id") for i in members],
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
    p = sub.add_parser(
        "join", help="per-hop holds from records or OTLP spans written on different hosts"
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILES",
        help='flow records, OTLP JSON or OTLP protobuf files, told apart by content ("-" = stdin)',
    )
    p.add_argument("--json", action="store_true", help="one JSON object per trace")
    p.add_argument(
        "--max-skew",
        type=float,
        default=JOIN_SLACK_S,
        metavar="SECONDS",
        help="how far the hosts' clocks may disagree: flows without a shared trace id pair by "
        "their reply only when their times agree within it (default 1)",
    )
    p.add_argument(
        "--order",
        type=hop_list,
        default=(),
        metavar="HOP,HOP,...",
        help="the hops' order, outermost first (e.g. edge,origin): for flows of one request that "
        "no parent link joins and no linked trace puts in order; without it they are reported "
        "unordered",
    )
    serve = p.add_argument_group("as a service (--serve)")
    serve.add_argument(
        "--serve", action="store_true", help="receive spans over OTLP and join them live"
    )
    serve.add_argument(
        "--listen",
        default="127.0.0.1:4318",
        metavar="HOST:PORT",
        help="OTLP/HTTP address (default: 127.0.0.1:4318)",
    )
    serve.add_argument(
        "--grpc", default="", metavar="HOST:PORT", help="also take OTLP/gRPC here (e.g. :4317)"
    )
    serve.add_argument(
        "--metrics",
        default="127.0.0.1:9465",
        metavar="HOST:PORT|off",
        help="the join's own /metrics (default: 127.0.0.1:9465)",
    )
    serve.add_argument(
        "--records", default="", metavar="PATH", help='one joined line per segment ("-" = stdout)'
    )
    serve.add_argument(
        "--window",
        type=positive_seconds,
        default=WINDOW_S,
        metavar="SECONDS",
        help=f"how long a trace waits for its other hops (default {WINDOW_S:g})",
    )
    serve.add_argument(
        "--pid-file",
        default="",
        metavar="PATH",
        help="write the process id here, for `kill -HUP` after a log rotation: SIGHUP (or USR1) "
        "reopens the --records file (deploy/logrotate/hopmeter)",
    )
    serve.add_argument("--max-traces", type=positive_int, default=MAX_TRACES, metavar="N")
    serve.add_argument("--max-events", type=positive_int, default=MAX_EVENTS, metavar="N")
    p.set_defaults(func=run)


def hop_list(value: str) -> tuple[str, ...]:
    """`--order`'s hops, outermost first: names separated by commas, none twice."""
    hops = tuple(h.strip() for h in value.split(","))
    if len(hops) < 2 or not all(hops) or len(set(hops)) != len(hops):
        raise argparse.ArgumentTypeError(
            f"{value!r}: give two or more hop names, outermost first, e.g. edge,origin"
        )
    return hops


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}ms"


def run(args: argparse.Namespace) -> int:
    """Print each trace's segments, or serve (--serve)."""
    if args.serve:
        if args.files:
            raise UsageError("--serve receives spans over OTLP: give it no files")
        return _serve(args)
    if not args.files:
        raise UsageError("give the files to join (records or OTLP traces), or --serve")
    if not args.max_skew >= 0:
        raise UsageError("--max-skew must be 0 or more seconds, e.g. --max-skew 0.5")
    skipped: Counter[str] = Counter()
    records = list(read_flows(args.files, skipped))
    joined = join(records, args.max_skew, args.order)
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
                f"skew={_ms(seg['skew_s'])} findings={kinds} "
                f"request_delay={_ms(seg['request_delay_s'])} paired_by={seg['paired_by']} "
                f"order={seg['order']}"
            )
    unsure = ambiguous(records, args.max_skew)
    if unsure:
        print(
            f"hopmeter join: {unsure} flows carried a reply that several others at another hop "
            f"carried within --max-skew ({args.max_skew:g}s) of them; they were left unpaired "
            "(ambiguous). Replies that did not overlap pair with a --max-skew as small as the "
            "hosts' clocks allow",
            file=sys.stderr,
        )
    if not joined:
        why = ", ".join(f"{n} {outcome}" for outcome, n in sorted(skipped.items()))
        note = f" (spans left out: {why})" if why else ""
        print(
            f"hopmeter join: no trace was seen at two hops{note}; records whose trace ids "
            f"differ pair by reply only within --max-skew ({args.max_skew:g}s) of each other: "
            "hosts whose clocks differ by more need a larger one",
            file=sys.stderr,
        )
        return 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    from hopmeter.pidfile import ignore_hangup, pid_file  # noqa: PLC0415 - only for --serve

    try:
        from hopmeter.join import service  # noqa: PLC0415 - the otel extra, only for --serve
    except ImportError as exc:
        raise UsageError(
            f"join --serve needs the OpenTelemetry extra: {OTEL_EXTRA} ({exc})"
        ) from None
    http = parse_hostport(args.listen, "--listen")
    grpc = parse_hostport(args.grpc, "--grpc") if args.grpc else None
    off = args.metrics.strip().lower() in ("off", "none", "")
    metrics = None if off else parse_hostport(args.metrics, "--metrics")
    for flag, address in (("--listen", http), ("--grpc", grpc), ("--metrics", metrics)):
        if address is not None and address[0] not in LOOPBACK:
            print(
                f"hopmeter join: {flag} {address[0]}:{address[1]} listens beyond this host",
                file=sys.stderr,
            )
    cfg = service.ServeConfig(
        http=http,
        grpc=grpc,
        metrics=metrics,
        records=args.records,
        window_s=args.window,
        max_traces=args.max_traces,
        max_events=args.max_events,
        order=args.order,
    )
    ignore_hangup()  # until the service's loop handles it (reopening its records)
    with pid_file(args.pid_file):
        return service.run(cfg)
