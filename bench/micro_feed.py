"""Micro-benchmark of hopmeter's per-event path: FlowMeter.feed and its parts, called directly.

    python bench/micro_feed.py            # table on stdout
    python bench/micro_feed.py --json     # the same numbers as JSON
    python bench/micro_feed.py --cold 4   # and each case cold: 4 MiB copied between calls

Input: the bench upstream's OpenAI chat chunk (one SSE event of ~210 bytes per chunk, as mitmproxy
hands an HTTP/1 chunk to the stream callable), 400 events per flow, a fresh FlowMeter per flow.
Each figure is the best of several rounds of the mean µs per call (one process, one core). That is
the cost with the caches warm, as in lockstep loads; `--cold` adds the cost as a paced proxy pays
it, each call after other work has filled the caches (the median of three rounds).

Rows indented under FlowMeter.feed are its parts, timed alone. The rows "plain chat path off"
time the general path (every event built as a Frame and a Delta) that chat chunks took before the
plain path; "4 events per chunk" is what a busy proxy reads when several events coalesce. The
Anthropic rows feed Anthropic's token event (`event: content_block_delta` and its data line).
The two rows under the tap add mitmproxy's write of the chunk to a stand-in client transport
(through an asyncio StreamWriter, as mitmproxy writes), without and with the chunk followed out
to the client (hopmeter.proxy.delivery.lane): their difference is what the extra timestamps cost per
event on the stream's path; the looks at the queues that follow are timed in
bench/micro_delivery.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import socket
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addons"))

from hopmeter.core import measure
from hopmeter.core.apis import Delta
from hopmeter.core.apis.openai import OpenAIChatParser, plain_chat_payload
from hopmeter.core.decoding import Utf8Decoder, decode_payload
from hopmeter.core.detectors import _variance, diagnose
from hopmeter.core.frames import Frame
from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import finish
from hopmeter.core.sse import SseDecoder
from hopmeter.core.vocab import Api
from hopmeter.proxy.addon.tokenizers import load_counter

if TYPE_CHECKING:
    from hopmeter.proxy.addon.tap import ResponseTap

EVENTS_PER_FLOW = 400
FLOWS = 10  # 4,000 events per round: short rounds, so best-of filters out other work
ROUNDS = 25
CHUNK = (
    b'data: {"t":1764530000000000000,"l":12,"id":"chatcmpl-bench","object":"chat.completion.chunk",'
    b'"created":1700000000,"model":"bench","choices":[{"index":0,"delta":{"content":" tok"},'
    b'"finish_reason":null}]}\n\n'
)
PAYLOAD = CHUNK[6:-2]
ANTHROPIC_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"model":"claude-bench",'
    b'"usage":{"input_tokens":9,"output_tokens":1}}}\n\n'
)
ANTHROPIC_CHUNK = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":" tok"}}\n\n'
)
TEXT = PAYLOAD.decode()


def new_meter() -> FlowMeter:
    return FlowMeter(
        api=Api.OPENAI_CHAT, content_type="text/event-stream", content_encoding=None, headers={}
    )


def bench(setup: Callable[[], Callable[[int], object]]) -> float:
    """Best-of-ROUNDS mean µs per call of the callable `setup()` returns (one per flow)."""
    best = float("inf")
    for _ in range(ROUNDS):
        calls = [setup() for _ in range(FLOWS)]
        gc.collect()
        t0 = time.perf_counter_ns()
        for fn in calls:
            for i in range(EVENTS_PER_FLOW):
                fn(i)
        best = min(best, (time.perf_counter_ns() - t0) / (FLOWS * EVENTS_PER_FLOW) / 1000)
    return best


# A paced proxy sleeps between events while other processes run, and comes back to caches that
# hold their data, not its own: `--cold MIB` times each case that way too, COLD_FLOWS flows
# taking turns (as a proxy holds streams) with MIB MiB copied between two calls (untimed).
COLD_FLOWS = 50
COLD_EVENTS = 120
COLD_ROUNDS = 3


def bench_cold(setup: Callable[[], Callable[[int], object]], mib: int) -> float:
    """Median-of-COLD_ROUNDS mean µs per call of `setup()`'s callables, COLD_FLOWS of them taking
    turns, `mib` MiB copied before each call and not timed."""
    src, dst = bytearray(b"\x01" * (mib << 20)), bytearray(mib << 20)
    means = []
    for _ in range(COLD_ROUNDS):
        calls = [setup() for _ in range(COLD_FLOWS)]
        gc.collect()
        took = 0
        for i in range(COLD_EVENTS):
            for fn in calls:
                dst[:] = src
                t0 = time.perf_counter_ns()
                fn(i)
                took += time.perf_counter_ns() - t0
        means.append(took / (COLD_FLOWS * COLD_EVENTS) / 1000)
    return statistics.median(means)


def nothing() -> Callable[[int], object]:
    """The timing's own floor: a call that does nothing."""
    return lambda i: None


