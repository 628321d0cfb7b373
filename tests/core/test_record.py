"""Tests for hopmeter.core.record: what the flow record says of a measured stream."""

from __future__ import annotations

import math
from typing import Any

import orjson

from hopmeter.core.apis._json import MAX_MODEL_CHARS
from hopmeter.core.delivery import DeliverySeen
from hopmeter.core.ledger import FlowChunks, Ledger, new_chunk
from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import FlowResult, finish, summary_line
from hopmeter.core.tokens import Counter, estimate_counter
from hopmeter.core.upstream import CAUSE_FIXES, UpstreamFailure
from hopmeter.core.vocab import Ended

SSE = {"content-type": "text/event-stream"}


class EstimateCounters:
    """The counter source of a proxy without tokenizers: the text-shape estimate for every model."""

    def for_model(self, model: str | None) -> Counter:
        del model
        return estimate_counter()


def record_of(api: str, body: list[bytes]) -> dict[str, Any]:
    """The record of one response whose chunks arrive 10 ms apart."""
    return result_of(api, body).record


def result_of(api: str, body: list[bytes], delivery: DeliverySeen | None = None) -> FlowResult:
    """The result of one response whose chunks arrive 10 ms apart."""
    meter = FlowMeter(api=api, content_type=SSE["content-type"], content_encoding=None)
    for i, data in enumerate(body):
        meter.feed(data, 0.1 + i / 100)
    meter.close(0.1 + len(body) / 100)
    return finish(
        Seen(
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
            response=ResponseInfo(
                status=200, http_version="HTTP/1.1", headers=SSE, t_headers_s=0.05
            ),
            meter=meter,
            ended="complete",
            bytes_out=meter.bytes_wire,
            stall_threshold_s=0.5,
            delivery=delivery,
        ),
        EstimateCounters(),
    )


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


CHAT = [
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" there"}}]}\n\n',
    b"data: [DONE]\n\n",
]


def followed(n: int, wait_until: float) -> FlowChunks:
    """`n` chunks read 10 ms apart from offset 0.1 (monotonic 100.1), written at once; the kernel
    held the last one unsent until `wait_until` (monotonic)."""
    led, flow = Ledger(), FlowChunks()
    for i in range(n):
        c = new_chunk(50, 100.1 + i / 100)
        flow.add(c)
        led.arm(c)
        led.wrote(58, c[1] + 0.0001, False)
    led.sample(wait_until, -math.inf, 0, 58)  # the first look: the last chunk still unsent
    led.sample(wait_until + 0.001, wait_until, 0, 0)
    return flow


def seen(flow: FlowChunks | None, measured: bool = True) -> DeliverySeen:
    """What a proxy saw of the flow's bytes, the request having started at monotonic 100."""
    return DeliverySeen(
        reason=None if measured else "no socket",
        measured=measured,
        chunks=flow,
        mono0=100.0,
        skew_s=0.0,
        http_version="HTTP/1.1",
    )


def test_out_times_line_up_with_the_chunks_they_follow():
    """chunks_out has one [out_s, sent_s] per listed chunk; the delivery section sums them up."""
    result = result_of("openai.chat", CHAT, seen(followed(3, 100.5)))
    rec = result.record
    assert [c[0] for c in rec["chunks"]] == [0.1, 0.11, 0.12]
    assert rec["chunks_out"] == [[0.1001, 0.1001], [0.1101, 0.1101], [0.1201, 0.5]]
    section = rec["delivery"]
    assert section["measured"] and section["reason"] is None
    assert section["client_wait_s"] == 0.3799  # the last chunk: written at 0.1201, unsent at 0.5
    assert section["hold_max_s"] == 0.0001
    assert result.delivery is not None and result.delivery.holds


def test_a_flow_not_followed_has_a_reason_and_no_out_times():
    """Not measured: the delivery section says why, and there is no chunks_out to misread."""
    rec = result_of("openai.chat", CHAT, seen(None, measured=False)).record
    assert "chunks_out" not in rec
    assert rec["delivery"]["measured"] is False and rec["delivery"]["reason"] == "no socket"


def test_records_built_offline_have_no_delivery_section():
    """Without what a proxy saw (tools, tests), the record says nothing about delivery."""
    rec = record_of("openai.chat", CHAT)
    assert "delivery" not in rec and "chunks_out" not in rec


def unanswered(
    failure: UpstreamFailure | None, ended: str, model: str | None = None
) -> dict[str, Any]:
    """The record of a request (for `model`) that never got a response."""
    request = RequestInfo(
        method="POST", scheme="http", host="h", path="/v1/chat/completions", t_start=1.7e9,
        t_end=None, bytes=0, model=model,
    )  # fmt: skip
    return finish(Seen(
        flow_id="f", trace_id=None, hop="edge", listener="edge", request=request, response=None,
        meter=None, ended=ended, bytes_out=0, stall_threshold_s=0.5,
        failure=failure,
    ), EstimateCounters()).record  # fmt: skip


