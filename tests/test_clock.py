"""hopmeter.clock: the clock and timers handed to the proxy, and a sleep on either timers."""

from __future__ import annotations

import asyncio
import time

import pytest

from hopmeter import clock
from hopmeter.testing import ManualClock


def test_the_defaults_are_the_monotonic_clock_and_the_running_loop():
    """MONOTONIC is time.monotonic; without timers, the running loop's are used."""
    assert clock.MONOTONIC is time.monotonic

    async def main() -> None:
        now = ManualClock()
        assert clock.timers_or_loop(None) is asyncio.get_running_loop()
        assert clock.timers_or_loop(now) is now

    asyncio.run(main())
    with pytest.raises(RuntimeError):
        clock.timers_or_loop(None)  # no loop running


def test_sleep_waits_for_the_manual_clock_or_the_loop():
    """clock.sleep on a ManualClock returns once the clock passes its delay; without timers it
    sleeps on the running loop."""

    async def main() -> None:
        now = ManualClock()
        sleeper = asyncio.create_task(clock.sleep(3, now))
        await asyncio.sleep(0)
        now.advance(2.5)
        await asyncio.sleep(0)
        assert not sleeper.done()
        now.advance(0.5)
        await asyncio.wait_for(sleeper, 5)
        await clock.sleep(0)

    asyncio.run(main())


def test_a_cancelled_sleep_cancels_its_timer():
    """Cancelling a sleeping task leaves no timer behind on the manual clock."""

    async def main() -> None:
        now = ManualClock()
        sleeper = asyncio.create_task(clock.sleep(3, now))
        await asyncio.sleep(0)
        assert now.pending() == 1
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert now.pending() == 0

    asyncio.run(main())
