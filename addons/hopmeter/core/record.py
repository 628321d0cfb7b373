"""The flow record (docs/design.md §4, schema "hopmeter.flow/1") and its one-line human summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hopmeter.core.delivery import Delivery, DeliverySeen, summarize
from hopmeter.core.detectors import StreamView, diagnose
from hopmeter.core.figures import Figures, compute_figures
from hopmeter.core.fingerprint import FINGERPRINT_CHARS, fingerprint
from hopmeter.core.meter import FlowMeter
from hopmeter.core.tokens import Counter, TokenAccount, account_tokens
from hopmeter.core.upstream import UpstreamFailure, upstream_finding
from hopmeter.core.vocab import TERMINATED_APIS

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
class RequestInfo:
    """What the record says of the request: no query string, no headers, no body."""

    method: str
    scheme: str
    host: str
    path: str
    t_start: float  # wall clock, epoch seconds
    t_end: float | None
    bytes: int
    model: str | None = None
    stream_requested: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseInfo:
    """The response's status line and the headers detectors need."""

    status: int
    http_version: str
    headers: Mapping[str, str] = field(default_factory=dict)
    t_headers_s: float | None = None  # offset from request start

    @property
    def content_type(self) -> str:
        """The media type header, as sent."""
        return self.headers.get("content-type", "")

    @property
    def content_encoding(self) -> str | None:
        """The content coding, if any."""
        return self.headers.get("content-encoding") or None