def test_every_record_says_how_it_ended_also_without_a_response():
    """A flow with no response has a top-level `ended` (and no `response`); one with a
    response repeats its `response.ended` at the top level."""
    rec = unanswered(None, "client_gone")
    assert rec["ended"] == "client_gone"
    assert "response" not in rec and "upstream_error" not in rec
    assert rec["findings"] == []
    answered = record_of("openai.chat", [b"data: [DONE]\n\n"])
    assert answered["ended"] == answered["response"]["ended"] == "complete"  # type: ignore[index]


def test_an_upstream_failure_is_named_with_its_status_and_fix():
    """A refused connect: `upstream_error` says the cause, the detail and the 502 the client
    got, and the first finding carries the cause's fix."""
    failure = UpstreamFailure(
        cause=Ended.CONNECT_REFUSED, detail="ECONNREFUSED 127.0.0.1:8000", status_sent=502
    )
    rec = unanswered(failure, failure.cause)
    assert rec["ended"] == "connect_refused"
    assert rec["upstream_error"] == {
        "cause": "connect_refused",
        "detail": "ECONNREFUSED 127.0.0.1:8000",
        "status_sent": 502,
    }
    (finding,) = rec["findings"]
    assert finding["kind"] == "upstream_unreachable"
    assert finding["severity"] == "error"
    assert finding["fix"] == CAUSE_FIXES[Ended.CONNECT_REFUSED]
    assert "ended=connect_refused" in summary_line(rec)


def test_the_summary_line_says_what_the_page_saw() -> None:
    """A record with a joined beacon: the first painted token and the client findings end its
    line; one whose beacon never came says so."""
    from hopmeter.core.record import summary_line

    base: dict[str, Any] = {
        "hop": "edge",
        "request": {"method": "POST", "path": "/v1/chat/completions"},
        "response": {"status": 200, "ended": "complete"},
        "figures": {"ttft_s": 0.05},
        "findings": [{"kind": "line_endings"}],
    }
    painted = {
        **base,
        "browser": {"joined": True, "findings": [{"kind": "client_missed_events"}]},
        "screen": {"ttft_s": 0.0874},
    }
    line = summary_line(painted)
    assert line.endswith("findings=line_endings painted=87ms client=client_missed_events")
    missing = summary_line({**base, "browser": {"joined": False, "reason": "no beacon"}})
    assert missing.endswith("browser=no-beacon")
    assert "painted" not in summary_line(base) and "browser" not in summary_line(base)


def test_the_summary_line_is_one_line_whatever_the_model_says() -> None:
    """The model comes from the client's body or the upstream's reply: a newline in it would
    start a forged log line, an escape would colour the terminal. Written as escapes, clipped."""
    from hopmeter.core.record import MAX_LINE_MODEL_CHARS, summary_line

    rec: dict[str, Any] = {
        "hop": "edge",
        "request": {"method": "POST", "path": "/v1/chat/completions"},
        "response": {"status": 401, "ended": "complete"},
        "model": "gpt-4o\n[01:41:59.000] hopmeter: FORGED \x1b[31mRED",
    }
    line = summary_line(rec)
    assert "\n" not in line and "\x1b" not in line
    assert "gpt-4o\\n[01:41:59.000] hopmeter: FORGED \\x1b[31mRED" in line
    long = summary_line({**rec, "model": "m" * 500})
    assert "m" * MAX_LINE_MODEL_CHARS in long and "m" * (MAX_LINE_MODEL_CHARS + 1) not in long
    assert "Qwen/通义千问-7B" in summary_line({**rec, "model": "Qwen/通义千问-7B"})  # printable


def chat_chunk(model: str, content: str = "hi", **extra: object) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None, **extra}
    doc = {"object": "chat.completion.chunk", "model": model, "choices": [choice]}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def test_a_long_model_name_is_clipped_on_every_path_and_said() -> None:
    """A reply naming a 10,000-character model: the record keeps 256 characters and says how
    many went (model_clipped_chars) whichever reader read it: the plain chat chunk, the full
    chat reader (a chunk with logprobs), Anthropic's message_start. A short name clips
    nothing."""
    long = "m" * 10_000
    plain = record_of("openai.chat", [chat_chunk(long)] * 3 + [b"data: [DONE]\n\n"])
    full = record_of("openai.chat", [chat_chunk(long, logprobs={"content": []})] * 2)
    start = {"type": "message_start", "message": {"id": "m", "model": long, "content": []}}
    anthropic = record_of(
        "anthropic.messages", [b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\n"]
    )
    for rec in (plain, full, anthropic):
        assert rec["model"] == "m" * MAX_MODEL_CHARS
        assert rec["model_clipped_chars"] == 10_000 - MAX_MODEL_CHARS
    short = record_of("openai.chat", [chat_chunk("gpt-4o")] * 2)
    assert short["model"] == "gpt-4o" and short["model_clipped_chars"] == 0


def test_a_long_model_name_in_the_request_is_clipped_and_said() -> None:
    """A reply that names no model: the record's model is the request's, clipped the same."""
    rec = unanswered(None, "connect_refused", model="q" * 300)
    assert rec["model"] == "q" * MAX_MODEL_CHARS and rec["model_clipped_chars"] == 44
