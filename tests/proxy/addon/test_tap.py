"""Tests for hopmeter.proxy.addon.tap: the stream callables return every chunk, measuring waits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.http import Headers
from mitmproxy.test import tflow

from hopmeter.core.ledger import GONE, SENT, new_chunk
from hopmeter.core.meter import FlowMeter
from hopmeter.core.wire import lower_headers
from hopmeter.proxy.addon.tap import (
    MEASURE_DELAY_S,
    PACK_AFTER_CHUNKS,
    REQUEST_SNIFF_BYTES,
    FlowState,
    MeasureQueue,
    RequestTap,
    ResponseTap,
    header_map,
    new_meter,
    start_trace,
)
from hopmeter.proxy.delivery.lane import STEP_FLOOR_S, FlowOut, LoopLog
from hopmeter.testing import ManualClock

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

    @pytest.mark.parametrize("where", ["out", "queue"])
    def test_a_stamp_that_fails_costs_measuring_never_the_chunk(self, where: str) -> None:
        """Even out of memory while stamping (the FlowOut's write counter, the measuring queue's
        timer), the chunk comes back whole and in place: an exception leaving the callable
        would lose it while mitmproxy goes on with the next, a hole the client cannot see. The
        flow's measuring stops, once, and the failure is counted; a counter that fails too is
        lost with it."""

        class Broken:
            def chunk(self, n: int, now: float) -> None:
                raise MemoryError

        class BrokenQueue(MeasureQueue):
            def _schedule(self, now: float) -> None:
                raise MemoryError

        errors: list[str] = []
        queue = BrokenQueue() if where == "queue" else MeasureQueue()
        tap = ResponseTap(state(), queue, lambda w, exc: errors.append(w))
        tap.meter = meter()
        if where == "out":
            tap.out = Broken()  # type: ignore[assignment]
        assert [tap(CHUNK), tap(CHUNK), tap(b"")] == [CHUNK, CHUNK, b""]
        assert tap.bytes_out == 2 * len(CHUNK)
        assert tap.meter is None and tap.error == "MemoryError: " and errors == ["response_tap"]

        def failing_counter(w: str, exc: BaseException) -> None:
            raise RuntimeError("the counter broke too")

        tap = ResponseTap(state(), queue, failing_counter)
        tap.meter = meter()
        if where == "out":
            tap.out = Broken()  # type: ignore[assignment]
        assert tap(CHUNK) == CHUNK and tap.meter is None

    def test_unmeasured_taps_queue_nothing(self) -> None:
        """A tap without a meter (measuring failed or was never set up) only forwards."""
        queue = MeasureQueue()
        tap = ResponseTap(None, queue, lambda where, exc: None)
        assert tap(CHUNK) == CHUNK and queue.pending == []

    def test_measuring_packs_the_head_chunks_that_are_done_and_only_those(self) -> None:
        """Past PACK_AFTER_CHUNKS chunks on their way, measuring moves the ones at the head that
        were seen sent or given up on into the arrays; a head still on its way stops it."""
        tap = ResponseTap(state(), MeasureQueue(), lambda where, exc: None)
        tap.meter = meter()
        out = tap.out = FlowOut("HTTP/1.1")
        live = out.chunks.live
        live.extend(new_chunk(1, 100.0 + i) for i in range(PACK_AFTER_CHUNKS + 2))
        tap.measure(CHUNK, 101.0)
        assert len(live) == PACK_AFTER_CHUNKS + 2 and len(out.chunks) == len(live)
        live[0][SENT] = 101.0
        live[1][GONE] = "gone"
        live[3][SENT] = 101.0  # behind one still on its way: stays
        tap.measure(CHUNK, 102.0)
        assert len(live) == PACK_AFTER_CHUNKS and len(out.chunks) == PACK_AFTER_CHUNKS + 2
        tap.measure(CHUNK, 103.0)  # PACK_AFTER_CHUNKS on their way: not looked at
        assert len(live) == PACK_AFTER_CHUNKS


class TestMeasureQueue:
    def test_measuring_waits_for_the_loop_and_keeps_the_order(self) -> None:
        """With a loop running, chunks are measured together MEASURE_DELAY_S after the first,
        with the times the tap stamped from the queue's clock."""
        now = ManualClock(start_s=100.0)  # the flow started at 100 (state())

        async def run() -> None:
            queue = MeasureQueue(clock=now, timers=now)
            tap = ResponseTap(state(), queue, lambda where, exc: None)
            tap.meter = meter()
            tap(CHUNK)
            now.advance(MEASURE_DELAY_S / 2)
            tap(CHUNK)
            assert len(queue.pending) == 2 and queue.due == 100.0 + MEASURE_DELAY_S
            now.advance(MEASURE_DELAY_S / 4)
            assert tap.meter.events_seen == 0  # not due yet
            now.advance(queue.due - now())  # exact: the two are close (Sterbenz)
            assert tap.meter.events_seen == 2 and queue.pending == []
            assert list(tap.meter.events.t_s) == pytest.approx([0.0, MEASURE_DELAY_S / 2])

        asyncio.run(run())

    @given(
        due=st.floats(0.0, 10.0),
        late=st.floats(0.0, 0.02),
        wall=st.floats(0.0, 0.01),
        cpu=st.floats(0.0, 0.01),
        chunks=st.integers(0, 3),
    )
    def test_a_timed_batch_notes_what_loop_log_lag_and_step_note(
        self, due: float, late: float, wall: float, cpu: float, chunks: int
    ) -> None:
        """The timed measuring (LoopLog.lag, measure and LoopLog.step inlined) notes the same lag
        and step as those three called in turn, from the same clock readings, and measures the
        batch in order."""
        t0 = due + late

        class Clocks:
            """time.monotonic and time.thread_time: t0 then t0 + wall; cpu0 then + cpu."""

            def __init__(self) -> None:
                self.mono = [t0, t0 + wall]
                self.cpu = [5.0, 5.0 + cpu]

            def monotonic(self) -> float:
                return self.mono.pop(0)

            def thread_time(self) -> float:
                return self.cpu.pop(0)

        def general(log: LoopLog, queue: MeasureQueue, clocks: Clocks) -> None:
            t, c = clocks.monotonic(), clocks.thread_time()
            log.lag(t, t - queue.due)
            queue.measure()
            # LoopLog.step's reads, from the same clocks: the CPU only for a step that is kept
            took = clocks.monotonic() - t
            if took >= STEP_FLOOR_S:
                log.steps.append((t, took, min(clocks.thread_time() - c, took)))

        notes = []
        for inlined in (True, False):
            log = LoopLog()
            queue = MeasureQueue(log)
            measured: list[float] = []

            class Tap:
                """Stands in for a ResponseTap: notes the stamps it is asked to measure."""

                def measure(self, data: bytes, now: float, m: list[float] = measured) -> None:
                    m.append(now)

            tap: Any = Tap()
            queue.pending = [(tap, CHUNK, float(i)) for i in range(chunks)]
            queue.scheduled, queue.due = True, due
            clocks = Clocks()
            if inlined:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr("hopmeter.proxy.addon.tap.time", clocks)
                    queue.timed()
            else:
                general(log, queue, clocks)
            assert measured == [float(i) for i in range(chunks)]
            assert not queue.pending and not queue.scheduled and not clocks.mono
            # the thread's CPU clock (a system call) is read twice for a kept step, once else
            kept = (t0 + wall) - t0 >= STEP_FLOOR_S  # the wall time as the clocks give it
            assert len(clocks.cpu) == (0 if kept else 1)
            notes.append((list(log.lags), list(log.steps)))
        assert notes[0] == notes[1]


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