# -- the product's code --------------------------------------------------------------------------


def feed() -> Callable[[int], object]:
    m = new_meter()
    return lambda i: m.feed(CHUNK, i * 0.02)


def general_meter() -> FlowMeter:
    """A FlowMeter with the plain chat path off: every event built as a Frame and a Delta."""
    m = new_meter()
    m._pick_plain_path = lambda: None  # type: ignore[method-assign]
    m._plain = None
    return m


def feed_general() -> Callable[[int], object]:
    m = general_meter()
    return lambda i: m.feed(CHUNK, i * 0.02)


def feed_anthropic(general: bool = False) -> Callable[[int], object]:
    m = FlowMeter(
        api=Api.ANTHROPIC_MESSAGES, content_type="text/event-stream", content_encoding=None
    )
    if general:
        m._pick_plain_path = lambda: None  # type: ignore[method-assign]
        m._plain = None
    m.feed(ANTHROPIC_START, 0.0)
    return lambda i: m.feed(ANTHROPIC_CHUNK, i * 0.02)


def feed_coalesced(general: bool = False) -> Callable[[int], object]:
    """Four events per chunk, as reads coalesce on a busy proxy; the cost per event."""
    m = general_meter() if general else new_meter()
    four = CHUNK * 4
    return lambda i: None if i % 4 else m.feed(four, i * 0.02)


def new_tap() -> ResponseTap:
    """A ResponseTap with a meter, as responseheaders leaves it."""
    from hopmeter.proxy.addon.tap import FlowState, MeasureQueue, ResponseTap  # noqa: PLC0415 - heavy

    fields = FlowState.__dataclass_fields__
    kwargs: dict[str, Any] = {"mono0": time.monotonic(), "skew_s": 0.0, "listener": "proxy"}
    kwargs.update({"hop": "proxy", "trace": None})
    if "span_id" in fields:
        kwargs["span_id"] = "0" * 16
    t = ResponseTap(FlowState(**kwargs), MeasureQueue(), lambda where, exc: None)
    t.meter = new_meter()
    return t


def tap() -> Callable[[int], object]:
    """ResponseTap.__call__ as mitmproxy calls it, then the deferred measuring of its chunk
    (with no event loop running, MeasureQueue measures at once: both are timed)."""
    t = new_tap()
    return lambda i: t(CHUNK)


def tap_written(followed: bool) -> Callable[[int], object]:
    """The tap as above, then mitmproxy's write of the chunk to a stand-in client transport (the
    selector transport's checks, no send()); `followed` adds following the bytes out: the tap's
    FlowOut arms the connection's counter and the write goes through the counting wrapper."""
    from micro_delivery import FRAMED, StandInTransport, stand_in_writer  # noqa: PLC0415

    from hopmeter.proxy.delivery.conn import ConnTracker  # noqa: PLC0415 - heavy
    from hopmeter.proxy.delivery.lane import FlowOut  # noqa: PLC0415

    t = new_tap()
    writer = stand_in_writer(StandInTransport())
    if followed:
        tracker = ConnTracker(writer, socket.socket(), lambda *a: None, lambda *a: None)
        t.out = FlowOut("HTTP/1.1")
        t.out.conn = tracker
    write = writer.write

    def call(i: int) -> object:
        t(CHUNK)
        return write(FRAMED)

    return call


def plain_events() -> Callable[[int], object]:
    d = SseDecoder()
    d.feed(CHUNK, 0.0)
    return lambda i: d.plain_data_events(CHUNK)


def plain_payload() -> Callable[[int], object]:
    return lambda i: plain_chat_payload(PAYLOAD)


def sse() -> Callable[[int], object]:
    d = SseDecoder()
    return lambda i: d.feed(CHUNK, i * 0.02)


def utf8_stream() -> Callable[[int], object]:
    d = Utf8Decoder()
    return lambda i: d.count(CHUNK)


def payload() -> Callable[[int], object]:
    return lambda i: decode_payload(PAYLOAD)


