"""Tests for hopmeter.proxy.addon.tokenizer_load: the vocabulary loaded at the first flow, in a
thread; records of flows that end before it is ready built later, in order, unchanged."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mitmproxy.test import taddons

from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.tokenizer_load import TokenizerLoad, Vocabulary
from hopmeter.proxy.addon.tokenizers import Counters, _load
from tests.harness import procs
from tests.proxy.addon.test_meter import DONE, SSE, Recorder, sse_flow, stream_through

WAIT_S = 30.0  # a bound on waiting for the vocabulary (it loads in ~1 s)


@pytest.fixture(autouse=True)
def unloaded() -> Iterator[None]:
    """Each test starts with no vocabulary loaded in this process (they are cached)."""
    _load.cache_clear()
    yield
    _load.cache_clear()


async def until(condition: Callable[[], Any]) -> None:
    """Let the loop run until `condition()` holds (polled), at most WAIT_S."""
    await procs.until(condition, WAIT_S)


def test_items_wait_for_the_load_and_then_go_on_in_order_on_the_loop() -> None:
    """Items taken before the vocabulary is ready are handed on once it is, oldest first, on
    the loop's thread, one per turn; after that an item is handed on at once."""
    ran: list[tuple[str, str]] = []
    errors: list[object] = []

    def note(name: str) -> None:
        ran.append((name, threading.current_thread().name))

    async def go() -> None:
        quiet = threading.Event()  # the loading thread builds the encoder only once it is set
        load = TokenizerLoad(Counters(None), quiet.is_set, lambda *e: errors.append(e))
        load.start()
        load.take("a", note)
        load.take("b", note)
        await asyncio.sleep(0)
        assert ran == [] and load.parked == 2 and not load.ready
        quiet.set()
        await until(lambda: len(ran) == 2)
        load.take("c", note)
        assert load.ready and load.parked == 0

    asyncio.run(go())
    main = threading.current_thread().name
    assert ran == [("a", main), ("b", main), ("c", main)]
    assert errors == []


def test_stopping_waits_for_the_load_and_runs_what_waits() -> None:
    """drain() (the proxy stopping) builds at once, without waiting for a quiet loop, and hands
    on every waiting item before it returns."""
    ran: list[str] = []

    async def go() -> None:
        load = TokenizerLoad(Counters(None), lambda: False, lambda *e: None)
        load.take("a", ran.append)
        load.take("b", ran.append)
        load.drain()
        assert ran == ["a", "b"] and load.ready and load.parked == 0

    asyncio.run(go())


def test_past_the_bound_the_loop_waits_for_the_load() -> None:
    """With `max_parked` items waiting, the next one waits for the load in place: all go on, in
    order, and no more than the bound ever wait."""
    ran: list[str] = []

    async def go() -> None:
        load = TokenizerLoad(Counters(None), lambda: False, lambda *e: None, max_parked=2)
        for name in "abc":
            load.take(name, ran.append)
        assert ran == ["a", "b", "c"] and load.parked == 0

    asyncio.run(go())


def test_without_the_lazy_load_the_vocabulary_wait_lets_items_through_at_once() -> None:
    """Counting with tokenizers loaded at start-up, the wait hands each item on as it comes."""
    vocabulary = Vocabulary(lambda: True, lambda *e: None)
    vocabulary.use(Counters(None), lazy=False)
    passed: list[str] = []
    vocabulary.take("a", passed.append)
    vocabulary.drain()
    assert passed == ["a"] and vocabulary.load is None


def test_a_new_tokenizer_lets_the_records_of_the_old_one_through_first() -> None:
    """Items waiting for the old vocabulary are handed on before the new counters are used."""
    passed: list[str] = []

    async def go() -> None:
        vocabulary = Vocabulary(lambda: False, lambda *e: None)
        old = Counters(None)
        vocabulary.use(old, lazy=True)
        vocabulary.flow_started()
        vocabulary.take(
            "waited", lambda item: passed.append(f"{item}:{vocabulary.counters is old}")
        )
        assert passed == []
        vocabulary.use(Counters(None), lazy=False)
        assert passed == ["waited:True"] and vocabulary.counters is not old

    asyncio.run(go())


def test_nothing_is_loaded_until_a_flow_starts() -> None:
    """A meter configured and running loads no vocabulary; the first flow starts the load (its
    last step once that flow is over)."""

    async def go() -> None:
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            tctx.configure(hm, hopmeter_hop="edge", hopmeter_lazy_tokenizer=True)
            assert _load.cache_info().currsize == 0
            assert hm.vocabulary.load is not None and not hm.vocabulary.load.ready
            stream_through(hm, sse_flow(), [SSE, DONE])
            await until(lambda: hm.vocabulary.load is not None and hm.vocabulary.load.ready)
            assert _load.cache_info().currsize == 1
            tctx.master._legacy_log_events.uninstall()  # its loop closes with asyncio.run's

    asyncio.run(go())


def test_without_the_option_the_vocabulary_loads_at_start_up() -> None:
    """By default the meter loads the vocabulary when the proxy runs, and builds each record at
    once (no load is waited for)."""
    hm = HopMeter()
    with taddons.context(hm) as tctx:
        tctx.configure(hm, hopmeter_hop="edge")
        assert hm.vocabulary.load is None
        hm.running()
        assert _load.cache_info().currsize == 1
        rec = Recorder()
        hm.add_observer(rec)
        stream_through(hm, sse_flow(), [SSE, DONE])
        assert len(rec.results) == 1


def said(result: Any) -> dict[str, Any]:
    """What a record says of a stream, without its ids and times (new per flow)."""
    record = result.record
    figures = {k: v for k, v in record["figures"].items() if not k.endswith("_s")}
    kept = ("api", "model", "ended", "stream", "hop", "schema", "request", "response")
    out = {k: record[k] for k in kept}
    out["request"] = {k: v for k, v in out["request"].items() if not k.startswith("t_")}
    out["response"] = {k: v for k, v in out["response"].items() if not k.startswith("t_")}
    out["findings"] = [f["kind"] for f in record["findings"]]
    return {**out, "figures": figures, "events": len(record["events"])}


def test_a_flow_that_ends_before_the_load_gets_the_same_record_later() -> None:
    """A flow that ends while the vocabulary loads gets no record until it is ready, then the
    record it would have had: the same as the same flow's once the vocabulary is loaded."""

    async def go() -> list[Any]:
        hm = HopMeter()
        rec = Recorder()
        with taddons.context(hm) as tctx:
            tctx.configure(hm, hopmeter_hop="edge", hopmeter_lazy_tokenizer=True)
            load = hm.vocabulary.load
            assert load is not None
            quiet = threading.Event()
            load.quiet = quiet.is_set  # hold the build until this flow has ended
            hm.add_observer(rec)
            out = stream_through(hm, sse_flow(), [SSE, SSE, DONE])
            assert out == [SSE, SSE, DONE, b""]  # forwarded at once, whatever measuring waits for
            await until(lambda: load.parked == 1)
            assert rec.results == []
            quiet.set()
            await until(lambda: len(rec.results) == 1)
            stream_through(hm, sse_flow(), [SSE, SSE, DONE])
            await until(lambda: len(rec.results) == 2)
            tctx.master._legacy_log_events.uninstall()
        return rec.results

    first, second = asyncio.run(go())
    assert first.record["figures"]["tokens_counted_source"] == "tokenizer"
    assert first.record["figures"]["tokens_counted"] == 2
    assert said(first) == said(second)
