"""Tests for hopmeter.core.record: what the flow record says of a measured stream."""

from __future__ import annotations

from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import RequestInfo, ResponseInfo, finish_flow
from hopmeter.core.tokens import Counter, estimate_counter

SSE = {"content-type": "text/event-stream"}


class EstimateCounters:
    """The counter source of a proxy without tokenizers: the text-shape estimate for every model."""

    def for_model(self, model: str | None) -> Counter:
        del model
        return estimate_counter()


def record_of(api: str, body: list[bytes]) -> dict[str, object]:
    """The record of one response whose chunks arrive 10 ms apart."""
    meter = FlowMeter(api=api, content_type=SSE["content-type"], content_encoding=None)
    for i, data in enumerate(body):
        meter.feed(data, 0.1 + i / 100)
    meter.close(0.1 + len(body) / 100)
    result = finish_flow(
        flow_id="f",
        trace_id=None,
        hop="edge",
        listener="edge",
        request=RequestInfo(
            method="POST",
            scheme="http",
            host="h",
            path="/v1/chat/completions",
            t_start=1.7e9,
            t_end=1.7e9,
            bytes=10,
        ),
        response=ResponseInfo(status=200, http_version="HTTP/1.1", headers=SSE, t_headers_s=0.05),
        meter=meter,
        ended="complete",
        bytes_out=meter.bytes_wire,
        counters=EstimateCounters(),
        stall_threshold_s=0.5,
    )
    return result.record


def test_malformed_payload_is_counted_in_the_stream_facts():
    """A chat event whose payload is not JSON is one malformed event in the record's stream."""
    rec = record_of(
        "openai.chat",
        [
            b'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n',
            b"data: {not json}\n\n",
            b'data: {"choices":[{"index":0,"delta":{"content":" there"}}]}\n\n',
            b"data: [DONE]\n\n",
        ],
    )
    stream = rec["stream"]
    assert isinstance(stream, dict)
    assert stream["malformed_events"] == 1
    assert rec["events_dropped"] == 0 and len(rec["events"]) == 4  # type: ignore[arg-type]


def test_clean_stream_has_no_malformed_events():
    """A stream of well-formed chat chunks counts no malformed event."""
    rec = record_of(
        "openai.chat",
        [b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n', b"data: [DONE]\n\n"],
    )
    assert rec["stream"]["malformed_events"] == 0  # type: ignore[index]


def test_unknown_stream_counts_malformed_events_once_its_api_is_known():
    """Text in a stream of no known API is its content; once a payload names the API, that API's
    parser counts what it cannot read."""
    rec = record_of(
        "sse",
        [
            b"data: hello\n\n",
            b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
            b"data: [1, 2]\n\n",
            b"data: [DONE]\n\n",
        ],
    )
    assert rec["api"] == "openai.chat"
    assert rec["stream"]["malformed_events"] == 1  # type: ignore[index]