def frame() -> Callable[[int], object]:
    return lambda i: Frame(
        t_s=0.02, kind="message", data=TEXT, wire_bytes=len(CHUNK), data_bytes=len(PAYLOAD)
    )


def parse() -> Callable[[int], object]:
    p = OpenAIChatParser()
    f = Frame(t_s=0.02, kind="message", data=TEXT, wire_bytes=len(CHUNK), data_bytes=len(PAYLOAD))
    return lambda i: p.parse(f)


def loads() -> Callable[[int], object]:
    return lambda i: orjson.loads(TEXT)


def delta() -> Callable[[int], object]:
    return lambda i: Delta(
        content=" tok",
        reasoning="",
        tool_args="",
        stream_tokens=None,
        token_ids=None,
        output_tokens_total=None,
        input_tokens_total=None,
        reasoning_tokens_total=None,
        model="bench",
        terminal=False,
        error=None,
    )


def on_delta() -> Callable[[int], object]:
    m = new_meter()
    f = Frame(t_s=0.02, kind="message", data=TEXT, wire_bytes=len(CHUNK), data_bytes=len(PAYLOAD))
    d = Delta(content=" tok", model="bench")
    return lambda i: m._on_delta(f.t_s, f.incomplete_utf8, d)


# -- what the steps cost before -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _FrozenFrame:
    """Frame as it was before commit 1094770 (a frozen dataclass), for the record."""

    t_s: float
    kind: str
    data: str
    wire_bytes: int
    data_bytes: int
    last_event_id: str = ""
    retry_ms: int | None = None
    incomplete_utf8: bool = False
    replacement_chars: int = 0


def frozen_frame() -> Callable[[int], object]:
    return lambda i: _FrozenFrame(
        t_s=0.02, kind="message", data=TEXT, wire_bytes=len(CHUNK), data_bytes=len(PAYLOAD)
    )


# -- per flow: the record, off the chunk path but on the same event loop ----------------------


def finish_cost(events: int) -> float:
    """µs for a FlowMeter fed `events` events to its record (record.finish: tokenizer, figures,
    detectors, the record written)."""
    counters = load_counter(None)
    counters.preload()
    best = float("inf")
    for _ in range(ROUNDS):
        m = new_meter()
        for i in range(events):
            m.feed(CHUNK, 0.1 + i * 0.02)
        m.feed(b"data: [DONE]\n\n", 0.1 + events * 0.02)
        m.close(0.2 + events * 0.02)
        seen = Seen(
            flow_id="f",
            trace_id="t",
            hop="proxy",
            listener="proxy",
            request=RequestInfo(
                method="POST",
                scheme="http",
                host="h",
                path="/v1/chat/completions",
                t_start=1.7e9,
                t_end=1.7e9,
                bytes=80,
            ),
            response=ResponseInfo(
                status=200,
                http_version="HTTP/1.1",
                headers={"content-type": "text/event-stream", "cache-control": "no-cache"},
                t_headers_s=0.05,
            ),
            meter=m,
            ended="complete",
            bytes_out=m.bytes_wire,
            stall_threshold_s=0.5,
        )
        t0 = time.perf_counter_ns()
        finish(seen, counters)
        best = min(best, (time.perf_counter_ns() - t0) / 1000)
    return best


def finish_parts(events: int) -> dict[str, float]:
    """µs for each part of measuring (hopmeter.core.measure) on one `events`-event flow."""
    counters = load_counter(None)
    counter = counters.for_model(None)
    m = new_meter()
    for i in range(events):
        m.feed(CHUNK, 0.1 + i * 0.02)
    m.feed(b"data: [DONE]\n\n", 0.1 + events * 0.02)
    m.close(0.2 + events * 0.02)
    response = ResponseInfo(
        status=200,
        http_version="HTTP/1.1",
        headers={"content-type": "text/event-stream", "cache-control": "no-cache"},
        t_headers_s=0.05,
    )
    account = measure._account(m, counter)
    figures = measure._figures(m, account, 0.5)
    view = measure.stream_view(
        meter=m,
        f=figures,
        account=account,
        response=response,
        ended="complete",
        stall_threshold_s=0.5,
        stream_requested=True,
    )
    logs = [math.log(0.02 + (i % 7) * 1e-4) for i in range(events)]

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t0) / 1000)
        return round(min(times), 1)

    return {
        "account_tokens (tokenizer per event)": best(lambda: measure._account(m, counter)),
        "compute_figures": best(lambda: measure._figures(m, account, 0.5)),
        "diagnose (detectors)": best(lambda: diagnose(view)),
        "  variance of the log gaps (statistics.pvariance, before)": best(
            lambda: statistics.pvariance(logs)
        ),
        "  variance of the log gaps (detectors._variance, math.fsum)": best(
            lambda: _variance(logs)
        ),
    }


