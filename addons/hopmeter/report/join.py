"""`hopmeter join FILES...` and `hopmeter join --serve`: per-hop holds across hosts.

Each host's hopmeter writes its own records, or exports its spans over OTLP; the flows of one
request share a trace id. Joining them gives the same per-segment holds as two listeners of one
process, with the clock skew between hosts bounded by causality (see hopmeter.core.hops). Files
may be records or OTLP traces, told apart by content (hopmeter.join.files); `--serve` runs the
join as an OTLP receiver (hopmeter.join.service, docs/fleet.md).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import orjson

from hopmeter.core.hops import chain
from hopmeter.errors import UsageError
from hopmeter.join.files import OTEL_EXTRA, read_flows

JOIN_SCHEMA = "hopmeter.join/1"  # one line of `--json` (and of `--serve --records`)
WINDOW_S = 30.0  # --serve: above the SDK's 5 s batch delay and a Collector's 20 s of retries
MAX_TRACES = 200_000  # --serve's defaults: hopmeter.join.window says what they cost
MAX_EVENTS = 16_000_000
LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
        out.append(
            {"schema": JOIN_SCHEMA, "trace_id": trace_id, "hops": [s.as_dict() for s in segments]}
        )
    return out


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
    serve = p.add_argument_group("as a service (--serve)")
    serve.add_argument(
        "--serve", action="store_true", help="receive spans over OTLP and join them live"
    )
    serve.add_argument(
        "--listen", default="127.0.0.1:4318", metavar="HOST:PORT", help="OTLP/HTTP address"
    )
    serve.add_argument(
        "--grpc", default="", metavar="HOST:PORT", help="also take OTLP/gRPC here (e.g. :4317)"
    )
    serve.add_argument("--metrics", default="127.0.0.1:9465", metavar="HOST:PORT|off")
    serve.add_argument(
        "--records", default="", metavar="PATH", help='one joined line per segment ("-" = stdout)'
    )
    serve.add_argument(
        "--window",
        type=_positive_float,
        default=WINDOW_S,
        metavar="SECONDS",
        help=f"how long a trace waits for its other hops (default {WINDOW_S:g})",
    )
    serve.add_argument("--max-traces", type=_positive_int, default=MAX_TRACES, metavar="N")
    serve.add_argument("--max-events", type=_positive_int, default=MAX_EVENTS, metavar="N")
    p.set_defaults(func=run)


def _positive_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not f > 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be above 0")
    return f


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be 1 or more")
    return n


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
    skipped: Counter[str] = Counter()
    joined = join(read_flows(args.files, skipped))
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
        why = ", ".join(f"{n} {outcome}" for outcome, n in sorted(skipped.items()))
        note = f" (spans left out: {why})" if why else ""
        print(f"hopmeter join: no trace was seen at two hops{note}", file=sys.stderr)
        return 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    from hopmeter.proxy.config import parse_hostport  # noqa: PLC0415 - pure, no mitmproxy

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
    )
    return service.run(cfg)
