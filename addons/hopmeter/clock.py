"""The clock and the timers hopmeter's proxy reads: handed in, so tests move time themselves.

Production code takes `MONOTONIC` and the running asyncio loop (the defaults); tests hand in a
`hopmeter.testing.ManualClock`, which is both, and `advance()` it instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

Clock = Callable[[], float]  # monotonic seconds
MONOTONIC: Clock = time.monotonic


class TimerHandle(Protocol):
    """A scheduled call: `cancel()` makes sure it does not run."""

    def cancel(self) -> None: ...


class Timers(Protocol):
    """Where calls are scheduled; an asyncio event loop is one."""

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any
    ) -> TimerHandle: ...


def timers_or_loop(timers: Timers | None) -> Timers:
    """`timers` when given, else the running event loop (a RuntimeError outside one)."""
    return timers if timers is not None else asyncio.get_running_loop()


async def sleep(delay: float, timers: Timers | None = None) -> None:
    """Wait `delay` seconds of `timers`' time (the running loop's when None)."""
    if timers is None:
        await asyncio.sleep(delay)
        return
    woken = asyncio.get_running_loop().create_future()
    handle = timers.call_later(delay, _wake, woken)
    try:
        await woken
    finally:
        handle.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
