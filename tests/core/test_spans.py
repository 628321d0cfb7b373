"""hopmeter spans read back: what a join needs, or why a span cannot be joined."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hopmeter.core.spans import HopSpan, SpanView, read_span, span_record
from hopmeter.core.vocab import SpanOutcome

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
EDGE = bytes.fromhex("00f067aa0ba902b7")
ORIGIN = bytes.fromhex("b7ad6b7169203331")
START_NS = 1_800_000_000_250_000_000


def view(**over: Any) -> SpanView:
    """A hopmeter edge span as an OTLP decoder gives it."""
    attrs: dict[str, Any] = {
        "hopmeter.hop": "edge",
        "hopmeter.api": "openai.chat",
        "gen_ai.request.model": "gpt-4o-mini",
        "hopmeter.ttft_s": 0.3,
        "hopmeter.itl_p50_s": 0.02,
        "hopmeter.stalls": 0,
        "hopmeter.findings": "stall,burst_gaps",
        "hopmeter.timeline.v": 1,
        "hopmeter.timeline.t_us": [300000, 320000, 340000],
        "hopmeter.timeline.offset": [4, 8, 12],
        "http.route": "/v1/chat/completions",
    }
    extra = over.pop("attrs", {})
    attrs.update(extra or {})
    fields: dict[str, Any] = {
        "trace_id": TRACE,
        "span_id": EDGE,
        "parent_span_id": b"",
        "name": "hopmeter edge POST /v1/chat/completions",
        "start_ns": START_NS,
        "end_ns": START_NS + 10**9,
        "service": "hopmeter",
        "attrs": None if extra is None else attrs,
    }
    fields.update(over)
    return SpanView(**fields)


def test_a_hopmeter_span_reads_as_a_hop_span() -> None:
    """Ids, hop, start, timeline and what segment findings read are kept."""
    span = read_span(view(parent_span_id=ORIGIN))
    assert isinstance(span, HopSpan)
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE, EDGE, ORIGIN)
    assert span.hop == "edge" and span.start_ns == START_NS
    assert len(span.timeline) == 3
    assert (span.ttft_s, span.itl_p50_s) == (0.3, 0.02)
    assert span.finding_kinds == {"stall", "burst_gaps"}


def test_its_view_is_what_alignment_reads() -> None:
    """The view has the span's start in seconds and the timeline as record events."""
    span = read_span(view(attrs={"hopmeter.timeline.span_us": 9_000_000}))
    assert isinstance(span, HopSpan)
    hop = span.view()
    assert hop.hop == "edge" and hop.t_start == START_NS / 1e9
    assert hop.events == [[0.3, 1, 4], [0.32, 1, 8], [0.34, 1, 12]]
    assert hop.token_span_s == 9.0


@pytest.mark.parametrize(
    ("over", "outcome"),
    [
        ({"attrs": None}, SpanOutcome.FOREIGN),
        ({"attrs": {"hopmeter.timeline.offset": [4, 8]}}, SpanOutcome.MALFORMED),
        ({"attrs": {"hopmeter.hop": ""}}, SpanOutcome.MALFORMED),
        ({"attrs": {"hopmeter.hop": 7}}, SpanOutcome.MALFORMED),
        ({"attrs": {"hopmeter.hop": "x" * 129}}, SpanOutcome.MALFORMED),
        ({"trace_id": bytes(16)}, SpanOutcome.MALFORMED),
        ({"trace_id": TRACE[:8]}, SpanOutcome.MALFORMED),
        ({"span_id": b""}, SpanOutcome.MALFORMED),
        ({"parent_span_id": b"\x01"}, SpanOutcome.MALFORMED),
        ({"parent_span_id": EDGE}, SpanOutcome.MALFORMED),  # its own parent: it would join itself
        ({"start_ns": 0}, SpanOutcome.MALFORMED),
        ({"start_ns": 10**15}, SpanOutcome.MALFORMED),  # 1970, 11 days in: no wall clock
        ({"start_ns": 18_000_000_000 * 10**9}, SpanOutcome.MALFORMED),  # the year 2540
    ],
)
def test_spans_that_cannot_be_joined_say_why(over: dict[str, Any], outcome: SpanOutcome) -> None:
    """Foreign spans and absurd ones (timeline, hop, ids, a start no wall clock gives) are told
    apart."""
    assert read_span(view(**over)) is outcome


def test_a_span_sent_with_the_timeline_off_has_nothing_to_join() -> None:
    """A hopmeter span without timeline attributes is `no_timeline`, not malformed."""
    base = view()
    assert base.attrs is not None
    attrs = {k: v for k, v in base.attrs.items() if not k.startswith("hopmeter.timeline.")}
    assert read_span(dataclasses.replace(base, attrs=attrs)) is SpanOutcome.NO_TIMELINE


def test_span_record_has_what_a_join_reads() -> None:
    """The record fields come from the span: ids in hex, start, events, figures, finding kinds."""
    rec = span_record(view(parent_span_id=ORIGIN, attrs={"hopmeter.timeline.dropped": 5}))
    assert isinstance(rec, dict)
    assert rec["schema"] == "hopmeter.flow/1"
    assert (rec["trace_id"], rec["span_id"], rec["parent_span_id"]) == (
        TRACE.hex(),
        EDGE.hex(),
        ORIGIN.hex(),
    )
    assert rec["hop"] == "edge" and rec["request"] == {"t_start": START_NS / 1e9}
    assert rec["events"] == [[0.3, 1, 4], [0.32, 1, 8], [0.34, 1, 12]]
    assert rec["events_dropped"] == 5
    assert rec["figures"] == {"ttft_s": 0.3, "itl_p50_s": 0.02, "stalls": 0}
    assert rec["findings"] == [{"kind": "burst_gaps"}, {"kind": "stall"}]
    assert (rec["api"], rec["model"]) == ("openai.chat", "gpt-4o-mini")


def test_span_record_of_a_root_span_has_no_parent() -> None:
    """A root span's record has parent_span_id None, as hopmeter's own records do."""
    rec = span_record(view())
    assert isinstance(rec, dict) and rec["parent_span_id"] is None


def test_span_record_of_a_foreign_span_is_its_outcome() -> None:
    """A span that is not hopmeter's gives no record, only the reason."""
    assert span_record(view(attrs=None)) is SpanOutcome.FOREIGN
