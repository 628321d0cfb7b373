"""The flow record (docs/design.md §4, schema "hopmeter.flow/1") and its one-line human summary.

A record is written from a typed `Measurement` (hopmeter.core.measure), never computed here:
`finish` measures what was seen of a flow and writes it, `to_record` only writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul, truediv
from typing import Any

from hopmeter.core.delivery import Delivery
from hopmeter.core.figures import Figures
from hopmeter.core.measure import CounterSource, Measurement, ResponseInfo, Seen, measure
from hopmeter.core.meter import FlowMeter
from hopmeter.core.tokens import TokenAccount

SCHEMA = "hopmeter.flow/1"

# Response headers the detectors read; nothing else of the response's headers is kept, and no
# request header at all (they carry keys and cookies).
KEPT_RESPONSE_HEADERS = (
    "cache-control",
    "x-accel-buffering",
    "content-length",
    "etag",
    "transfer-encoding",
    "content-encoding",
    "content-type",
    "x-tokenizer",
    "vary",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowResult:
    """A finished flow on its way through the end's waits: the record to write (pairing and a
    beacon may still add sections to it) and the typed measurement it was written from.

    `figures`, `tokens`, `delivery` and `opening` are the measurement's, kept apart so that a
    result can be made of a record alone (one read back, a test's); `segments` are added by
    pairing and beacons, one hops.Segment per segment, on the outermost flow of a trace.
    """

    record: dict[str, Any]
    figures: Figures | None
    tokens: TokenAccount | None
    segments: tuple[Any, ...] = ()
    delivery: Delivery | None = None  # the bytes' way to the client, when the proxy followed it
    # the reply's first visible characters, in memory only (never written): live pairing tells
    # a flow still in flight that cannot be this reply from one that may be (proxy.pairing)
    opening: str = ""
    measurement: Measurement | None = None  # None: a record read back, or a test's
    # the request's start on the process's monotonic clock, in memory only: the live pairing of
    # one process's listeners times their flows by it, whatever the wall clock did meanwhile
    mono_start_s: float | None = None


def finish(seen: Seen, counters: CounterSource) -> FlowResult:
    """Measure what was seen of a finished flow (its tokens counted) and write its record."""
    m = measure(seen, counters)
    return FlowResult(
        record=to_record(m),
        figures=m.figures,
        tokens=m.tokens,
        delivery=m.delivery,
        opening=m.opening,
        measurement=m,
        mono_start_s=seen.mono_start_s,
    )


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def to_record(m: Measurement) -> dict[str, Any]:
    """The record of a measured flow (schema "hopmeter.flow/1"), its keys in their order.

    Every record says how the flow `ended`, at the top level, also when no response came (the
    upstream failed, or the client left first); `response.ended` repeats it when there is a
    response. `upstream_error` names why the upstream failed the flow.
    """
    seen = m.seen
    rec = _head(seen)
    if seen.response is not None:
        rec["response"] = resp = _response(seen, seen.response)
        meter = seen.meter
        if meter is not None:
            _measured(rec, resp, m, meter)
        if m.delivery is not None:
            rec["delivery"] = m.delivery.as_dict()
    rec["ended"] = seen.ended
    if seen.failure is not None:
        rec["upstream_error"] = seen.failure.as_dict()
    rec["api"] = m.api
    rec["model"] = m.model
    rec["model_clipped_chars"] = m.model_clipped_chars  # past MAX_MODEL_CHARS (a hostile name)
    rec["findings"] = [f.as_dict() for f in m.findings]
    if seen.measuring_error:
        rec["measuring_error"] = seen.measuring_error
    if seen.chaos is not None:
        rec["chaos"] = list(seen.chaos)
    if seen.relay_error is not None:
        rec["relay_error"] = seen.relay_error
    if seen.passage is not None:
        rec["mitmproxy"] = dict(seen.passage.section)
    return rec


def _head(seen: Seen) -> dict[str, Any]:
    """Who the flow is, and its request."""
    request = seen.request
    return {
        "schema": SCHEMA,
        "trace_id": seen.trace_id,
        "span_id": seen.span_id,
        "parent_span_id": seen.parent_span_id,
        # valid, absent, malformed: a malformed one's trace was replaced by one of hopmeter's
        "traceparent_received": seen.trace_received,
        "flow_id": seen.flow_id,
        "hop": seen.hop,
        "listener": seen.listener,
        "request": {
            "method": request.method,
            "scheme": request.scheme,
            "host": request.host,
            "path": request.path,
            "t_start": request.t_start,
            "t_end": request.t_end,
            "bytes": request.bytes,
        },
    }


def _response(seen: Seen, response: ResponseInfo) -> dict[str, Any]:
    """The `response` section as the headers said it; the meter fills in its bytes and times."""
    return {
        "status": response.status,
        "http_version": response.http_version,
        "content_type": response.content_type,
        "content_encoding": response.content_encoding,
        "t_headers": _abs(seen.request.t_start, response.t_headers_s),
        "t_first_byte": None,
        "t_last_byte": None,
        "bytes_wire": 0,
        "bytes_decoded": 0,
        "bytes_out": seen.bytes_out,
        "ended": seen.ended,
        "headers": {k: v for k, v in response.headers.items() if k in KEPT_RESPONSE_HEADERS},
    }


def _measured(rec: dict[str, Any], resp: dict[str, Any], m: Measurement, meter: FlowMeter) -> None:
    """What the meter measured of the response: bytes, times, chunks, events, figures, stream."""
    t0 = m.seen.request.t_start
    account, figures = m.tokens, m.figures
    assert account is not None and figures is not None  # measured with the meter
    resp["t_first_byte"] = _abs(t0, meter.first_byte_s)
    resp["t_last_byte"] = _abs(t0, meter.last_byte_s)
    resp["bytes_wire"] = meter.bytes_wire
    resp["bytes_decoded"] = meter.bytes_decoded
    # to the microsecond: round(t * 1e6) / 1e6 is round(t, 6) at half the cost (no decimal
    # conversion); mapped over the whole column (no bytecode per time), and each time once: while
    # every chunk completed one event the chunk times are the first events' (`chunk_t_shared`)
    event_t = _micro(meter.events.t_s)
    chunk_bytes = meter.chunk_bytes
    chunk_t = event_t[: len(chunk_bytes)] if meter.chunk_t_shared else _micro(meter.chunk_t)
    rec["chunks"] = list(map(list, zip(chunk_t, chunk_bytes, strict=True)))
    rec["chunks_dropped"] = meter.chunks_seen - len(chunk_bytes)
    rec["events"] = list(
        map(list, zip(event_t, account.per_event, meter.events.content_offset, strict=False))
    )
    rec["events_dropped"] = meter.events_seen - len(meter.events.t_s)
    if m.delivery is not None and m.delivery.measured:
        rec["chunks_out"] = m.delivery.chunks_out
    rec["figures"] = _figures_dict(meter, figures, account)
    rec["stream"] = _stream_facts(meter, m.errors)
    if m.fingerprint is not None:  # a digest of the opening, never the text (core.fingerprint)
        rec["fingerprint"] = m.fingerprint.as_dict()
    if m.seen.log_content:
        rec["content"] = meter.text()


def _micro(times: Iterable[float]) -> list[float]:
    """Each time rounded to the microsecond, as round(t * 1e6) / 1e6 (the same floats): the
    times are floats (array columns), and `float.__round__` is what round() calls for one,
    without round()'s method lookup (a quarter of the cost, mapped)."""
    return list(map(truediv, map(float.__round__, map(mul, times, repeat(1e6))), repeat(1e6)))


def _abs(t0: float, offset: float | None) -> float | None:
    return None if offset is None else round(t0 + offset, 6)


def _figures_dict(meter: FlowMeter, f: Figures, account: TokenAccount) -> dict[str, Any]:
    payload = meter.facts.payload_bytes
    return {
        "ttfb_s": _r(f.ttfb_s),
        "ttfe_s": _r(f.ttfe_s),
        "ttft_s": _r(f.ttft_s),
        "ttft_content_s": _r(f.ttft_content_s),
        "duration_s": _r(f.duration_s),
        "tokens": f.tokens,
        "tokens_source": account.source,
        "tokens_counted": account.counted,
        "tokens_counted_source": account.counted_source,
        "usage_tokens": account.usage,
        "tokens_mismatch": account.mismatch,
        "usage_input_tokens": meter.facts.usage_input_tokens,
        "usage_reasoning_tokens": meter.facts.usage_reasoning_tokens,
        "tokens_hidden_reasoning": account.hidden_reasoning,
        "itl_p50_s": _r(f.itl_p50_s),
        "itl_p99_s": _r(f.itl_p99_s),
        "max_gap_s": _r(f.max_gap_s),
        "stalls": f.stalls,
        "tokens_per_s": _r(f.tokens_per_s, 3),
        "tokens_per_s_min_window": _r(f.tokens_per_s_min_window, 3),
        "events": meter.events_seen,
        "payload_bytes": payload,
        "framing_overhead": round(meter.bytes_wire / payload, 3) if payload else None,
        # the same tokens as packed 32-bit ids (seed "Stream tokens, not text")
        "packed_ids_bytes": 4 * f.tokens,
    }


def _stream_facts(meter: FlowMeter, errors: Sequence[str]) -> dict[str, Any]:
    facts = meter.facts
    framer = meter.framer
    out: dict[str, Any] = {
        "terminal_seen": facts.terminal_seen,
        "errors": list(errors),  # each error's kind; its message only with --log-content
        "errors_seen": facts.errors_seen,
        "replacement_chars": meter.utf8.replacement_chars,
        "literal_replacement_chars": meter.utf8.literal_replacement_chars,
        "chunks_split_utf8": meter.utf8.split_sequences,
        "events_incomplete_utf8": facts.events_incomplete_utf8,
        "decode_error": facts.decode_error,
        "malformed_events": meter.malformed_events,
        # bytes of the chunks not read in full once the flow's read budget was spent (meter)
        "unread_bytes": meter.unread_bytes,
    }
    if framer is not None:
        out["line_endings"] = dict(getattr(framer, "line_endings", {}))
        out["unterminated_bytes"] = getattr(framer, "unterminated_bytes", 0)
        out["overflows"] = getattr(framer, "overflows", 0)
    return out


MAX_LINE_MODEL_CHARS = 100  # a model name the client or upstream chose, on the console line


def _printable(text: str, limit: int = 1000) -> str:
    """`text` as one line on a terminal: control characters (a newline that would start a
    forged line, an escape sequence) written as escapes, and clipped."""
    text = text[:limit]
    return text if text.isprintable() else repr(text)[1:-1]


def summary_line(rec: Mapping[str, Any]) -> str:
    """One human line per flow: hop, api, model, status, the key figures and findings."""
    resp = rec.get("response") or {}
    fig = rec.get("figures") or {}

    def ms(key: str) -> str:
        v = fig.get(key)
        return "-" if v is None else f"{v * 1000:.0f}ms"

    parts = [
        f"[{rec['hop']}]",
        f"{rec['request']['method']} {_printable(rec['request']['path'])}",
        str(resp.get("status", "-")),
        rec.get("api", "other"),
        _printable(rec.get("model") or "-", MAX_LINE_MODEL_CHARS),
        f"ttfb={ms('ttfb_s')} ttft={ms('ttft_s')}",
        f"itl p50={ms('itl_p50_s')} p99={ms('itl_p99_s')} max_gap={ms('max_gap_s')}",
        f"tokens={fig.get('tokens', 0)}({fig.get('tokens_source', '-')})",
        f"dur={ms('duration_s')}",
        f"ended={resp.get('ended', rec.get('ended', '-'))}",
    ]
    findings = rec.get("findings") or []
    if findings:
        parts.append("findings=" + ",".join(f["kind"] for f in findings))
    browser = rec.get("browser") or {}
    screen = rec.get("screen") or {}
    if screen.get("ttft_s") is not None:
        parts.append(f"painted={screen['ttft_s'] * 1000:.0f}ms")
    if browser.get("findings"):
        parts.append("client=" + ",".join(f["kind"] for f in browser["findings"]))
    elif browser.get("joined") is False:
        parts.append("browser=no-beacon")
    return " ".join(parts)
