"""Tests for hopmeter.proxy.delivery.lane: flows followed to a real loopback client, the poller, the
record's wait for the last bytes, and the log of hopmeter's own steps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from hopmeter.core.ledger import FLAG_SENT
from hopmeter.proxy.delivery.conn import POLL_IDLE_MAX_S
from hopmeter.proxy.delivery.lane import STEP_FLOOR_S, WAIT_MAX_S, DeliveryLane, FlowOut, LoopLog
from hopmeter.testing import ManualClock
from tests.harness.live_client import flow_of, live_client, run, unread


def delivery(errors: list[str] | None = None) -> DeliveryLane:
    """A DeliveryLane whose internal errors are collected."""
    seen = errors if errors is not None else []
    return DeliveryLane(lambda where, exc: seen.append(where))


@pytest.mark.loopback  # mitmproxy's connection handler around a real socket
class TestAttach:
    def test_a_live_flow_is_followed_and_its_chunks_armed(self) -> None:
        """attach finds the client's transport; a chunk handed in is the next write's."""

        async def test() -> None:
            async with live_client() as live:
                d = delivery()
                out = d.attach(flow_of(live), chaos=False)
                assert out.reason is None and out.conn is not None and out.sid is None
                out.chunk(5, time.monotonic())
                live.writer.write(b"5\r\nhello\r\n")
                (c,) = out.chunks.live
                assert c[3] is not None  # written
                assert unread(live.peer) == b"5\r\nhello\r\n"

        run(test)

    def test_chaos_and_unknown_clients_are_not_followed_and_say_why(self) -> None:
        """Re-cut responses and clients without a live handler get a reason and no tracker."""

        async def test() -> None:
            async with live_client() as live:
                d = delivery()
                chaotic = d.attach(flow_of(live), chaos=True)
                assert chaotic.conn is None and "chaos" in (chaotic.reason or "")
                live.proxyserver.connections.clear()
                lost = d.attach(flow_of(live), chaos=False)
                assert lost.conn is None and lost.reason
                lost.chunk(5, time.monotonic())  # forwarding goes on: nothing to follow
                assert not lost.chunks.live

        run(test)

    def test_flows_on_one_connection_share_its_tracker(self) -> None:
        """Keep-alive: the second flow on a connection is counted by the same tracker."""

        async def test() -> None:
            async with live_client() as live:
                d = delivery()
                first = d.attach(flow_of(live), chaos=False)
                second = d.attach(flow_of(live), chaos=False)
                assert first.conn is second.conn and len(d.trackers) == 1

        run(test)


@pytest.mark.loopback  # mitmproxy's connection handler around a real socket
class TestPoller:
    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test_every_tick_of_the_poller_looks_at_a_connection(self, loop: str) -> None:
        """A client that keeps up, a chunk every 3 ms for 0.4 s: the poller's timer fires only
        to look. uvloop's timers keep whole milliseconds and can fire before the look is due on
        the monotonic clock; the look is taken then, not re-armed for what is left (a tick, and
        often a wake-up of the loop, that looks at nothing)."""

        async def test() -> None:
            async with live_client() as live:
                d = delivery()
                out = d.attach(flow_of(live), chaos=False)
                tracker = out.conn
                assert tracker is not None
                ticks, looks = [0], [0]
                tick, poll = d._tick, tracker.poll

                def counted_tick() -> None:
                    ticks[0] += 1
                    tick()

                def counted_poll(now: float) -> bool:
                    looks[0] += 1
                    return poll(now)

                d._tick = counted_tick  # type: ignore[method-assign]
                tracker.poll = counted_poll  # type: ignore[method-assign]
                end = time.monotonic() + 0.4
                while time.monotonic() < end:
                    out.chunk(5, time.monotonic())
                    live.writer.write(b"hello")
                    unread(live.peer)
                    await asyncio.sleep(0.003)
                await asyncio.sleep(2 * POLL_IDLE_MAX_S)  # the last look
                assert looks[0] >= 0.4 / POLL_IDLE_MAX_S and ticks[0] == looks[0]

        run(test, loop)


@pytest.mark.loopback  # mitmproxy's connection handler around a real socket
class TestFinish:
    def test_the_record_waits_until_the_client_has_the_last_bytes(self) -> None:
        """A flow ends with bytes the client has not taken: its callback runs once they are sent."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                d = delivery()
                out = d.attach(flow_of(live), chaos=False)
                out.chunk(256 * 1024, time.monotonic())
                live.writer.write(b"z" * (256 * 1024))
                done: list[float] = []
                d.finish(out, lambda: done.append(time.monotonic()))
                await asyncio.sleep(0.05)
                assert not done  # nobody read: still waiting
                got = 0
                while not done:
                    got += len(unread(live.peer))
                    await asyncio.sleep(0.001)
                assert got + len(unread(live.peer)) == 256 * 1024
                assert out.chunks.done() and out.queued_max > 0
                seen = out.seen(out.mono_start, 0.0, d.log)
                assert seen.measured and seen.queued_bytes_max == out.queued_max

        run(test)

    def test_a_client_that_stops_reading_is_waited_for_at_most_wait_max_s(self) -> None:
        """A flow whose client reads nothing gets its record at the poller's first look past
        WAIT_MAX_S after it ended (on the poller's clock)."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                now = ManualClock()
                d = DeliveryLane(lambda where, exc: None, clock=now, timers=now)
                out = d.attach(flow_of(live), chaos=False)
                out.chunk(256 * 1024, now())
                live.writer.write(b"z" * (256 * 1024))
                done: list[float] = []
                d.finish(out, lambda: done.append(now()))
                now.advance(WAIT_MAX_S - 0.5)  # the poller looks, the bytes stay queued
                await asyncio.sleep(0)
                assert not done and now.pending() == 1
                now.advance(0.5 + POLL_IDLE_MAX_S)  # the first look past the deadline
                await asyncio.sleep(0)
                assert len(done) == 1 and out.done

        run(test)

    def test_a_look_that_fails_is_counted_and_the_looks_go_on(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fault in a look of the poller is counted and the timer armed again: the ended
        flows it follows still get their records (a tick that died would hold them all)."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                now = ManualClock()
                errors: list[str] = []
                d = DeliveryLane(lambda where, exc: errors.append(where), clock=now, timers=now)
                out = d.attach(flow_of(live), chaos=False)
                out.chunk(256 * 1024, now())
                live.writer.write(b"z" * (256 * 1024))
                done: list[float] = []
                d.finish(out, lambda: done.append(now()))
                look, failed = d._look, [False]

                def once_broken(armed_at: float) -> None:
                    if not failed[0]:
                        failed[0] = True
                        raise RuntimeError("poller bug")
                    look(armed_at)

                monkeypatch.setattr(d, "_look", once_broken)
                now.advance(POLL_IDLE_MAX_S)
                await asyncio.sleep(0)
                assert errors == ["delivery"] and now.pending() == 1  # armed again
                now.advance(WAIT_MAX_S + POLL_IDLE_MAX_S)
                await asyncio.sleep(0)
                assert len(done) == 1 and out.done

        run(test)

    def test_a_client_that_disconnects_ends_the_wait_with_what_was_seen(self) -> None:
        """forget: the flow is completed at once, its last bytes not seen sent."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                d = delivery()
                flow = flow_of(live)
                out = d.attach(flow, chaos=False)
                out.chunk(256 * 1024, time.monotonic())
                live.writer.write(b"z" * (256 * 1024))
                done: list[bool] = []
                d.finish(out, lambda: done.append(True))
                d.forget(flow.client_conn.id)
                await asyncio.sleep(0)
                assert done == [True] and not d.trackers
                assert out.chunks.done() and not out.chunks.flags[0] & FLAG_SENT
                assert out.chunks.why == "the connection closed with bytes still queued"

        run(test)

    def test_shutdown_writes_every_waiting_flow_at_once(self) -> None:
        """When the proxy stops, waiting flows are completed in the same call."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                d = delivery()
                out = d.attach(flow_of(live), chaos=False)
                out.chunk(256 * 1024, time.monotonic())
                live.writer.write(b"z" * (256 * 1024))
                done: list[bool] = []
                d.finish(out, lambda: done.append(True))
                d.drain()
                assert done == [True]

        run(test)

    def test_a_flow_not_followed_completes_on_the_next_turn(self) -> None:
        """Nothing to wait for: the callback runs soon after finish returns, not inside it."""

        async def test() -> None:
            async with live_client() as live:
                d = delivery()
                out = d.attach(flow_of(live), chaos=True)
                done: list[bool] = []
                d.finish(out, lambda: done.append(True))
                assert done == []
                await asyncio.sleep(0)
                assert done == [True]

        run(test)


class TestTake:
    """DeliveryLane as the first wait of a flow's end (hopmeter.proxy.addon.ending)."""

    class End:
        """An item of a flow's end: what the wait reads of it."""

        def __init__(self, out: FlowOut | None) -> None:
            self.out = out

    @pytest.mark.loopback  # a real loopback client
    def test_an_item_goes_on_once_its_bytes_reached_the_client(self) -> None:
        """A followed flow's item is handed on once the kernel sent its last chunk, never
        inside take."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                d = delivery()
                end = self.End(d.attach(flow_of(live), chaos=False))
                assert end.out is not None
                end.out.chunk(256 * 1024, time.monotonic())
                live.writer.write(b"z" * (256 * 1024))
                passed: list[object] = []
                d.take(end, passed.append)
                assert passed == []
                unread(live.peer)  # the client reads: the bytes leave the kernel
                deadline = time.monotonic() + 10
                while not passed and time.monotonic() < deadline:
                    unread(live.peer)
                    await asyncio.sleep(0.005)
                assert passed == [end]

        run(test)

    def test_an_item_without_bytes_to_follow_goes_on_at_the_next_turn(self) -> None:
        """Nothing followed: the item goes on soon after take returns (at once with no loop)."""
        passed: list[object] = []
        d = delivery()
        d.take(self.End(None), passed.append)
        assert len(passed) == 1  # no loop running here

        async def test() -> None:
            d.take(self.End(None), passed.append)
            assert len(passed) == 1
            await asyncio.sleep(0)
            assert len(passed) == 2

        asyncio.run(test())

    def test_a_failing_wait_counts_and_lets_the_item_on(self) -> None:
        """finish failing is counted as a delivery error; the item still goes on, once."""
        errors: list[str] = []
        d = delivery(errors)
        end = self.End(FlowOut("HTTP/1.1"))

        def broken(out: FlowOut, callback: Callable[[], None]) -> None:
            raise RuntimeError("bug")

        d.finish = broken  # type: ignore[method-assign]
        passed: list[object] = []
        d.take(end, passed.append)
        assert errors == ["delivery"] and passed == [end]


class TestLoopLog:
    def test_a_slow_step_is_kept_with_its_wall_and_cpu_time(self) -> None:
        """A step past the floor is kept with its wall and CPU time, on the real clocks (a quick
        one is dropped: the next test, on a clock it sets, since a busy machine can stretch any
        real step past the floor)."""
        log = LoopLog()
        t0, cpu0 = time.monotonic(), time.thread_time()
        while time.monotonic() < t0 + 2 * STEP_FLOOR_S:  # the slow step: busy on purpose
            pass
        log.step(t0, cpu0)
        ((start, wall, cpu),) = log.steps
        assert start == t0 and wall >= 2 * STEP_FLOOR_S and 0 < cpu <= wall + 0.001

    def test_the_cpu_clock_is_read_again_only_for_a_step_that_is_kept(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """time.thread_time is a system call: a quick step's end does not read it, a kept one's
        does (its CPU is the CPU it used, never a figure made up)."""
        reads: list[float] = []
        now = [100.0]  # the wall clock the log reads: set here, so a busy machine moves nothing

        class Clocks:
            """A wall clock the test sets; the thread's real CPU clock, its reads noted."""

            @staticmethod
            def monotonic() -> float:
                return now[0]

            @staticmethod
            def thread_time() -> float:
                reads.append(time.thread_time())
                return reads[-1]

        monkeypatch.setattr("hopmeter.proxy.delivery.lane.time", Clocks)
        log = LoopLog()
        log.step(now[0], time.thread_time())  # a quick step: it ends as it starts
        assert not log.steps and reads == []
        t0, cpu0 = now[0], time.thread_time()
        while time.thread_time() < cpu0 + 0.001:  # the slow step uses CPU, busy on purpose
            pass
        now[0] = t0 + 2 * STEP_FLOOR_S
        log.step(t0, cpu0)
        ((_, wall, cpu),) = log.steps
        assert len(reads) == 1 and cpu == min(reads[0] - cpu0, wall) and cpu > 0

    def test_a_flow_reads_the_steps_and_lags_that_overlapped_it(self) -> None:
        """window keeps what overlapped [from, to] and leaves the rest."""
        log = LoopLog()
        log.steps.extend([(1.0, 0.01, 0.01), (2.0, 0.05, 0.05), (9.0, 0.01, 0.0)])
        log.lag(2.05, 0.04)
        log.lag(2.5, 0.001)  # under the floor: not kept
        steps, lags = log.window(1.5, 3.0)
        assert steps == [(2.0, 0.05, 0.05)] and lags == [(2.05, 0.04)]
