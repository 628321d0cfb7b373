"""Tests for hopmeter.proxy.run.drain, in process; the real drain (three streams finishing, a new
connection refused, a second signal) is in tests/integration/test_sidecar.py."""

from __future__ import annotations

import asyncio

import pytest
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.test import taddons, tflow

from hopmeter.export.outlets import Outlets
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.run.drain import POLL_S, Drain
from hopmeter.testing import ManualClock


async def advance(clock: ManualClock, seconds: float) -> None:
    """Move `clock` on by `seconds` a poll at a time, with a loop turn after each, so that the
    drain's task wakes from each of its waits and schedules the next."""
    start = clock()
    for step in range(1, round(seconds / POLL_S) + 1):
        clock.advance(start + step * POLL_S - clock())  # no sum of rounding errors
        await asyncio.sleep(0)


def test_responses_during_the_drain_close_their_http1_connection() -> None:
    """While draining, an HTTP/1 response gets Connection: close; an HTTP/2 one, a 101 and any
    response before the drain keep their headers."""
    drain = Drain(HopMeter())
    before = tflow.tflow(resp=True)
    drain.responseheaders(before)
    assert "connection" not in before.response.headers  # type: ignore[union-attr]
    drain.draining = True
    plain, h2, upgrade = (tflow.tflow(resp=True) for _ in range(3))
    h2.request.http_version = "HTTP/2.0"
    upgrade.response.status_code = 101  # type: ignore[union-attr]
    upgrade.response.headers["connection"] = "Upgrade"  # type: ignore[union-attr]
    for flow in (plain, h2, upgrade):
        drain.responseheaders(flow)
    assert plain.response.headers["connection"] == "close"  # type: ignore[union-attr]
    assert "connection" not in h2.response.headers  # type: ignore[union-attr]
    assert upgrade.response.headers["connection"] == "Upgrade"  # type: ignore[union-attr]


def test_with_nothing_in_flight_the_drain_stops_at_once() -> None:
    """The first signal marks the proxy not ready, stops its listeners (`server` off) and, with
    no flow in flight, shuts the master down without waiting for the timeout."""

    async def main() -> None:
        meter, readiness = HopMeter(), Readiness()
        drain = Drain(meter, readiness)
        with taddons.context(meter, drain, Proxyserver()) as tctx:
            assert drain.timeout_s == 20.0  # the default: Kubernetes' grace period, less margins
            drain.signal()
            assert drain.draining and readiness.draining
            assert drain.task is not None
            await asyncio.wait_for(drain.task, 5)
            assert tctx.options.server is False
            await asyncio.wait_for(tctx.master.should_exit.wait(), 5)

    asyncio.run(main())


def test_a_second_signal_stops_without_waiting() -> None:
    """With a flow in flight the drain waits; a second signal shuts the master down now."""

    async def main() -> None:
        meter, now = HopMeter(), ManualClock()
        drain = Drain(meter, clock=now, timers=now)
        with taddons.context(meter, drain, Proxyserver()) as tctx:
            tctx.configure(meter, hopmeter_hop="edge")
            flow = tflow.tflow()
            meter.requestheaders(flow)
            drain.signal()
            await advance(now, 10)  # half the default timeout
            assert not tctx.master.should_exit.is_set()  # still waiting for the flow
            drain.signal()
            await asyncio.wait_for(tctx.master.should_exit.wait(), 5)
            assert drain.task is not None
            drain.task.cancel()

    asyncio.run(main())


def test_the_drain_stops_at_its_timeout() -> None:
    """With a flow in flight the master is stopped at the drain timeout, not a poll before."""

    async def main() -> None:
        meter, now = HopMeter(), ManualClock()
        drain = Drain(meter, clock=now, timers=now)
        with taddons.context(meter, drain, Proxyserver()) as tctx:
            tctx.configure(drain, hopmeter_drain_timeout="1")
            tctx.configure(meter, hopmeter_hop="edge")
            meter.requestheaders(tflow.tflow())
            drain.signal()
            await advance(now, 1 - POLL_S)
            assert not tctx.master.should_exit.is_set()
            await advance(now, POLL_S)
            await asyncio.wait_for(tctx.master.should_exit.wait(), 5)
            assert drain.in_flight() == 1  # ended as shutdown by the master's stop

    asyncio.run(main())


def test_the_drain_stops_at_the_first_look_after_the_flows_end() -> None:
    """When the flows in flight end before the timeout, the master stops at the next look."""

    async def main() -> None:
        meter, now = HopMeter(), ManualClock()
        drain = Drain(meter, clock=now, timers=now)
        with taddons.context(meter, drain, Proxyserver()) as tctx:
            tctx.configure(meter, hopmeter_hop="edge")
            flow = tflow.tflow()
            meter.requestheaders(flow)
            drain.signal()
            await advance(now, 3)
            assert not tctx.master.should_exit.is_set()
            meter.live.clear()  # the flow ended
            await advance(now, POLL_S)
            await asyncio.wait_for(tctx.master.should_exit.wait(), 5)

    asyncio.run(main())


def test_the_outputs_flush_by_the_drains_deadline_and_at_once_on_a_second_signal() -> None:
    """The drain hands its deadline (start + timeout) to the outputs, which write what they hold
    until then; a second signal moves it to now (the outputs' floor still applies)."""

    async def main() -> None:
        meter, outlets, now = HopMeter(), Outlets(), ManualClock()
        drain = Drain(meter, outlets=outlets, clock=now, timers=now)
        with taddons.context(meter, drain, Proxyserver()) as tctx:
            tctx.configure(drain, hopmeter_drain_timeout="7")
            tctx.configure(meter, hopmeter_hop="edge")
            meter.requestheaders(tflow.tflow())  # in flight: the drain waits
            started = now()
            drain.signal()
            await asyncio.sleep(0)
            assert outlets.flush_by == started + 7
            await advance(now, 2)
            drain.signal()
            assert outlets.flush_by == now() == pytest.approx(started + 2)
            assert drain.task is not None
            drain.task.cancel()

    asyncio.run(main())


def test_an_open_websocket_is_waited_for_like_a_flow() -> None:
    """A WebSocket's connection counts as in flight from its start to its end (its HTTP flow
    ended with the 101), so the drain neither closes it as idle nor stops before it ends."""
    drain = Drain(HopMeter())
    flow = tflow.twebsocketflow()
    drain.websocket_start(flow)
    assert drain.in_flight() == 1
    drain.websocket_end(flow)
    assert drain.in_flight() == 0
