"""Tests for hopmeter.proxy.addon.ending: a flow's end as one chain of waits, in process
(mitmproxy's test context and flows, no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mitmproxy import http
from mitmproxy.test import taddons

from hopmeter.core.record import FlowResult
from hopmeter.proxy.addon.browser_meter import BrowserMeter
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.tokenizers import _load
from hopmeter.proxy.delivery import lane
from hopmeter.testing import ManualClock
from tests.proxy.addon.test_meter import DONE, SSE, Recorder, sse_flow, stream_through

TRACE = "ab" * 16


@pytest.fixture
def meter() -> Iterator[HopMeter]:
    """A HopMeter in mitmproxy's test context, with an observer that keeps what it gets."""
    hm = HopMeter()
    with taddons.context(hm) as tctx:
        tctx.configure(hm, hopmeter_hop="edge")
        yield hm


class Holding:
    """A wait that holds every item until drained, and says what it was asked to do."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.held: list[tuple[Any, Callable[[Any], None]]] = []

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        self.calls.append("take")
        self.held.append((item, then))

    def drain(self) -> None:
        self.calls.append("drain")
        held, self.held = self.held, []
        for item, then in held:
            then(item)


def test_the_chain_reads_as_a_flow_ends() -> None:
    """The links, in order: the bytes reach the client, what was seen is taken, the vocabulary
    is there, the record is measured and written, listeners, pairing, beacon, observers."""
    names = [link.name for link in HopMeter().ending.chain]
    assert names == [
        "delivery",
        "seen",
        "tokenizer",
        "measure",
        "listeners",
        "pairing",
        "beacon",
        "observers",
    ]


def test_listeners_get_the_flow_before_the_observers_get_its_record(meter: HopMeter) -> None:
    """A flow's listener is called with the flow and its result, then the observers get it."""
    said: list[str] = []
    rec = Recorder()
    meter.add_observer(rec)
    rec.observe = lambda result: said.append("observed")  # type: ignore[method-assign]
    flow = sse_flow()

    def listener(f: http.HTTPFlow, result: FlowResult) -> None:
        assert f is flow and result.record["flow_id"] == flow.id
        said.append("listened")

    meter.ending.add_listener(listener)
    stream_through(meter, flow, [SSE, DONE])
    assert said == ["listened", "observed"]
    meter.ending.remove_listener(listener)
    stream_through(meter, sse_flow(), [SSE, DONE])
    assert said == ["listened", "observed", "observed"]


def test_a_wait_that_holds_keeps_the_rest_waiting_until_it_lets_go(meter: HopMeter) -> None:
    """A record held by a wait reaches no observer until that wait hands it on: at the drain
    when the proxy stops."""
    calls: list[str] = []
    meter.ending.beacons = Holding(calls)
    rec = Recorder()
    meter.add_observer(rec)
    stream_through(meter, sse_flow(), [SSE, DONE])
    assert calls == ["take"] and rec.results == []
    meter.done()
    assert calls == ["take", "drain"] and len(rec.results) == 1


def test_the_drain_goes_in_the_chain_s_order() -> None:
    """A record still waiting for the vocabulary when the proxy stops is let through first,
    then held for its beacon and written without it: no wait drains before the ones above it."""
    _load.cache_clear()
    now = ManualClock()  # never advanced: no timer of the flow's end may be needed
    meter = HopMeter(clock=now, timers=now)
    browser = BrowserMeter(meter.ending, clock=now, timers=now)
    rec = Recorder()

    async def go() -> None:
        with taddons.context(meter, browser) as tctx:
            tctx.configure(meter, hopmeter_hop="edge", hopmeter_lazy_tokenizer=True)
            tctx.configure(browser, hopmeter_browser=True)
            meter.add_observer(rec)
            flow = sse_flow()
            flow.request.headers["traceparent"] = f"00-{TRACE}-{'cd' * 8}-01"
            flow.request.headers["tracestate"] = "hopmeter=beacon"
            flow.request.headers["origin"] = "http://page.example"
            meter.requestheaders(flow)  # starts the load, which waits for a quiet moment
            load = meter.vocabulary.load
            assert load is not None
            load.quiet = lambda: False  # never quiet: the load waits for the drain
            browser.requestheaders(flow)
            meter.responseheaders(flow)
            for chunk in (SSE, DONE, b""):
                flow.response.stream(chunk)  # type: ignore[union-attr, operator]
            meter.response(flow)
            assert load.parked == 0  # the flow's end measures what its tap queued itself
            await asyncio.sleep(0)  # the client wait hands the record on, on the next turn
            assert load.parked == 1
            assert rec.results == []
            meter.done()
            tctx.master._legacy_log_events.uninstall()  # its loop closes with asyncio.run's

    asyncio.run(go())
    _load.cache_clear()
    (result,) = rec.results
    assert result.record["browser"] == {
        "joined": False,
        "reason": "hopmeter stopped before the beacon came",
    }


