"""Tests for hopmeter.proxy.addon.tap: the stream callables return every chunk, measuring waits."""

from __future__ import annotations

import asyncio

from hopmeter.core.meter import FlowMeter
from hopmeter.proxy.addon.tap import (
    REQUEST_SNIFF_BYTES,
    FlowState,
    MeasureQueue,
    RequestTap,
    ResponseTap,
)
from tests.harness.procs import until

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'


def state() -> FlowState:
    """A flow that started at monotonic time 100."""
    return FlowState(mono0=100.0, skew_s=0.0, listener="edge", hop="edge", trace=None, span_id="0")


def meter() -> FlowMeter:
    """A meter for an OpenAI chat event stream."""
    return FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)


class TestResponseTap:
    def test_chunks_come_back_unchanged_and_are_measured_with_their_stamp(self) -> None:
        """Each chunk is returned as given; measured later, it keeps the time it was stamped."""
        tap = ResponseTap(state(), MeasureQueue(), lambda where, exc: None)
        tap.meter = meter()
        assert tap(CHUNK) == CHUNK  # no loop running: measured at once
        assert tap(b"") == b""
        assert tap.bytes_out == len(CHUNK)
        assert tap.meter.events_seen == 1

    def test_a_failing_meter_stops_measuring_once_and_says_so_once(self) -> None:
        """A meter that raises is dropped; the error is reported once, chunks still pass."""
        errors: list[str] = []
        tap = ResponseTap(state(), MeasureQueue(), lambda where, exc: errors.append(where))
        tap.meter = meter()

        def broken(data: bytes, now: float) -> None:
            raise KeyError("x")

        tap.meter.feed = broken  # type: ignore[method-assign]
        assert [tap(CHUNK), tap(CHUNK)] == [CHUNK, CHUNK]
        assert tap.meter is None and errors == ["response_tap"]
        assert tap.error == "KeyError: 'x'"

    def test_unmeasured_taps_queue_nothing(self) -> None:
        """A tap without a meter (measuring failed or was never set up) only forwards."""
        queue = MeasureQueue()
        tap = ResponseTap(None, queue, lambda where, exc: None)
        assert tap(CHUNK) == CHUNK and queue.pending == []


class TestMeasureQueue:
    def test_measuring_waits_for_the_loop_and_keeps_the_order(self) -> None:
        """With a loop running, chunks are measured together after the callable returned."""

        async def run() -> tuple[int, int, list[float]]:
            queue = MeasureQueue()
            tap = ResponseTap(state(), queue, lambda where, exc: None)
            tap.meter = meter()
            tap(CHUNK)
            tap(CHUNK)
            queued = len(queue.pending)
            seen_before = tap.meter.events_seen
            await until(lambda: tap.meter.events_seen == 2, what="the queued chunks measured")
            return queued, seen_before, list(tap.meter.events.t_s)

        queued, seen_before, times = asyncio.run(run())
        assert (queued, seen_before) == (2, 0)
        assert len(times) == 2 and times[0] <= times[1]


class TestRequestTap:
    def test_the_body_is_counted_and_its_head_read(self) -> None:
        """Request chunks come back unchanged; the byte count and the model are kept."""
        st = state()
        tap = RequestTap(st, lambda where, exc: None)
        parts = [b'{"model": "llama-3.3", ', b'"stream": false, "messages": []}']
        assert [tap(p) for p in [*parts, b""]] == [*parts, b""]
        assert st.request_bytes == sum(map(len, parts))
        assert (st.request_model, st.stream_requested) == ("llama-3.3", False)
        assert st.request_head == bytearray()  # released at the end

    def test_only_the_head_of_a_long_body_is_kept(self) -> None:
        """A prompt past the sniff bound is cut; fields before the cut are still read."""
        st = state()
        tap = RequestTap(st, lambda where, exc: None)
        tap(b'{"model": "m", "stream": true, "x": "' + b"a" * (2 * REQUEST_SNIFF_BYTES))
        assert len(st.request_head) == REQUEST_SNIFF_BYTES
        tap(b"")
        assert (st.request_model, st.stream_requested) == ("m", True)
