"""What was seen of a flow when it ended (`Seen`), and what measuring it finds (`Measurement`).

The proxy layer takes a `Seen` once a flow has ended and its last bytes reached the client: the
request and response as they came, the flow's `FlowMeter` (closed: nothing more is fed), what was
seen of the bytes going out, why the upstream failed it, how mitmproxy moved it. `measure` turns
that into typed facts: the token account (the one step that needs a tokenizer), the figures, the
delivery summary, the fingerprint and the findings. hopmeter.core.record writes the record from
a `Measurement`; live observers (the metrics) read the typed facts instead of the record.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from hopmeter.core.apis import shown_error
from hopmeter.core.apis._json import clip_model
from hopmeter.core.delivery import Delivery, DeliverySeen, summarize
from hopmeter.core.detectors import Finding, StreamView, diagnose
from hopmeter.core.figures import Figures, compute_figures
from hopmeter.core.fingerprint import FINGERPRINT_CHARS, Fingerprint, fingerprint
from hopmeter.core.meter import FlowMeter
from hopmeter.core.passage import PassageSeen
from hopmeter.core.tokens import Counter, TokenAccount, account_tokens
from hopmeter.core.upstream import UpstreamFailure, upstream_finding
from hopmeter.core.vocab import SEVERITY_ORDER, TERMINATED_APIS, Api


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
    # the API the request's path and headers name: the record's `api` when no response was
    # measured (the upstream failed, the client left first, measuring failed), so such flows
    # keep their API
    api: str | None = None


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """Everything a flow's record says but its token counts, as it was when the flow ended.

    `meter` is closed (nothing more is fed to it); without it (no response, or measuring failed)
    the record has no figures. `delivery` is what the proxy saw of the bytes going out to the
    client; without it (offline tools, tests) the record has no `delivery` section. `failure`
    names why the upstream failed the flow; `passage` how mitmproxy moved it, when that differs
    from `hopmeter run`'s way.
    """

    flow_id: str
    trace_id: str | None
    span_id: str | None = None
    parent_span_id: str | None = None
    # what came in the request's traceparent (core.vocab.TraceReceived), when the proxy read it
    trace_received: str | None = None
    hop: str
    listener: str
    request: RequestInfo
    response: ResponseInfo | None
    meter: FlowMeter | None
    ended: str
    bytes_out: int
    stall_threshold_s: float
    log_content: bool = False
    # with log_content: the request's own credentials (its keys, tokens, cookies and query
    # values), taken out of any upstream text a record shows (an error that echoes the key)
    hidden: tuple[str, ...] = ()
    measuring_error: str | None = None
    delivery: DeliverySeen | None = None
    failure: UpstreamFailure | None = None
    fingerprint_key: bytes | None = None
    chaos: tuple[str, ...] | None = None  # the --chaos actions that re-cut the response
    relay_error: str | None = None  # the fault that made the relay cut the client's connection
    passage: PassageSeen | None = None
    mono_start_s: float | None = None  # the request's start, monotonic (FlowResult's)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """What measuring one flow found; hopmeter.core.record writes its record from this."""

    seen: Seen
    api: str  # the meter's API, "other" when the response was not measured
    model: str | None  # the reply's own model name, else the request's (clipped)
    tokens: TokenAccount | None  # None: no measured response
    figures: Figures | None
    delivery: Delivery | None  # the bytes' way to the client, when the proxy followed them
    findings: tuple[Finding, ...]  # the upstream's, the detectors', then how mitmproxy moved it
    fingerprint: Fingerprint | None
    # the reply's first visible characters, in memory only (never written): live pairing tells
    # a flow still in flight that cannot be this reply from one that may be (proxy.pairing)
    opening: str = ""
    # the stream's error events as the record shows them (`shown_error`: their messages only
    # with --log-content), for the record and the detectors alike
    errors: tuple[str, ...] = ()
    model_clipped_chars: int = 0  # characters clipped off `model` (MAX_MODEL_CHARS)


class CounterSource(Protocol):
    """Gives the token counter for a model."""

    def for_model(self, model: str | None) -> Counter: ...


def measure(seen: Seen, counters: CounterSource) -> Measurement:
    """Count the tokens of what was seen, and compute the figures, the delivery and findings."""
    meter, response = seen.meter, seen.response
    api, model = str(seen.request.api or Api.OTHER), seen.request.model
    clipped = 0  # characters clipped off the model name (MAX_MODEL_CHARS)
    account: TokenAccount | None = None
    figures: Figures | None = None
    out: Delivery | None = None
    fp: Fingerprint | None = None
    opening = ""
    errors: tuple[str, ...] = ()
    if response is not None and meter is not None:
        errors = tuple(
            shown_error(e, with_message=seen.log_content, hidden=seen.hidden)
            for e in meter.facts.errors
        )
        api = meter.api
        if meter.facts.model:
            model, clipped = meter.facts.model, meter.facts.model_clipped_chars
        account = _account(meter, counters.for_model(model))
        figures = _figures(meter, account, seen.stall_threshold_s)
        if seen.delivery is not None:
            out = summarize(seen.delivery, meter.chunk_t, meter.events.t_s, account.per_event)
        opening = meter.text_head(FINGERPRINT_CHARS)
        fp = fingerprint(opening, meter.visible_chars, seen.fingerprint_key)
    if model and not clipped:  # the request's (the reply's is clipped as it is read)
        model, clipped = clip_model(model)
    if response is not None and seen.delivery is not None and out is None:
        # no measured response: nothing to align the chunks with
        why = seen.delivery.reason or "the response was not measured"
        out = summarize(replace(seen.delivery, measured=False, reason=why), (), (), ())
    findings = [] if seen.failure is None else [upstream_finding(seen.failure)]
    if response is not None and meter is not None and figures is not None and account is not None:
        view = stream_view(
            meter=meter,
            f=figures,
            account=account,
            response=response,
            ended=seen.ended,
            stall_threshold_s=seen.stall_threshold_s,
            stream_requested=seen.request.stream_requested,
            delivery=out,
            errors=errors,
        )
        findings += diagnose(view)
    if seen.passage is not None:
        findings += seen.passage.findings()
        findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, len(SEVERITY_ORDER)))
    return Measurement(
        seen=seen,
        api=api,
        model=model,
        model_clipped_chars=clipped,
        tokens=account,
        figures=figures,
        delivery=out,
        findings=tuple(findings),
        fingerprint=fp,
        opening=opening,
        errors=errors,
    )


def _account(meter: FlowMeter, counter: Counter) -> TokenAccount:
    n = len(meter.events.t_s)
    texts = meter.event_texts()
    # an event whose text was not kept (past the bound) has "" here but visible chars in offsets
    overflow = _overflow(texts, meter.events.content_offset, n)
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


def _overflow(texts: Sequence[str], offsets: Sequence[int], n: int) -> list[bool]:
    """Per event, whether its text was not kept (past the bound: "" here) although it added
    visible characters (its content offset is past the one before).

    Mapped over the columns when there is a text per event and an offset for each (always, from
    a FlowMeter), with no bytecode per event; otherwise one event at a time, as before
    (tests/core/test_measure.py holds the two together).
    """
    if len(texts) == n <= len(offsets):
        # `not text and offset > previous offset`: both bools, so `&` is `and`
        before = itertools.chain((0,), offsets)
        return list(
            map(operator.and_, map(operator.not_, texts), map(operator.gt, offsets, before))
        )
    return [not texts[i] and offsets[i] > (offsets[i - 1] if i else 0) for i in range(n)]


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
    errors: Sequence[str] = (),
) -> StreamView:
    """The detectors' input for one measured flow (`errors` as the record shows them)."""
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
        errors=errors,
        replacement_chars=facts.replacement_chars,
        invalid_utf8=meter.utf8.replacement_chars,
        events_incomplete_utf8=facts.events_incomplete_utf8,
        chunks_split_utf8=meter.utf8.split_sequences,
        line_endings=dict(getattr(framer, "line_endings", {})) if framer is not None else {},
        unterminated_bytes=getattr(framer, "unterminated_bytes", 0) if framer is not None else 0,
        read_in_part=meter.unread_bytes > 0,
        document_tokens=0 if meter.event_stream else f.tokens,
        stream_requested=stream_requested,
        has_terminal=meter.api in TERMINATED_APIS,
        delivery=delivery if delivery is not None and delivery.measured else None,
        event_gaps_s=f.gaps.event_gaps_s if f.gaps is not None else None,
    )