def test_a_fault_before_the_record_exists_stops_the_flow_and_is_counted(
    meter: HopMeter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measuring that raises is counted where it failed; that flow gets no record, the next one
    does."""
    rec = Recorder()
    meter.add_observer(rec)
    counters = meter.vocabulary.counters
    assert counters is not None

    def broken(model: str | None) -> None:
        raise RuntimeError("tokenizer bug")

    monkeypatch.setattr(counters, "for_model", broken)
    stream_through(meter, sse_flow(), [SSE, DONE])
    assert rec.results == [] and "error:finish" in rec.notices
    monkeypatch.undo()
    stream_through(meter, sse_flow(), [SSE, DONE])
    assert len(rec.results) == 1


def test_a_fault_in_a_hold_lets_the_record_through(
    meter: HopMeter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold after the record exists that raises is counted, and the record is written once,
    without what that hold would have added."""
    rec = Recorder()
    meter.add_observer(rec)

    def broken(result: FlowResult) -> list[FlowResult]:
        raise RuntimeError("pairing bug")

    monkeypatch.setattr(meter.pairing, "finish", broken)
    stream_through(meter, sse_flow(), [SSE, DONE])
    assert len(rec.results) == 1 and rec.notices.count("error:pairing") == 1


def test_a_result_made_elsewhere_goes_on_from_a_named_link(meter: HopMeter) -> None:
    """take_at hands a result to the chain at a link: from "beacon" on, only the observers."""
    rec = Recorder()
    meter.add_observer(rec)
    result = FlowResult(record={"flow_id": "x", "trace_id": TRACE}, figures=None, tokens=None)
    meter.ending.take_at("beacon", result)
    assert rec.results == [result]


def test_a_step_inside_a_step_is_timed_once(
    meter: HopMeter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hopmeter's own steps on the loop are logged once each: a step that runs inside another
    (a wait handing on at once) is part of that one."""
    monkeypatch.setattr(lane, "STEP_FLOOR_S", 0.0)  # keep every step, however short
    log = meter.ending.log
    meter.ending.timed(lambda: meter.ending.timed(lambda: None))
    assert len(log.steps) == 1
    stream_through(meter, sse_flow(), [SSE, DONE])  # no loop: the end's steps run as one
    assert len(log.steps) == 2


def test_a_finished_flows_taps_let_go_of_its_state() -> None:
    """mitmproxy keeps a finished flow, and the callables on it, as long as it keeps the flow
    (an HTTP/2 connection: every request until it closes). Once its record is taken, the taps
    hold none of hopmeter's per-flow state; called again they hand bytes on, nothing counted."""
    meter = HopMeter()
    with taddons.context(meter) as tctx:
        tctx.configure(meter, hopmeter_hop="edge", hopmeter_stream="all")  # as `hopmeter run`
        _finish_and_forget(meter)


def _finish_and_forget(meter: HopMeter) -> None:
    rec = Recorder()
    meter.add_observer(rec)
    flow = sse_flow()
    meter.requestheaders(flow)
    request_tap = flow.request.stream
    assert callable(request_tap) and request_tap(b'{"model": "m"}') == b'{"model": "m"}'
    assert request_tap(b"") == b""
    meter.responseheaders(flow)
    tap = flow.response.stream
    assert callable(tap) and [tap(c) for c in (SSE, DONE, b"")] == [SSE, DONE, b""]
    meter.response(flow)
    assert len(rec.results) == 1 and rec.results[0].record["request"]["bytes"] == 14
    assert (tap.state, tap.meter, tap.out, tap.chaos) == (None, None, None, None)
    assert request_tap.state is None
    assert tap(SSE) == SSE and request_tap(b"x") == b"x"
    assert meter.observers.internal_errors == 0
