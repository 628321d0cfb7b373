"""Tests for hopmeter.core.measure: what measuring what was seen of a flow finds, typed, before any
record is written."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.delivery import DeliverySeen
from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen, _overflow, measure
from hopmeter.core.meter import FlowMeter
from hopmeter.core.passage import PassageSeen
from hopmeter.core.record import to_record
from hopmeter.core.tokens import Counter, estimate_counter
from hopmeter.core.upstream import UpstreamFailure
from hopmeter.core.vocab import Ended, FindingKind, Severity

SSE = {"content-type": "text/event-stream"}
CHAT = [
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"model":"gpt-4o"}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" there"}}]}\n\n',
    b"data: [DONE]\n\n",
]
REQUEST = RequestInfo(
    method="POST", scheme="http", host="h", path="/v1/chat/completions", t_start=1.7e9,
    t_end=1.7e9, bytes=10, model="asked-for",
)  # fmt: skip


class Counters:
    """The text-shape estimate for every model; remembers the models it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []

    def for_model(self, model: str | None) -> Counter:
        self.asked.append(model)
        return estimate_counter()


def chat(body: list[bytes] = CHAT) -> FlowMeter:
    """A closed meter of an OpenAI chat stream whose chunks came 10 ms apart."""
    meter = FlowMeter(api="openai.chat", content_type=SSE["content-type"], content_encoding=None)
    for i, data in enumerate(body):
        meter.feed(data, 0.1 + i / 100)
    meter.close(0.1 + len(body) / 100)
    return meter


def seen(meter: FlowMeter | None = None, **over: object) -> Seen:
    """What a proxy saw of one chat flow (a response, its meter) with `over` changed."""
    fields: dict[str, object] = {
        "flow_id": "f",
        "trace_id": "t",
        "hop": "edge",
        "listener": "edge",
        "request": REQUEST,
        "response": ResponseInfo(status=200, http_version="HTTP/1.1", headers=SSE),
        "meter": meter,
        "ended": Ended.COMPLETE,
        "bytes_out": 0,
        "stall_threshold_s": 0.5,
    }
    return Seen(**{**fields, **over})  # type: ignore[arg-type]


def test_a_measured_flow_has_its_tokens_figures_and_model() -> None:
    """A stream's measurement counts its tokens with the reply's model's counter and times them;
    the record written from it says the same."""
    counters = Counters()
    m = measure(seen(chat()), counters)
    assert counters.asked == ["gpt-4o"]  # the reply names its model: that one's tokenizer
    assert (m.api, m.model) == ("openai.chat", "gpt-4o")
    assert m.tokens is not None and m.figures is not None
    assert m.figures.tokens == sum(m.tokens.per_event) > 0
    assert m.fingerprint is not None and m.opening == "Hi there"
    rec = to_record(m)
    assert rec["figures"]["tokens"] == m.figures.tokens
    assert rec["figures"]["ttfb_s"] == round(m.figures.ttfb_s or 0, 6)
    assert rec["fingerprint"] == m.fingerprint.as_dict()


def test_what_was_seen_cannot_change_once_taken() -> None:
    """Seen and Measurement are frozen: a record is written from what was taken at the end."""
    m = measure(seen(chat()), Counters())
    with pytest.raises(FrozenInstanceError):
        m.seen.ended = Ended.ERROR  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        m.api = "other"  # type: ignore[misc]


def test_without_a_meter_nothing_is_counted() -> None:
    """No measured response (no meter): no tokenizer asked, no figures, the request's model, the
    API "other", and a delivery section that says why nothing was aligned."""
    counters = Counters()
    delivery = DeliverySeen(
        reason=None, measured=True, chunks=None, mono0=0.0, skew_s=0.0, http_version="HTTP/1.1"
    )
    m = measure(seen(None, delivery=delivery), counters)
    assert counters.asked == [] and m.tokens is None and m.figures is None
    assert (m.api, m.model) == ("other", "asked-for")
    assert m.delivery is not None and m.delivery.measured is False
    assert m.delivery.reason == "the response was not measured"


def test_no_response_means_no_delivery_summary() -> None:
    """A flow that got no response has no delivery summary, whatever was seen of its bytes."""
    delivery = DeliverySeen(
        reason="no socket", measured=False, chunks=None, mono0=0.0, skew_s=0.0,
        http_version="HTTP/1.1",
    )  # fmt: skip
    m = measure(seen(None, response=None, delivery=delivery), Counters())
    assert m.delivery is None and "delivery" not in to_record(m)


def test_findings_come_in_order_upstream_then_detectors_then_the_proxy_s() -> None:
    """The upstream's finding comes first, then the detectors'; how mitmproxy moved the flow
    adds its findings and then every finding is ordered by severity, errors first."""
    failure = UpstreamFailure(cause=Ended.CONNECT_REFUSED, detail="refused", status_sent=502)
    plain = measure(seen(None, response=None, failure=failure), Counters())
    assert [f.kind for f in plain.findings] == [FindingKind.UPSTREAM_UNREACHABLE]
    unterminated = chat(CHAT[:2])  # no [DONE]: the detectors say the stream was cut short
    passage = PassageSeen(
        section={"stream": "chained", "edited": "after_streaming"},
        error=None,
        cause="mitmproxy_error",
        edited_after_streaming=True,
        streamed_bytes=100,
    )
    m = measure(seen(unterminated, passage=passage), Counters())
    kinds = [f.kind for f in m.findings]
    assert FindingKind.EDITED_AFTER_STREAMING in kinds and len(kinds) > 1
    severities = [f.severity for f in m.findings]
    order = [Severity.ERROR, Severity.WARNING, Severity.INFO]
    assert severities == sorted(severities, key=order.index)
    assert to_record(m)["mitmproxy"] == passage.section


@given(
    texts=st.lists(st.sampled_from(["", "a", "héllo"]), max_size=20),
    offsets=st.lists(st.integers(-3, 40), max_size=22),
    extra=st.integers(-2, 2),
)
def test_overflow_mapped_over_the_columns_is_the_loop_s(
    texts: list[str], offsets: list[int], extra: int
) -> None:
    """`_overflow` over whole columns gives the per-event loop's list of bools, for any texts and
    offsets (as the meter's array("i") or a list) and any event count."""
    n = max(0, len(texts) + extra)

    def loop(offs: Sequence[int]) -> list[bool]:
        return [not texts[i] and offs[i] > (offs[i - 1] if i else 0) for i in range(n)]

    for offs in (offsets, array("i", offsets)):
        try:
            want = loop(offs)
        except IndexError:
            with pytest.raises(IndexError):
                _overflow(texts, offs, n)
            continue
        got = _overflow(texts, offs, n)
        assert got == want and [type(b) for b in got] == [bool] * n