class TestFlowStart:
    def test_a_trace_goes_on_with_this_flow_s_span_as_parent(self) -> None:
        """An incoming trace keeps its id and flags; forwarded, its parent is this flow's span."""
        flow = tflow.tflow()
        flow.request.headers["traceparent"] = f"00-{'ab' * 16}-{'cd' * 8}-00"
        trace, own = start_trace(flow, forward=True)
        assert (trace.trace_id, trace.span_id, trace.created) == ("ab" * 16, "cd" * 8, False)
        assert flow.request.headers["traceparent"] == f"00-{'ab' * 16}-{own}-00"

    def test_a_request_without_a_trace_gets_one_made_up(self) -> None:
        """No traceparent: a new trace whose span is this flow's; not forwarded when off."""
        flow = tflow.tflow()
        trace, own = start_trace(flow, forward=False)
        assert trace.created and trace.span_id == own and len(trace.trace_id) == 32
        assert "traceparent" not in flow.request.headers

    def test_the_meter_is_for_the_api_the_request_and_headers_name(self) -> None:
        """A chat path with an event stream gets an OpenAI chat meter with its content type."""
        flow = tflow.tflow()
        flow.request.path = "/v1/chat/completions?x=1"
        m = new_meter(flow, {"content-type": "text/event-stream", "content-encoding": "gzip"})
        assert m.api == "openai.chat" and m.event_stream


class TestHeaderMap:
    @pytest.mark.parametrize(
        "fields",
        [
            [],
            [(b"Content-Type", b"text/event-stream"), (b"X-Accel-Buffering", b"no")],
            [(b"Vary", b"a"), (b"vary", b"b"), (b"VARY", b"c")],  # one name, three spellings
            [(b"A", b"1"), (b"B", b"2"), (b"a", b"3")],
            [(b"\xc3\x89tag", b"x"), (b"\xc3\xa9tag", b"y")],  # bytes differ; lower-cased alike
            [(b"x-\xff", b"\xfe\xfd"), (b"X-\xff", b"ok")],  # not UTF-8: surrogate escapes
        ],
    )
    def test_the_same_map_as_reading_mitmproxy_s_items(
        self, fields: list[tuple[bytes, bytes]]
    ) -> None:
        """header_map is lower_headers over mitmproxy's Headers, field for field and in order."""
        headers = Headers(fields)
        expected = lower_headers(headers)
        got = header_map(headers)
        assert got == expected and list(got) == list(expected)

    @given(
        st.lists(
            st.tuples(
                st.lists(
                    st.sampled_from([b"a", b"A", b"-", b"\xc3\x89", b"\xc3\xa9", b"\xff"])
                ).map(b"x".join),
                st.binary(max_size=4),
            ),
            max_size=8,
        )
    )
    def test_any_fields_give_the_same_map(self, fields: list[tuple[bytes, bytes]]) -> None:
        """For any fields (names alike but for case or bytes, values of any bytes), header_map
        and lower_headers over mitmproxy's Headers agree, in order."""
        headers = Headers(fields)
        expected = lower_headers(headers)
        got = header_map(headers)
        assert got == expected and list(got) == list(expected)
