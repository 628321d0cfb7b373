"""Readiness: can the upstreams behind this proxy take requests? The answer behind /readyz.

A task on the proxy's event loop connects to every reverse listener's upstream every
`hopmeter_ready_interval` seconds, giving up after `hopmeter_ready_timeout`; real traffic updates
the answer in between (a failed connect makes that upstream not ready at once, response headers
make it ready). /readyz, served from the metrics endpoint's thread, only reads the cached answer,
so a probe never waits on an upstream. Ready means every reverse upstream accepts connections;
listeners with no fixed upstream (regular, transparent, ...) are not checked. While the proxy
drains (hopmeter.proxy.run.drain) it is not ready, whatever its upstreams say.

A TCP connect is what the check asks, not an HTTP health route: the model server's own
readinessProbe (vLLM, TGI and llama.cpp answer /health) says when its model is loaded, and a
pod is ready only when all its containers are (deploy/kubernetes/sidecar.yaml).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from hopmeter.clock import MONOTONIC, Clock, Timers, sleep
from hopmeter.core.vocab import Ended
from hopmeter.errors import UsageError
from hopmeter.proxy import options
from hopmeter.proxy.addon.failures import address_text, connect_cause
from hopmeter.proxy.fastpath.internals import ProxyMode, ReverseMode

Address = tuple[str, int]
# Reverse schemes whose upstream is reached over TCP (the others speak UDP: not checked).
TCP_SCHEMES = frozenset({"http", "https", "tls", "tcp", "dns"})
# A cached answer older than this many intervals (plus the timeout) means the loop has not run
# the check: the event loop is stuck or starved, and the proxy is not ready either.
STALE_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """The last thing known about one upstream."""

    ok: bool
    why: str
    at_s: float  # monotonic


class Readiness:
    """A cached answer to "can the upstreams take requests?", for /readyz."""

    def __init__(self, *, clock: Clock = MONOTONIC, timers: Timers | None = None) -> None:
        self.clock = clock  # the states' times and their staleness (hopmeter.clock)
        self.timers = timers  # the checks' interval; None: the running loop's
        self.targets: tuple[Address, ...] = ()
        # replaced whole on every change, never mutated: the endpoint's thread reads it
        self.states: dict[Address, UpstreamState] = {}
        self.draining = False
        self.interval_s: float = options.default("hopmeter_ready_interval")
        self.timeout_s: float = options.default("hopmeter_ready_timeout")
        self.task: asyncio.Task[None] | None = None

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.READINESS)

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        try:
            if "hopmeter_ready_interval" in updated:
                self.interval_s = options.read(opts, "hopmeter_ready_interval")
            if "hopmeter_ready_timeout" in updated:
                self.timeout_s = options.read(opts, "hopmeter_ready_timeout")
        except UsageError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        if "mode" in updated:
            self.targets = reverse_upstreams(opts.mode)
            self.states = {a: s for a, s in self.states.items() if a in self.targets}

    def running(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._every())

    def done(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _every(self) -> None:
        while True:
            found = await asyncio.gather(*(self.check(a) for a in self.targets))
            self.states = {**self.states, **dict(zip(self.targets, found, strict=True))}
            await sleep(self.interval_s, self.timers)

    async def check(self, address: Address) -> UpstreamState:
        """Connect to `address` once; ready if it accepts within the timeout."""
        now = self.clock()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(*address), self.timeout_s)
        except TimeoutError:
            return UpstreamState(False, f"{Ended.CONNECT_TIMEOUT} after {self.timeout_s:g}s", now)
        except OSError as exc:
            cause, name = connect_cause(str(exc))
            return UpstreamState(False, f"{cause} ({name})", now)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return UpstreamState(True, "accepts connections", now)

    # -- what real traffic says, in between (hopmeter.proxy.addon.guard) ---------------------
    def failed(self, address: Any, cause: str, detail: str) -> None:
        """A flow could not connect to `address`: not ready, now."""
        key = _key(address)
        if key in self.targets:
            state = UpstreamState(False, f"{cause} ({detail}) in traffic", self.clock())
            self.states = {**self.states, key: state}

    def succeeded(self, address: Any) -> None:
        """A flow got response headers from `address`: it takes requests."""
        key = _key(address)
        if key is None or key not in self.targets:
            return
        current = self.states.get(key)
        if current is None or not current.ok:
            state = UpstreamState(True, "answered a request", self.clock())
            self.states = {**self.states, key: state}

    def answer(self) -> tuple[bool, str]:
        """(ready, why), from the cached state; safe from any thread, never waits."""
        if self.draining:
            return False, "draining: finishing the streams in flight, accepting no new ones"
        if not self.targets:
            return True, "no reverse listener: no fixed upstream to check"
        states, now = self.states, self.clock()
        stale_s = STALE_INTERVALS * self.interval_s + self.timeout_s
        ready, parts = True, []
        for address in self.targets:
            state = states.get(address)
            if state is None:
                ok, why = False, "not checked yet"
            elif now - state.at_s > stale_s:
                ok, why = False, f"last checked {now - state.at_s:.0f}s ago (event loop stuck?)"
            else:
                ok, why = state.ok, state.why
            ready = ready and ok
            parts.append(f"{address_text(address)} {why}")
        return ready, "; ".join(parts)


def reverse_upstreams(modes: Any) -> tuple[Address, ...]:
    """The upstream address of every reverse mode reached over TCP, in order, once each."""
    out: list[Address] = []
    for spec in modes:
        try:
            mode = ProxyMode.parse(spec)
        except ValueError:
            continue  # Proxyserver reports a bad mode itself
        if isinstance(mode, ReverseMode) and mode.scheme in TCP_SCHEMES:
            address = (str(mode.address[0]), int(mode.address[1]))
            if address not in out:
                out.append(address)
    return tuple(out)


def _key(address: Any) -> Address | None:
    if not address:
        return None
    return (str(address[0]), int(address[1]))
