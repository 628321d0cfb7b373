"""Tests for hopmeter.proxy.addon.aside: a long flow's record built beside the loop, on a worker
thread, handed back in order; everything else built at once, as before."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from mitmproxy.test import taddons

from hopmeter.proxy.addon import ending
from hopmeter.proxy.addon.aside import Aside
from hopmeter.proxy.addon.meter import HopMeter
from tests.proxy.addon.test_meter import DONE, SSE, Recorder, sse_flow, stream_through

WAIT_S = 10.0  # a bound on waits that should end at once: a test fails rather than hangs


class Calls:
    """What an Aside did: the items handed on (with the thread that did so) and the failures."""

    def __init__(self) -> None:
        self.handed: list[tuple[Any, int]] = []
        self.failures: list[BaseException] = []
        self.workers: list[int] = []  # the threads `fn` ran on

    def then(self, result: Any) -> None:
        self.handed.append((result, threading.get_ident()))

    def failed(self, exc: BaseException) -> None:
        self.failures.append(exc)


def aside_of(calls: Calls, fn: Callable[[Any], Any], **kwargs: Any) -> Aside:
    def work(item: Any) -> Any:
        calls.workers.append(threading.get_ident())
        return fn(item)

    return Aside(work, big=lambda item: item != "small", failed=calls.failed, **kwargs)


async def settled(aside: Aside) -> None:
    """Until the worker's results are all handed on (a bounded wait)."""
    async with asyncio.timeout(WAIT_S):
        while aside.waiting:
            await asyncio.sleep(0.001)


def test_a_big_item_is_done_beside_the_loop_which_goes_on_meanwhile() -> None:
    """The work runs on another thread while the loop runs its callbacks: the work here waits
    for a callback the loop runs after `take` returned (on the loop's thread it never could),
    and its result comes back on the loop's thread."""
    calls = Calls()
    loop_ran = threading.Event()

    def work(item: str) -> str:
        return item.upper() if loop_ran.wait(WAIT_S) else "the loop waited for the work"

    aside = aside_of(calls, work)

    async def go() -> None:
        aside.take("big", calls.then)
        assert calls.handed == []  # not done here
        asyncio.get_running_loop().call_soon(loop_ran.set)
        await settled(aside)

    asyncio.run(go())
    assert calls.handed == [("BIG", threading.get_ident())]
    assert calls.workers != [threading.get_ident()]
    assert aside.aside == 1 and calls.failures == []


def test_results_are_handed_on_in_the_order_the_items_came() -> None:
    """Several flows' records, whatever each takes, come back in the order they were taken."""
    calls = Calls()
    aside = aside_of(calls, lambda item: item)

    async def go() -> None:
        for i in range(10):
            aside.take(f"flow {i}", calls.then)
        await settled(aside)

    asyncio.run(go())
    assert [r for r, _ in calls.handed] == [f"flow {i}" for i in range(10)]


def test_a_small_item_and_any_item_without_a_loop_are_done_at_once() -> None:
    """A short flow's record is built in `take`, on the calling thread, as before; so is every
    record with no running loop (offline tools, tests)."""
    calls = Calls()
    aside = aside_of(calls, lambda item: item)

    async def go() -> None:
        aside.take("small", calls.then)
        assert [r for r, _ in calls.handed] == ["small"]

    asyncio.run(go())
    aside.take("big, no loop", calls.then)
    assert [r for r, _ in calls.handed] == ["small", "big, no loop"]
    assert calls.workers == [threading.get_ident()] * 2 and aside.aside == 0


def test_past_the_bound_of_waiting_flows_the_work_is_done_at_once() -> None:
    """At most `max_waiting` flows wait for the worker: the next is built on the loop."""
    calls = Calls()
    release = threading.Event()
    aside = aside_of(calls, lambda item: item if release.wait(WAIT_S) else "timed out")
    aside.max_waiting = 2

    async def go() -> None:
        aside.take("first", calls.then)
        aside.take("second", calls.then)
        release.set()  # the third is done here, at once: it must not wait for the worker
        aside.take("third", calls.then)
        assert [r for r, _ in calls.handed] == ["third"]
        await settled(aside)

    asyncio.run(go())
    assert [r for r, _ in calls.handed] == ["third", "first", "second"]
    assert aside.aside == 2


def test_a_failure_is_counted_on_the_loop_and_the_worker_goes_on() -> None:
    """A record that cannot be built is counted (the flow stops there); the next is built."""
    calls = Calls()

    def work(item: str) -> str:
        if item == "bad":
            raise ValueError("no record")
        return item

    aside = aside_of(calls, work)

    async def go() -> None:
        for item in ("bad", "good"):
            aside.take(item, calls.then)
        await settled(aside)

    asyncio.run(go())
    assert [str(e) for e in calls.failures] == ["no record"]
    assert [r for r, _ in calls.handed] == ["good"]


def test_the_drain_waits_for_the_worker_and_hands_everything_on_in_order() -> None:
    """When the proxy stops, `drain` hands on every record the worker had, in order, at once."""
    calls = Calls()
    release = threading.Event()
    aside = aside_of(calls, lambda item: item if release.wait(WAIT_S) else "timed out")

    async def go() -> None:
        aside.take("first", calls.then)
        aside.take("second", calls.then)
        release.set()
        aside.drain()
        assert [r for r, _ in calls.handed] == ["first", "second"]

    asyncio.run(go())
    assert aside.waiting == 0


# events whose record takes longer than the switch interval, the most the worker may hold the loop
LONG = round(sys.getswitchinterval() / ending.RECORD_S_PER_EVENT) + 10


@pytest.mark.parametrize("loop", [False, True], ids=["no loop", "running loop"])
def test_a_long_flow_s_record_is_the_same_built_beside_the_loop(loop: bool) -> None:
    """A flow whose record would take longer than the interpreter's switch interval: built on
    the worker when a loop runs, it says what the one built at once says."""
    hm = HopMeter()
    rec = Recorder()
    hm.add_observer(rec)
    chunks = [SSE] * LONG + [DONE]

    async def in_loop() -> None:
        stream_through(hm, sse_flow(), chunks)
        async with asyncio.timeout(WAIT_S):
            while not rec.results:
                await asyncio.sleep(0.001)

    with taddons.context(hm) as tctx:
        tctx.configure(hm, hopmeter_hop="edge")
        if loop:
            asyncio.run(in_loop())
            tctx.master._legacy_log_events.uninstall()  # its loop closes with asyncio.run's
        else:
            stream_through(hm, sse_flow(), chunks)
    (result,) = rec.results
    assert hm.ending.aside.aside == (1 if loop else 0)
    assert result.record["figures"]["events"] == LONG + 1
    assert result.tokens is not None and sum(result.tokens.per_event) == LONG