# -- memory per event ----------------------------------------------------------------------------


def bytes_per_event(keep_text: bool = True) -> float:
    """Bytes a FlowMeter keeps per event after a 400-event stream (tracemalloc)."""
    tracemalloc.start()
    m = FlowMeter(
        api=Api.OPENAI_CHAT,
        content_type="text/event-stream",
        content_encoding=None,
        headers={},
        keep_text=keep_text,
    )
    m.feed(CHUNK, 0.0)
    base = tracemalloc.get_traced_memory()[0]
    for i in range(EVENTS_PER_FLOW):
        m.feed(CHUNK, i * 0.02)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / EVENTS_PER_FLOW


CASES: list[tuple[str, Callable[[], Callable[[int], object]]]] = [
    ("ResponseTap.__call__ (tap + FlowMeter.feed)", tap),
    ("  ... then mitmproxy's write (stand-in transport)", lambda: tap_written(False)),
    ("  ... bytes out followed (chunk armed, counting write)", lambda: tap_written(True)),
    ("FlowMeter.feed", feed),
    ("  SseDecoder.plain_data_events (plain chat path)", plain_events),
    ("  plain_chat_payload (plain chat path)", plain_payload),
    ("FlowMeter.feed, plain chat path off (every event a Frame and a Delta)", feed_general),
    ("FlowMeter.feed, 4 events per chunk (per event)", feed_coalesced),
    ("FlowMeter.feed, 4 events per chunk, plain chat path off", lambda: feed_coalesced(True)),
    ("FlowMeter.feed, Anthropic content_block_delta", feed_anthropic),
    ("FlowMeter.feed, Anthropic, plain path off", lambda: feed_anthropic(True)),
    ("  SseDecoder.feed", sse),
    ("    decode_payload", payload),
    ("    Frame()", frame),
    ("    (Frame as a frozen dataclass, as before 1094770)", frozen_frame),
    ("  Utf8Decoder.count (whole stream)", utf8_stream),
    ("  OpenAIChatParser.parse", parse),
    ("    orjson.loads", loads),
    ("    Delta() (11 fields)", delta),
    ("  FlowMeter._on_delta", on_delta),
    ("(a call that does nothing: the timing's floor)", nothing),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="MIB",
        help=f"also time each case cold: {COLD_FLOWS} flows in turn, MIB MiB copied between calls",
    )
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    for name, setup in CASES:
        rows.append({"what": name, "us_per_call": round(bench(setup), 2)})
        if args.cold:
            rows[-1]["cold_us_per_call"] = round(bench_cold(setup, args.cold), 2)
    flows = {f"finish_flow_us_{n}_events": round(finish_cost(n), 1) for n in (5, EVENTS_PER_FLOW)}
    parts = finish_parts(EVENTS_PER_FLOW)
    memory = {
        "bytes_per_event_kept": round(bytes_per_event(True), 1),
        "bytes_per_event_no_text": round(bytes_per_event(False), 1),
    }
    if args.json:
        doc = {"events_per_flow": EVENTS_PER_FLOW, "rows": rows, **flows, "finish_parts_us": parts}
        if args.cold:
            doc["cold"] = {"mib_between_calls": args.cold, "flows_in_turn": COLD_FLOWS}
        doc.update(memory)
        print(json.dumps(doc, indent=1))
        return
    if args.cold:
        print(f"warm, then cold ({COLD_FLOWS} flows in turn, {args.cold} MiB copied between calls)")
    for r in rows:
        cold = f"{r['cold_us_per_call']:8.2f} µs" if args.cold else ""
        print(f"{r['us_per_call']:8.2f} µs{cold}  {r['what']}")
    for key, us in flows.items():
        n = int(key.split("_")[3])
        print(f"{us:8.1f} µs  record.finish of a {n}-event flow ({us / n:.2f} µs per event)")
    for what, us in parts.items():
        print(f"{us:8.1f} µs  {what}, {EVENTS_PER_FLOW} events")
    print(f"memory: {memory['bytes_per_event_kept']} B/event kept per flow "
          f"({memory['bytes_per_event_no_text']} B without reply text)")  # fmt: skip


if __name__ == "__main__":
    main()
