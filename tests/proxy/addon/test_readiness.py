"""Tests for hopmeter.proxy.addon.readiness: which upstreams are checked and what /readyz
answers."""

from __future__ import annotations

import asyncio
import socket

import pytest
from mitmproxy.test import taddons

from hopmeter.proxy.addon.readiness import (
    STALE_INTERVALS,
    Readiness,
    UpstreamState,
    reverse_upstreams,
)
from hopmeter.testing import ManualClock

UP = ("127.0.0.1", 8000)


def test_every_reverse_upstream_over_tcp_is_checked_once() -> None:
    """Reverse modes' upstreams, in order and once each; regular and UDP modes have none."""
    modes = [
        "reverse:http://127.0.0.1:8000@8080",
        "regular@8081",
        "reverse:https://example.com@8082",
        "reverse:http://127.0.0.1:8000@8083",
        "reverse:dtls://127.0.0.1:9@8084",
    ]
    assert reverse_upstreams(modes) == (UP, ("example.com", 443))


def ready_with(*states: UpstreamState, clock: ManualClock | None = None) -> Readiness:
    """A readiness whose targets are UP and 127.0.0.1:9000, with these states in that order."""
    r = Readiness(clock=clock or ManualClock())
    r.targets = (UP, ("127.0.0.1", 9000))
    r.states = dict(zip(r.targets, states, strict=False))
    return r


def test_ready_only_when_every_upstream_is() -> None:
    """Ready needs every upstream's last check to have passed; the body names each one."""
    clock = ManualClock()
    now = clock()
    ok, down = UpstreamState(True, "accepts connections", now), UpstreamState(False, "x", now)
    assert ready_with(ok, ok, clock=clock).answer() == (
        True,
        "127.0.0.1:8000 accepts connections; 127.0.0.1:9000 accepts connections",
    )
    assert ready_with(ok, down).answer()[0] is False
    assert ready_with(ok).answer() == (
        False,
        "127.0.0.1:8000 accepts connections; 127.0.0.1:9000 not checked yet",
    )
    aging = ready_with(ok, ok, clock=clock)
    limit_s = STALE_INTERVALS * aging.interval_s + aging.timeout_s
    clock.advance(limit_s)
    assert aging.answer()[0] is True  # stale only past the limit
    clock.advance(1)
    ready, why = aging.answer()
    assert not ready and f"last checked {limit_s + 1:.0f}s ago" in why


def test_draining_is_not_ready_and_no_upstream_is_ready() -> None:
    """A draining proxy is not ready whatever its upstreams; one with no reverse listener is."""
    r = Readiness()
    assert r.answer() == (True, "no reverse listener: no fixed upstream to check")
    r.draining = True
    assert r.answer()[0] is False and "draining" in r.answer()[1]


def test_traffic_flips_the_answer_at_once() -> None:
    """A failed connect in traffic makes that upstream not ready; response headers make it ready."""
    r = ready_with()
    r.targets = (UP,)
    r.failed(UP, "connect_refused", "ECONNREFUSED 127.0.0.1:8000")
    assert r.answer() == (
        False,
        "127.0.0.1:8000 connect_refused (ECONNREFUSED 127.0.0.1:8000) in traffic",
    )
    r.succeeded(UP)
    assert r.answer() == (True, "127.0.0.1:8000 answered a request")
    r.failed(("10.0.0.1", 1), "connect_refused", "not ours")  # not a target: ignored
    assert r.answer()[0] is True


@pytest.mark.loopback
def test_the_check_connects_for_real() -> None:
    """A listening port is ready; a closed one is connect_refused."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        up = asyncio.run(Readiness().check(("127.0.0.1", port)))
    down = asyncio.run(Readiness().check(("127.0.0.1", port)))
    assert (up.ok, up.why) == (True, "accepts connections")
    assert (down.ok, down.why) == (False, "connect_refused (ECONNREFUSED)")


def test_options_set_the_targets_and_intervals() -> None:
    """`mode` names the targets; the interval must be positive."""
    r = Readiness()
    with taddons.context(r) as tctx:
        tctx.configure(
            r, mode=["reverse:http://127.0.0.1:8000@8080"], hopmeter_ready_interval="500ms"
        )
        assert (r.targets, r.interval_s) == ((UP,), 0.5)
        with pytest.raises(Exception, match="hopmeter_ready_interval '0': expected a positive"):
            tctx.configure(r, hopmeter_ready_interval="0")


async def turns(count: int = 5) -> None:
    """Let the loop run `count` turns (no time passes on a ManualClock)."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_the_upstreams_are_checked_once_an_interval_on_the_timers() -> None:
    """Once running, every target is checked at once, then once per interval of the timers'
    time; the state cached is the last check's."""
    now = ManualClock()
    r = Readiness(clock=now, timers=now)
    r.targets = (UP,)
    checked: list[float] = []

    async def check(address: tuple[str, int]) -> UpstreamState:
        checked.append(now())
        return UpstreamState(len(checked) % 2 == 1, f"check {len(checked)}", now())

    r.check = check  # type: ignore[method-assign]  # no socket: what the loop does with it

    async def main() -> None:
        r.running()
        await turns()  # the task gathers the check and waits for the interval
        assert checked == [1000.0] and r.states[UP].why == "check 1"
        now.advance(r.interval_s - 0.5)
        await turns()
        assert len(checked) == 1
        now.advance(0.5)
        await turns()
        assert checked == [1000.0, 1000.0 + r.interval_s] and r.states[UP].why == "check 2"
        assert r.answer() == (False, "127.0.0.1:8000 check 2")
        r.done()

    asyncio.run(main())
