"""hopmeter's spans read back: what a hop join needs of one OTLP span, as a view or a record.

Every hopmeter span (hopmeter.export.otel) carries the flow's ids, its hop, figures, finding kinds
and, unless the timeline is off, the token timeline (hopmeter.core.timeline). Decoders of the
OTLP encodings (OTLP JSON in hopmeter.core.otlp_json, protobuf in hopmeter.join.otlp) give a
`SpanView`; `read_span` checks it and keeps what a join needs as a `HopSpan`, or says why not;
`span_record` turns that into the fields of a `hopmeter.flow/1` record that a join reads, so
`hopmeter join` gives the same pairs and holds from spans as from records (docs/design.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hopmeter.core import timeline
from hopmeter.core.hops import HopFlow
from hopmeter.core.record import SCHEMA
from hopmeter.core.vocab import SpanOutcome
from hopmeter.errors import TimelineError

HOP_KEY = "hopmeter.hop"  # the attribute that makes a span hopmeter's
MAX_HOP_CHARS = 128  # a hop is a short name (a label value downstream)
# Span attributes (hopmeter.<figure>) read back into the record's figures; the exporter writes
# these and the token source (hopmeter.export.otel.FIGURES).
FIGURES = (
    "ttfb_s",
    "ttfe_s",
    "ttft_s",
    "duration_s",
    "itl_p50_s",
    "itl_p99_s",
    "max_gap_s",
    "stalls",
    "tokens_per_s",
)
# A span's start as a wall clock can give it: from 2000 to 2100 (Unix ns). Outside, the start is
# no time at all (0, a counter, a year 2554): joined, it would make holds of centuries.
MIN_START_NS = 946_684_800 * 10**9
MAX_START_NS = 4_102_444_800 * 10**9
TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanView:
    """One span as any OTLP encoding gives it; `attrs` only for hopmeter's spans."""

    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    parent_span_id: bytes  # b"" for a root
    name: str
    start_ns: int
    end_ns: int
    service: str
    attrs: dict[str, Any] | None  # None: not a hopmeter span, its attributes were not read


@dataclass(frozen=True, slots=True, kw_only=True)
class HopSpan:
    """A hopmeter span a join can use: ids, hop, start, timeline and what segment findings read."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    hop: str
    start_ns: int
    timeline: timeline.Timeline
    ttft_s: float | None
    itl_p50_s: float | None
    finding_kinds: frozenset[str]

    def view(self) -> HopFlow:
        """The view alignment reads (hopmeter.core.hops)."""
        span_us = self.timeline.span_us
        return HopFlow(
            hop=self.hop,
            t_start=self.start_ns / 1e9,
            t_first_byte=None,
            events=self.timeline.events(),
            ttft_s=self.ttft_s,
            itl_p50_s=self.itl_p50_s,
            finding_kinds=self.finding_kinds,
            out_s=self.timeline.outs(),
            token_span_s=None if span_us is None else span_us / 1e6,
        )


def read_span(span: SpanView) -> HopSpan | SpanOutcome:
    """The span as a HopSpan, or why it cannot be joined (foreign, no timeline, malformed)."""
    attrs = span.attrs
    if attrs is None:
        return SpanOutcome.FOREIGN
    try:
        line = timeline.decode(attrs)
    except TimelineError:
        return SpanOutcome.MALFORMED
    if line is None:
        return SpanOutcome.NO_TIMELINE
    hop = attrs.get(HOP_KEY)
    if not isinstance(hop, str) or not 0 < len(hop) <= MAX_HOP_CHARS:
        return SpanOutcome.MALFORMED
    if not (_is_id(span.trace_id, TRACE_ID_BYTES) and _is_id(span.span_id, SPAN_ID_BYTES)):
        return SpanOutcome.MALFORMED
    parent = span.parent_span_id
    if parent and (not _is_id(parent, SPAN_ID_BYTES) or parent == span.span_id):
        return SpanOutcome.MALFORMED  # a span cannot be its own parent (it would join itself)
    if not MIN_START_NS <= span.start_ns < MAX_START_NS:
        return SpanOutcome.MALFORMED
    return HopSpan(
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=parent,
        hop=hop,
        start_ns=span.start_ns,
        timeline=line,
        ttft_s=_seconds(attrs.get("hopmeter.ttft_s")),
        itl_p50_s=_seconds(attrs.get("hopmeter.itl_p50_s")),
        finding_kinds=finding_kinds(attrs.get("hopmeter.findings")),
    )


def finding_kinds(value: object) -> frozenset[str]:
    """The kinds of a span's `hopmeter.findings` ("kind,kind"); none for anything else."""
    if not isinstance(value, str):
        return frozenset()
    return frozenset(kind for kind in value.split(",") if kind)


def span_record(view: SpanView) -> dict[str, Any] | SpanOutcome:
    """The fields of a `hopmeter.flow/1` record that a join reads, or why the span has none."""
    span = read_span(view)
    if isinstance(span, SpanOutcome):
        return span
    attrs = view.attrs or {}
    figures: dict[str, Any] = {
        key: attrs[f"hopmeter.{key}"] for key in FIGURES if f"hopmeter.{key}" in attrs
    }
    if span.timeline.span_us is not None:
        figures["token_span_s"] = span.timeline.span_us / 1e6
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex() or None,
        "flow_id": attrs.get("hopmeter.flow_id"),  # what a join names its flows by
        "hop": span.hop,
        "request": {"t_start": span.start_ns / 1e9},
        "api": attrs.get("hopmeter.api"),
        "model": attrs.get("gen_ai.request.model"),
        "events": span.timeline.events(),
        "figures": figures,
        "findings": [{"kind": kind} for kind in sorted(span.finding_kinds)],
    }
    if span.timeline.dropped:
        record["events_dropped"] = span.timeline.dropped
    outs = span.timeline.outs()
    if outs:  # a span has no chunks: when each event left the hop travels per event
        record["events_out"] = outs
    return record


def _is_id(value: bytes, size: int) -> bool:
    """A W3C id: `size` bytes, not all zeros."""
    return len(value) == size and any(value)


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
