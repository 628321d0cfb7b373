"""Tests for hopmeter.proxy.fastpath.backpressure: mitmproxy's per-read drain step is skipped only
when no writer could wait, and a client that reads nothing still holds the reads back, on both
loops; a fault in the check leaves the step to mitmproxy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from mitmproxy.proxy.server import ConnectionHandler

from hopmeter.proxy.fastpath import backpressure
from hopmeter.proxy.fastpath.backpressure import make_drain_writers, may_wait, needs_drain
from tests.harness.live_client import Live, live_client, run, unread

LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
WAIT_S = 10.0


def _unexpected(where: str, exc: BaseException) -> None:
    raise AssertionError(f"a fault in {where}: {exc!r}")


drain_writers = make_drain_writers(_unexpected)


@pytest.fixture
def mitmproxy_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Each call of mitmproxy's own drain_writers made through the shortcut."""
    calls: list[Any] = []
    original = backpressure._MITMPROXY_DRAIN

    async def counted(handler: Any) -> None:
        calls.append(handler)
        await original(handler)

    monkeypatch.setattr(backpressure, "_MITMPROXY_DRAIN", counted)
    yield calls


async def _fill(live: Live) -> None:
    """Write to the client until its transport pauses writing (the peer reads nothing)."""
    chunk = b"x" * 65536
    for _ in range(4096):
        if may_wait(live.writer):
            return
        live.writer.write(chunk)
        await asyncio.sleep(0)
    raise AssertionError("the transport never paused")


@pytest.mark.loopback
@LOOPS
def test_a_writer_with_room_is_skipped_and_a_paused_one_is_drained(
    loop: str, mitmproxy_calls: list[Any]
) -> None:
    """With room in the client's buffers the step returns without mitmproxy's method; once the
    peer stops reading and the transport pauses, mitmproxy's method runs and waits until the
    peer has read, as without the shortcut."""

    async def go() -> None:
        async with live_client(4096) as live:
            assert not may_wait(live.writer)
            await drain_writers(live.handler)
            assert mitmproxy_calls == []
            await _fill(live)
            step = asyncio.ensure_future(drain_writers(live.handler))
            done, _ = await asyncio.wait({step}, timeout=0.2)
            assert not done, "the step went on while the client read nothing"
            assert mitmproxy_calls == [live.handler]
            loop_ = asyncio.get_running_loop()
            deadline = loop_.time() + WAIT_S
            while not step.done():
                assert loop_.time() < deadline, "the step never resumed"
                unread(live.peer)
                await asyncio.sleep(0.01)
            await step
            assert not may_wait(live.writer)

    run(go, loop)


@pytest.mark.loopback
@LOOPS
def test_a_closing_writer_takes_mitmproxys_path(loop: str, mitmproxy_calls: list[Any]) -> None:
    """A transport that is closing makes drain yield (and report the loss): mitmproxy's method
    runs, and it does not raise out of the step."""

    async def go() -> None:
        async with live_client() as live:
            live.writer.transport.close()
            assert may_wait(live.writer)
            await drain_writers(live.handler)
            assert mitmproxy_calls == [live.handler]

    run(go, loop)


@pytest.mark.loopback
def test_a_held_lock_or_a_foreign_writer_takes_mitmproxys_path(
    mitmproxy_calls: list[Any],
) -> None:
    """While another drain holds mitmproxy's lock the step queues behind it as before; a writer
    that is not an asyncio StreamWriter (mitmproxy_rs streams) is never judged here."""

    async def go() -> None:
        async with live_client() as live:
            await live.handler._drain_lock.acquire()
            step = asyncio.ensure_future(drain_writers(live.handler))
            await asyncio.sleep(0.05)
            assert not step.done() and mitmproxy_calls == [live.handler]
            live.handler._drain_lock.release()
            await step
        assert may_wait(object())

    run(go)


@pytest.mark.loopback
def test_a_fault_in_the_check_runs_mitmproxys_step(
    mitmproxy_calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault while judging the writers is told to `on_error`, and mitmproxy's own step runs
    (it waits if a writer needs it), as without the shortcut."""
    faults: list[str] = []

    def broken(handler: Any) -> bool:
        raise RuntimeError("injected")

    async def go() -> None:
        async with live_client() as live:
            monkeypatch.setattr(backpressure, "needs_drain", broken)
            guarded = make_drain_writers(lambda where, exc: faults.append(f"{where}: {exc}"))
            await guarded(live.handler)
            assert mitmproxy_calls == [live.handler]

    run(go)
    assert faults == ["backpressure: injected"]


def _writer(*, error: bool, closing: bool, lost: bool, paused: bool) -> Any:
    """An asyncio StreamWriter in the state given, with stand-ins for its reader, transport and
    protocol (only the fields `StreamWriter.drain` reads)."""
    writer: Any = object.__new__(asyncio.StreamWriter)
    writer._reader = SimpleNamespace(_exception=OSError("reset") if error else None)
    writer._transport = SimpleNamespace(is_closing=lambda: closing)
    writer._protocol = SimpleNamespace(_connection_lost=lost, _paused=paused)
    return writer


STATES = [
    {"error": False, "closing": False, "lost": False, "paused": False},
    {"error": True, "closing": False, "lost": False, "paused": False},
    {"error": False, "closing": True, "lost": False, "paused": False},
    {"error": False, "closing": False, "lost": True, "paused": False},
    {"error": False, "closing": False, "lost": False, "paused": True},
]


@pytest.mark.parametrize("state", STATES)
def test_the_handlers_check_reads_each_writer_as_may_wait_does(state: dict[str, bool]) -> None:
    """`needs_drain` judges each writer of the handler as `may_wait` does (it reads the same
    fields inline), whichever of its writers is the one that could wait."""
    calm = _writer(error=False, closing=False, lost=False, paused=False)
    other = _writer(**state)
    for writers in ([other], [calm, other], [other, calm], [None, other]):
        handler: Any = SimpleNamespace(
            _drain_lock=asyncio.Lock(),
            transports={i: SimpleNamespace(writer=w) for i, w in enumerate(writers)},
        )
        assert needs_drain(handler) is may_wait(other) is any(state.values())
    for w in (calm, other):  # closed, so the writers' __del__ has nothing to warn about
        w._transport = SimpleNamespace(is_closing=lambda: True)


def test_a_writer_missing_a_field_or_of_another_kind_needs_mitmproxys_step() -> None:
    """A writer of another type, or one whose asyncio lacks a field read, takes mitmproxy's
    step; a handler without writers does not."""
    odd = _writer(error=False, closing=False, lost=False, paused=False)
    del odd._protocol
    for writer in (odd, object()):
        handler: Any = SimpleNamespace(
            _drain_lock=asyncio.Lock(), transports={0: SimpleNamespace(writer=writer)}
        )
        assert needs_drain(handler)
    odd._transport = SimpleNamespace(is_closing=lambda: True)
    empty: Any = SimpleNamespace(_drain_lock=asyncio.Lock(), transports={})
    assert not needs_drain(empty)


def test_install_puts_the_shortcut_in_front_and_uninstall_takes_it_away() -> None:
    """Only `hopmeter run` installs it (hopmeter.proxy.fastpath.install); uninstall gives
    mitmproxy its own method back."""
    try:
        backpressure.install(_unexpected)
        assert backpressure.installed()
        assert ConnectionHandler.drain_writers is not backpressure._MITMPROXY_DRAIN
    finally:
        backpressure.uninstall()
    assert ConnectionHandler.drain_writers is backpressure._MITMPROXY_DRAIN
    assert not backpressure.installed()
