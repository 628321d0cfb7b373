"""Following every flow's bytes to its client: a tracker per client connection, one poller for all.

HopMeter owns one `DeliveryLane`. In `responseheaders` it attaches a `FlowOut` to the flow's tap;
the tap hands it each chunk as it stamps it (`FlowOut.chunk`, the hot path: a list built and
armed); the connection's `ConnTracker` (hopmeter.proxy.delivery.conn) counts the write that carries
it. One loop timer looks at the queues of every connection with bytes on their way: 1 ms after a
write that left bytes waiting and every 1 ms while they move, backing off to 8 ms while they do not
move and to 64 ms while nothing waits. When a flow ends, its record waits until the kernel has sent
its last chunk, the connection closes, or `WAIT_MAX_S` passes: `DeliveryLane` is the first wait of
a flow's end (`take` and `drain`, hopmeter.proxy.addon.ending). Its clock and timers are the
constructor's (hopmeter.clock: the monotonic clock and the running loop by default).

`LoopLog` keeps what hopmeter's own work cost the event loop it shares with every stream: each of
its steps that took longer than a couple of milliseconds (with the CPU it used, so a busy loop is
told apart from a process the OS left waiting) and each timer that ran late; its steps are timed
on the real clocks (monotonic and the thread's CPU), whatever clock the flows are followed on. A
slow measuring step holds no chunk that was already written, but delays the *reading* of the next
ones, which would otherwise pass for a slow upstream: the record carries both (docs/design.md §7,
`proxy_hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import resource
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from mitmproxy import http

from hopmeter.clock import MONOTONIC, Clock, TimerHandle, Timers, timers_or_loop
from hopmeter.core.delivery import STILL_QUEUED, DeliverySeen
from hopmeter.core.ledger import GONE, NO_WRITE, FlowChunks
from hopmeter.core.meter import MAX_CHUNKS
from hopmeter.proxy.delivery.conn import POLL_FAST_S, ConnTracker, OnFail, locate
from hopmeter.proxy.fastpath.internals import locate_h2

# After a flow ends, its record waits at most this long for the client to take the last bytes; a
# client that stopped reading gets a record whose client wait is a lower bound. 30 s is the
# pairing's wait for inner flows (proxy/addon/pairing.py), so a trace's records wait alike.
WAIT_MAX_S = 30.0
# Client connections followed at once; more are forgotten oldest first (the proxy drops a
# connection's tracker when it disconnects, so this matters only if that hook never came).
MAX_CONNECTIONS = 65_536
# hopmeter's own steps kept when they take at least this long: a measuring step of a busy proxy
# takes 0.1-2 ms (200 lockstep streams, bench/README.md); this keeps only the ones that matter.
STEP_FLOOR_S = 0.002
# A timer that ran this late says the loop was busy or the process was not running.
LAG_FLOOR_S = 0.005
# Steps and lags remembered, newest last: a flow reads the ones that overlapped it.
MAX_LOOP_NOTES = 256
# A timer due within this of another runs with it (one wake-up, not two).
_TOGETHER_S = 0.0002
RETRY_S = 0.05  # the next look after one that failed


class LoopLog:
    """hopmeter's own slow steps and the loop's late timers, bounded."""

    __slots__ = ("lags", "steps")

    def __init__(self) -> None:
        self.steps: deque[tuple[float, float, float]] = deque(maxlen=MAX_LOOP_NOTES)
        self.lags: deque[tuple[float, float]] = deque(maxlen=MAX_LOOP_NOTES)

    def step(self, t0: float, cpu0: float) -> None:
        """A step of hopmeter's that began at `t0` (monotonic) with the thread at `cpu0` CPU s.

        The thread's CPU clock has no fast path (`time.thread_time` is a system call each time,
        where `time.monotonic` is not), so it is read again only for a step that is kept: a
        quick step costs one read, not two. The CPU interval then ends one monotonic read after
        the wall one; one thread cannot use more CPU than wall time, and the clamp absorbs that
        and the clocks' grain.
        """
        wall = time.monotonic() - t0
        if wall >= STEP_FLOOR_S:
            self.steps.append((t0, wall, min(time.thread_time() - cpu0, wall)))

    def lag(self, at: float, late_s: float) -> None:
        """A timer ran `late_s` after it was due."""
        if late_s >= LAG_FLOOR_S:
            self.lags.append((at, late_s))

    def window(
        self, t_from: float, t_to: float
    ) -> tuple[list[tuple[float, float, float]], list[tuple[float, float]]]:
        """The steps and lags that overlapped [t_from, t_to]."""
        steps = [s for s in self.steps if s[0] <= t_to and s[0] + s[1] >= t_from]
        lags = [g for g in self.lags if g[0] >= t_from and g[0] - g[1] <= t_to]
        return steps, lags


class FlowOut:
    """One flow's chunks on their way to the client, and what its connection showed meanwhile."""

    __slots__ = (
        "callback",
        "chunks",
        "conn",
        "count",
        "deadline",
        "done",
        "ended_at",
        "http_version",
        "mono_start",
        "nivcsw0",
        "queued_max",
        "reason",
        "rwnd0_us",
        "sid",
    )

    def __init__(self, http_version: str, clock: Clock = MONOTONIC) -> None:
        self.http_version = http_version
        self.mono_start = clock()
        self.conn: ConnTracker | None = None
        self.sid: int | None = None  # HTTP/2 stream id
        self.reason: str | None = None
        self.chunks = FlowChunks()
        self.count = 0
        self.queued_max = 0
        self.rwnd0_us: int | None = None
        self.nivcsw0: int | None = None
        self.callback: Callable[[], None] | None = None
        self.deadline = math.inf
        self.ended_at: float | None = None
        self.done = False

    def chunk(self, n: int, now: float) -> None:
        """The stream callable stamped a chunk of `n` bytes at `now` and is about to return it."""
        conn = self.conn
        if conn is None:
            return
        if self.count >= MAX_CHUNKS:  # the record lists no more; HTTP/2 still counts its bytes
            if self.sid is not None:
                conn.handed[self.sid] = conn.handed.get(self.sid, 0) + n
            return
        self.count += 1
        c = [n, now, -1, None, None, None, None, None, False, 0]  # core.ledger.new_chunk
        self.chunks.live.append(c)
        try:  # free unless it raises; it runs inside the stream callable, so nothing may escape
            if self.sid is None:  # Ledger.arm, inlined: this runs once per chunk of every stream
                led = conn.ledger
                if led.armed is not None:
                    led.armed[GONE] = NO_WRITE
                led.armed = c
            else:
                conn.h2_chunk(c, self.sid)
        except Exception as exc:
            self.conn = None
            self.reason = f"following the client's bytes failed: {type(exc).__name__}"
            if self in conn.outs:
                conn.outs.remove(self)
            conn.on_fail("delivery", exc)

    def saw_queued(self, queued: int, conn: ConnTracker) -> None:
        """A look at the connection found `queued` bytes waiting on the client."""
        if self.sid is not None:
            queued += conn.stream_queued(self.sid)
        self.queued_max = max(self.queued_max, queued)

    def seen(
        self, mono0: float, skew_s: float, log: LoopLog, clock: Clock = MONOTONIC
    ) -> DeliverySeen:
        """What was seen, for hopmeter.core.delivery.summarize (at the record's making)."""
        conn = self.conn
        if conn is None:
            return DeliverySeen(
                reason=self.reason or "not followed",
                measured=False,
                chunks=None,
                mono0=mono0,
                skew_s=skew_s,
                http_version=self.http_version,
            )
        end = self.ended_at if self.ended_at is not None else clock()
        steps, lags = log.window(self.mono_start, end)
        rwnd_s = None
        if self.rwnd0_us is not None:
            last = conn.rwnd_limited_us()
            if last is not None:
                rwnd_s = max(0, last - self.rwnd0_us) / 1e6
        switches = None if self.nivcsw0 is None else _involuntary_switches() - self.nivcsw0
        # settled here, on the loop: the record may be built on another thread
        # (proxy.addon.aside), and a chunk still on its way is one the loop could still mark
        self.chunks.settle(STILL_QUEUED)
        return DeliverySeen(
            reason=self.reason,
            measured=True,
            chunks=self.chunks,
            mono0=mono0,
            skew_s=skew_s,
            http_version=self.http_version,
            queued_bytes_max=self.queued_max,
            queued_at_close_bytes=conn.queued_at_close,
            rwnd_limited_s=rwnd_s,
            steps=steps,
            loop_lags_s=lags,
            involuntary_switches=switches,
        )