class CounterSource(Protocol):
    """Gives the token counter for a model."""

    def for_model(self, model: str | None) -> Counter: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowResult:
    """Everything computed when a flow ends; `record` is what is written."""

    record: dict[str, Any]
    figures: Figures | None
    tokens: TokenAccount | None
    segments: tuple[Any, ...] = ()  # hops.Segment per segment, on the outermost flow of a trace
    delivery: Delivery | None = None  # the bytes' way to the client, when the proxy followed it
    # the reply's first visible characters, in memory only (never written): live pairing tells
    # a flow still in flight that cannot be this reply from one that may be (proxy.pairing)
    opening: str = ""


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def finish_flow(
    *,
    flow_id: str,
    trace_id: str | None,
    span_id: str | None = None,
    parent_span_id: str | None = None,
    hop: str,
    listener: str,
    request: RequestInfo,
    response: ResponseInfo | None,
    meter: FlowMeter | None,
    ended: str,
    bytes_out: int,
    counters: CounterSource,
    stall_threshold_s: float,
    log_content: bool = False,
    measuring_error: str | None = None,
    delivery: DeliverySeen | None = None,
    failure: UpstreamFailure | None = None,
    fingerprint_key: bytes | None = None,
) -> FlowResult:
    """Build the record of a finished flow: tokens, figures and findings.

    Every record says how the flow `ended`, at the top level, also when no response came (the
    upstream failed, or the client left first); `response.ended` repeats it when there is a
    response. `failure` names why the upstream failed the flow (`upstream_error`, and a finding).
    `delivery` is what the proxy saw of the bytes going out to the client (hopmeter.core.delivery);
    without it (offline tools, tests) the record has no `delivery` section.
    """
    rec: dict[str, Any] = {
        "schema": SCHEMA,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent_span_id,
        "flow_id": flow_id,
        "hop": hop,
        "listener": listener,
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
    figures: Figures | None = None
    account: TokenAccount | None = None
    out: Delivery | None = None
    opening = ""
    api = "other"
    model = request.model
    if response is not None:
        t0 = request.t_start
        resp: dict[str, Any] = {
            "status": response.status,
            "http_version": response.http_version,
            "content_type": response.content_type,
            "content_encoding": response.content_encoding,
            "t_headers": _abs(t0, response.t_headers_s),
            "t_first_byte": None,
            "t_last_byte": None,
            "bytes_wire": 0,
            "bytes_decoded": 0,
            "bytes_out": bytes_out,
            "ended": ended,
            "headers": {k: v for k, v in response.headers.items() if k in KEPT_RESPONSE_HEADERS},
        }
        rec["response"] = resp
        if meter is not None:
            api = meter.api
            model = meter.facts.model or model
            resp["t_first_byte"] = _abs(t0, meter.first_byte_s)
            resp["t_last_byte"] = _abs(t0, meter.last_byte_s)
            resp["bytes_wire"] = meter.bytes_wire
            resp["bytes_decoded"] = meter.bytes_decoded
            account = _account(meter, counters.for_model(model))
            figures = _figures(meter, account, stall_threshold_s)
            # to the microsecond: round(t * 1e6) / 1e6 is round(t, 6) at half the cost (no
            # decimal conversion), and these run once per chunk and per event of every flow
            rec["chunks"] = [
                [round(t * 1e6) / 1e6, n]
                for t, n in zip(meter.chunk_t, meter.chunk_bytes, strict=True)
            ]
            rec["chunks_dropped"] = meter.chunks_seen - len(meter.chunk_t)
            rec["events"] = [
                [round(t * 1e6) / 1e6, k, off]
                for t, k, off in zip(
                    meter.events.t_s, account.per_event, meter.events.content_offset, strict=False
                )
            ]
            rec["events_dropped"] = meter.events_seen - len(meter.events.t_s)
            if delivery is not None:
                out = summarize(delivery, meter.chunk_t, meter.events.t_s, account.per_event)
                if out.measured:
                    rec["chunks_out"] = out.chunks_out
            rec["figures"] = _figures_dict(meter, figures, account)
            rec["stream"] = _stream_facts(meter)
            opening = _text_fields(rec, meter, log_content, fingerprint_key)
        if delivery is not None:
            if out is None:  # no measured response: nothing to align the chunks with
                why = delivery.reason or "the response was not measured"
                out = summarize(replace(delivery, measured=False, reason=why), (), (), ())
            rec["delivery"] = out.as_dict()
    rec["ended"] = ended
    if failure is not None:
        rec["upstream_error"] = failure.as_dict()
    rec["api"] = api
    rec["model"] = model
    findings = [] if failure is None else [upstream_finding(failure).as_dict()]
    if response is not None and meter is not None and figures is not None and account is not None:
        view = stream_view(
            meter=meter,
            f=figures,
            account=account,
            response=response,
            ended=ended,
            stall_threshold_s=stall_threshold_s,
            stream_requested=request.stream_requested,
            delivery=out,
        )
        findings += [f.as_dict() for f in diagnose(view)]
    rec["findings"] = findings
    if measuring_error:
        rec["measuring_error"] = measuring_error
    return FlowResult(record=rec, figures=figures, tokens=account, delivery=out, opening=opening)


def _text_fields(
    rec: dict[str, Any], meter: FlowMeter, log_content: bool, key: bytes | None
) -> str:
    """The reply's fingerprint (always) and text (with --log-content) in `rec`; its opening."""
    opening = meter.text_head(FINGERPRINT_CHARS)
    fp = fingerprint(opening, meter.visible_chars, key)
    if fp is not None:  # a digest of the opening, never the text (core.fingerprint)
        rec["fingerprint"] = fp.as_dict()
    if log_content:
        rec["content"] = meter.text()
    return opening


def _abs(t0: float, offset: float | None) -> float | None:
    return None if offset is None else round(t0 + offset, 6)


def _account(meter: FlowMeter, counter: Counter) -> TokenAccount:
    n = len(meter.events.t_s)
    texts = meter.event_texts()
    # an event whose text was not kept (past the bound) has "" here but visible chars in offsets
    offsets = meter.events.content_offset
    overflow = [not texts[i] and offsets[i] > (offsets[i - 1] if i else 0) for i in range(n)]
    return account_tokens(
        stream_tokens=meter.events.stream_tokens[:n],
        texts=texts,
        overflow=overflow,
        usage=meter.facts.usage_output_tokens,
        counter=counter,
        # reasoning billed but not streamed as text is not in any event
        hidden_reasoning=(
            meter.facts.usage_reasoning_tokens if meter.facts.reasoning_chars == 0 else None
        ),
    )


def _figures(meter: FlowMeter, account: TokenAccount, stall_threshold_s: float) -> Figures:
    return compute_figures(
        first_byte_s=meter.first_byte_s,
        last_byte_s=meter.last_byte_s,
        times_s=meter.events.t_s,
        tokens=account.per_event,
        first_event_s=meter.facts.first_event_s,
        first_visible_s=meter.facts.first_visible_s,
        first_content_s=meter.facts.first_content_s,
        stall_threshold_s=stall_threshold_s,
    )


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


def _stream_facts(meter: FlowMeter) -> dict[str, Any]:
    facts = meter.facts
    framer = meter.framer
    out: dict[str, Any] = {
        "terminal_seen": facts.terminal_seen,
        "errors": facts.errors[:5],
        "replacement_chars": meter.utf8.replacement_chars,
        "literal_replacement_chars": meter.utf8.literal_replacement_chars,
        "chunks_split_utf8": meter.utf8.split_sequences,
        "events_incomplete_utf8": facts.events_incomplete_utf8,
        "decode_error": facts.decode_error,
        "malformed_events": meter.malformed_events,
    }
    if framer is not None:
        out["line_endings"] = dict(getattr(framer, "line_endings", {}))
        out["unterminated_bytes"] = getattr(framer, "unterminated_bytes", 0)
        out["overflows"] = getattr(framer, "overflows", 0)
    return out


def summary_line(rec: Mapping[str, Any]) -> str:
    """One human line per flow: hop, api, model, status, the key figures and findings."""
    resp = rec.get("response") or {}
    fig = rec.get("figures") or {}

    def ms(key: str) -> str:
        v = fig.get(key)
        return "-" if v is None else f"{v * 1000:.0f}ms"

    parts = [
        f"[{rec['hop']}]",
        f"{rec['request']['method']} {rec['request']['path']}",
        str(resp.get("status", "-")),
        rec.get("api", "other"),
        rec.get("model") or "-",
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


def stream_view(
    *,
    meter: FlowMeter,
    f: Figures,
    account: TokenAccount,
    response: ResponseInfo,
    ended: str,
    stall_threshold_s: float,
    stream_requested: bool | None,
    delivery: Delivery | None = None,
) -> StreamView:
    """The detectors' input for one measured flow."""
    framer = meter.framer
    facts = meter.facts
    n = len(meter.events.t_s)
    return StreamView(
        status=response.status,
        api=meter.api,
        event_stream=meter.event_stream,
        headers=response.headers,
        ended=ended,
        chunk_times_s=meter.chunk_t,
        chunk_bytes=meter.chunk_bytes,
        event_times_s=meter.events.t_s,
        event_tokens=account.per_event[:n],
        ttfb_s=f.ttfb_s,
        ttft_s=f.ttft_s,
        ttft_content_s=f.ttft_content_s,
        max_gap_s=f.max_gap_s,
        stalls=f.stalls,
        stall_threshold_s=stall_threshold_s,
        terminal_seen=facts.terminal_seen,
        errors=facts.errors,
        replacement_chars=facts.replacement_chars,
        invalid_utf8=meter.utf8.replacement_chars,
        events_incomplete_utf8=facts.events_incomplete_utf8,
        chunks_split_utf8=meter.utf8.split_sequences,
        line_endings=dict(getattr(framer, "line_endings", {})) if framer is not None else {},
        unterminated_bytes=getattr(framer, "unterminated_bytes", 0) if framer is not None else 0,
        document_tokens=0 if meter.event_stream else f.tokens,
        stream_requested=stream_requested,
        has_terminal=meter.api in TERMINATED_APIS,
        delivery=delivery if delivery is not None and delivery.measured else None,
    )
