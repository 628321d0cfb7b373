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
    clock.advance(STALE_INTERVALS * aging.interval_s + aging.timeout_s)
    assert aging.answer()[0] is True  # stale only past the limit
    clock.advance(60 - STALE_INTERVALS * aging.interval_s - aging.timeout_s)
    ready, why = aging.answer()
    assert not ready and "last checked 60s ago" in why


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