def _involuntary_switches() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


class Followed(Protocol):
    """An item of a flow's end that the client wait can read the flow's FlowOut from."""

    @property
    def out(self) -> FlowOut | None: ...


class DeliveryLane:
    """Every client connection's tracker, the one poller, and the loop's log."""

    def __init__(
        self, on_error: OnFail, *, clock: Clock = MONOTONIC, timers: Timers | None = None
    ) -> None:
        self.on_error = on_error
        self.clock = clock
        self.timers = timers  # the poller's; None: the running loop's
        self.trackers: dict[str, ConnTracker] = {}  # by client connection id
        self.active: set[ConnTracker] = set()  # trackers with something to look at
        self.log = LoopLog()
        self._timer: TimerHandle | None = None
        self._timer_at = math.inf

    # -- flows -----------------------------------------------------------------------------------
    def attach(self, flow: http.HTTPFlow, *, chaos: bool) -> FlowOut:
        """A FlowOut for a flow whose response is about to stream; never raises."""
        out = FlowOut(flow.request.http_version, self.clock)
        try:
            if chaos:
                out.reason = "--chaos re-cuts responses on the way to the client"
            else:
                out.reason = self._attach(flow, out)
        except Exception as exc:
            out.conn = None
            out.reason = f"following the client's bytes failed: {type(exc).__name__}"
            self.on_error("delivery", exc)
        return out

    def _attach(self, flow: http.HTTPFlow, out: FlowOut) -> str | None:
        found = locate(flow)
        if isinstance(found, str):
            return found
        handler, writer, sock = found
        key = flow.client_conn.id
        tracker = self.trackers.get(key)
        if tracker is None or tracker.writer is not writer:
            h2conn = None
            if flow.client_conn.alpn == b"h2":
                h2 = locate_h2(handler, flow)
                if isinstance(h2, str):
                    return h2
                h2conn = h2[0]
            tracker = ConnTracker(writer, sock, self.want, self.on_error, h2conn, clock=self.clock)
            self._keep(key, tracker)
        if tracker.broken is not None:
            return tracker.broken
        if tracker.h2conn is not None:
            h2 = locate_h2(handler, flow)
            if isinstance(h2, str):
                return h2
            out.sid = h2[1]
        out.rwnd0_us = tracker.rwnd_limited_us()
        out.nivcsw0 = _involuntary_switches()
        out.conn = tracker
        tracker.outs.append(out)
        return None

    def _keep(self, key: str, tracker: ConnTracker) -> None:
        while len(self.trackers) >= MAX_CONNECTIONS:
            old = self.trackers.pop(next(iter(self.trackers)))
            self._forget(old, "too many client connections followed at once")
        self.trackers[key] = tracker

    # -- the wait of a flow's end ------------------------------------------------------------
    def take[T: Followed](self, item: T, then: Callable[[T], None]) -> None:
        """A flow ended: hand `item` to `then` once its bytes have reached the client's side (or
        never will be seen to), soon after this returns; at once with no loop running."""
        out = item.out
        if out is not None:
            try:
                self.finish(out, lambda: then(item))
                return
            except Exception as exc:  # finish() itself guards; this is the last line
                self.on_error("delivery", exc)
                if out.done:
                    return
        try:
            asyncio.get_running_loop().call_soon(then, item)
        except RuntimeError:  # no running loop (offline tools, tests): now
            then(item)

    def finish(self, out: FlowOut, callback: Callable[[], None]) -> None:
        """The flow ended: call `callback` once its bytes have reached the client's side (or
        never will be seen to), soon after this returns."""
        out.callback = callback
        out.ended_at = now = self.clock()
        tracker = out.conn
        if tracker is None:
            self._complete(out)
            return
        out.deadline = now + WAIT_MAX_S
        if self._poll(tracker, now):
            self.want(tracker, now, True)

    def forget(self, client_id: str) -> None:
        """A client disconnected: a last look, then its flows are written with what was seen."""
        tracker = self.trackers.pop(client_id, None)
        if tracker is not None:
            self._forget(tracker, "the connection closed with bytes still queued")

    def _forget(self, tracker: ConnTracker, why: str) -> None:
        now = self.clock()
        try:
            if tracker.ledger.pending() and tracker.broken is None:
                tracker.poll(now)
        except Exception as exc:
            tracker.fail("the last look", exc)
        tracker.give_up(why, tracker.last_poll)
        self._settle(tracker, now)
        self.active.discard(tracker)
        tracker.active = False

    def drain(self) -> None:
        """The proxy stops: every flow still waiting goes on now, with what was seen."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        for tracker in list(self.trackers.values()):
            tracker.give_up("hopmeter stopped", tracker.last_poll)
            for out in list(tracker.outs):
                if out.callback is not None:
                    self._complete(out, at_once=True)
        self.trackers.clear()
        self.active.clear()

    def _complete(self, out: FlowOut, at_once: bool = False) -> None:
        if out.done:
            return
        out.done = True
        tracker = out.conn
        if tracker is not None:
            if out in tracker.outs:
                tracker.outs.remove(out)
            if out.sid is not None:
                tracker.handed.pop(out.sid, None)
        callback, out.callback = out.callback, None
        if callback is None:
            return
        if not at_once:
            try:
                asyncio.get_running_loop().call_soon(callback)
                return
            except RuntimeError:  # no running loop (offline tools, tests): now
                pass
        callback()

    # -- the poller ------------------------------------------------------------------------------
    def want(self, tracker: ConnTracker, now: float, urgent: bool) -> None:
        """Look at `tracker`'s queues: soon if `urgent` (bytes are waiting), else when due."""
        if urgent:
            tracker.interval = POLL_FAST_S
        if tracker.active:
            if urgent and tracker.due > now + POLL_FAST_S:
                tracker.due = now + POLL_FAST_S
                self._arm(tracker.due)
            return
        tracker.active = True
        self.active.add(tracker)
        tracker.due = max(now, tracker.last_poll) + max(tracker.interval, POLL_FAST_S)
        self._arm(tracker.due)

    def _arm(self, at: float) -> None:
        if at >= self._timer_at - _TOGETHER_S:
            return
        try:
            timers = timers_or_loop(self.timers)
        except RuntimeError:  # no loop: only the looks at a flow's end and close happen
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = timers.call_later(max(0.0, at - self.clock()), self._tick)
        self._timer_at = at

    def _tick(self) -> None:
        """The look the timer was armed for. A fault is counted and the looks go on (a tick
        that died would leave every connection's ended flows waiting on it, unrecorded)."""
        armed_at = self._timer_at
        self._timer, self._timer_at = None, math.inf
        try:
            self._look(armed_at)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.on_error("delivery", exc)
            if self._timer is None and self.active:
                with contextlib.suppress(Exception):
                    self._arm(self.clock() + RETRY_S)

    def _look(self, armed_at: float) -> None:
        now = self.clock()
        self.log.lag(now, now - armed_at)
        # The loop may run this before `armed_at` on this clock: uvloop rounds a delay to whole
        # milliseconds and counts it from the time it read at the start of its turn, so its timer
        # can fire up to ~1.5 ms early. A look the timer was armed for is taken now, early (its
        # interval comes out shorter, never longer), rather than re-armed for the sliver left:
        # that was a turn of the loop and often a wake-up of its own, more ticks than looks.
        reach = max(now, armed_at) + _TOGETHER_S
        nxt = math.inf
        for tracker in list(self.active):
            if tracker.due <= reach:
                if not self._poll(tracker, now):
                    tracker.active = False
                    self.active.discard(tracker)
                    continue
                tracker.due = now + tracker.interval
            nxt = min(nxt, tracker.due)
        if nxt < math.inf:
            self._arm(nxt)

    def _poll(self, tracker: ConnTracker, now: float) -> bool:
        """One look; True while the tracker has chunks or ended flows still to follow."""
        try:
            pending = tracker.poll(now)
        except Exception as exc:
            tracker.fail("a look at the queues", exc)
            pending = False
        return self._settle(tracker, now) or pending

    def _settle(self, tracker: ConnTracker, now: float) -> bool:
        """Complete the ended flows whose bytes are all seen; True if some still wait."""
        waiting = False
        for out in list(tracker.outs):
            if out.callback is None:
                continue
            if tracker.broken is not None or out.chunks.done() or now >= out.deadline:
                self._complete(out)
            else:
                waiting = True
        return waiting
