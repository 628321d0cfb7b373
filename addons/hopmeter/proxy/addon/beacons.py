"""Joining browser beacons to the records of the requests that announced them, within bounds.

A page running hopmeter's snippet puts `tracestate: hopmeter=beacon` on its streaming request:
a beacon will follow, to the hop that served the page. That flow's record (the outermost of its
trace in this process, with its `hops` when several listeners saw it) then waits for the beacon,
at most WAIT_S, and is written with the browser and screen lanes, or with `browser.joined: false`
when no beacon came. The beacon usually comes a second after the stream ended (the snippet waits
until the reply's element stopped changing); a page that is left mid-stream sends it at once,
before the record exists: the beacon then waits for the record.

Every table here is bounded; what a bound pushes out is written or refused, and counted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from hopmeter.core.beacon import Beacon
from hopmeter.core.browser import attach_beacon, join_beacon, missing_beacon
from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import BeaconOutcome

# How long a record waits for its beacon. The snippet sends one when the reply's element has
# been still for 1 s after the stream ended, or 10 s after the end at the latest (data-wait);
# 15 s leaves a loaded page time to send it.
WAIT_S = 15.0
# Requests that announced a beacon and have not had it joined yet. Each entry is a few ids; a
# parked record is counted apart below. Beyond this the oldest is forgotten (its record, if
# parked, is written without the lanes).
MAX_EXPECTED = 8192
# Records waiting for their beacon: each holds a whole record (its events: up to ~100 KiB) for
# at most WAIT_S; more replies than this ending within 15 s at one hop is a busy site, and the
# oldest is then written without waiting longer.
MAX_PARKED = 1024
# Beacons that came before their record (the page was left mid-stream): each up to 64 KiB of
# JSON, ~4x that parsed; 64 of them hold ~16 MiB at most. Beyond this the oldest is dropped.
MAX_WAITING_BEACONS = 64
# Traces whose beacon was joined, or whose record was written without it, remembered to answer a
# second or late beacon clearly (410, 409) instead of "unknown trace": ids only.
MAX_FINISHED = 8192


@dataclass(slots=True)
class Expected:
    """A request that announced a beacon: its flow, its page's origin, what came so far."""

    flow_id: str
    origin: str | None
    result: FlowResult | None = None  # the flow's record, parked
    beacon: Beacon | None = None  # the beacon, when it came first
    received_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """What the beacon endpoint says: an HTTP status, one line, and the outcome counted."""

    status: int
    message: str
    outcome: BeaconOutcome | None  # None: accepted, counted when it is joined (or dropped)


class BeaconJoins:
    """The tables, and the joins; `emit` writes a record (the `then` of `take`, when it is the
    wait of a flow's end), `count` counts an outcome."""

    def __init__(
        self,
        *,
        schedule: Callable[[float, Callable[[], None]], object],
        count: Callable[[BeaconOutcome], None],
        on_error: Callable[[str, BaseException], None],
        emit: Callable[[FlowResult], None] | None = None,
    ) -> None:
        self.expected: OrderedDict[str, Expected] = OrderedDict()
        self.finished: OrderedDict[str, BeaconOutcome] = OrderedDict()
        self.parked = 0
        self.waiting = 0
        self.log_content = False
        self._schedule = schedule
        self._emit = emit
        self._count = count
        self._on_error = on_error

    def expect(self, trace_id: str, flow_id: str, origin: str | None) -> None:
        """A request of `trace_id` announced a beacon (the first such flow of a trace is the one
        the page talked to; later ones are inner listeners of this process)."""
        if trace_id in self.expected or trace_id in self.finished:
            return
        self.expected[trace_id] = Expected(flow_id=flow_id, origin=origin)
        while len(self.expected) > MAX_EXPECTED:
            old_id, old = self.expected.popitem(last=False)
            self._forget(old_id, old, "too many requests announced a beacon at once")

    def take(self, result: FlowResult, then: Callable[[FlowResult], None]) -> None:
        """A wait of a flow's end (hopmeter.proxy.addon.ending): hold `result` for its beacon if
        its request announced one, else hand it to `then` now. A held record goes to `then` when
        its beacon comes, when it waited WAIT_S, or at `drain` (every take of one chain passes
        the same `then`)."""
        self._emit = then
        if not self._hold(result):
            then(result)

    def _hold(self, result: FlowResult) -> bool:
        """Hold `result` for its beacon if its request announced one; False to write it now."""
        rec = result.record
        trace_id = rec.get("trace_id")
        e = self.expected.get(trace_id) if isinstance(trace_id, str) else None
        if e is None or e.flow_id != rec.get("flow_id") or e.result is not None:
            return False
        assert isinstance(trace_id, str)
        if e.beacon is not None:  # the beacon came first
            del self.expected[trace_id]
            self.waiting -= 1
            self._join(trace_id, result, e.beacon, e.received_s)
            return True
        self._schedule(WAIT_S, lambda: self._expire(trace_id, e))  # first: it may raise
        e.result = result
        self.parked += 1
        while self.parked > MAX_PARKED:
            oldest = next(t for t, x in self.expected.items() if x.result is not None)
            self._forget(oldest, self.expected.pop(oldest), "too many records waited")
        return True

    def admit(self, trace_id: str, origin: str | None) -> Answer | None:
        """Whether a beacon for `trace_id` from `origin` (None: it named none) may be checked
        and joined: None, else the refusal. Refusing before the beacon is checked keeps a flood
        for traces nobody announced cheap (one JSON parse each)."""
        e = self.expected.get(trace_id)
        if e is None:
            done = self.finished.get(trace_id)
            if done == BeaconOutcome.JOINED:
                return Answer(
                    status=409, message="this trace's beacon came already",
                    outcome=BeaconOutcome.DUPLICATE,
                )  # fmt: skip
            if done is not None:
                return Answer(
                    status=410,
                    message=f"this trace's record was written already ({done}): the beacon "
                    f"came more than {WAIT_S:g} s after its stream ended",
                    outcome=BeaconOutcome.LATE,
                )
            return Answer(
                status=404,
                message="no request of this trace announced a beacon here (its page's fetch "
                "must go through this hop with the snippet's tracestate)",
                outcome=BeaconOutcome.UNKNOWN_TRACE,
            )
        if origin is None or origin != e.origin:
            return Answer(
                status=403,
                message=f"beacon from {origin or 'no origin'}, but its request came from "
                f"{e.origin or 'no origin'}: only the page that made the request may send it",
                outcome=BeaconOutcome.WRONG_ORIGIN,
            )
        if e.beacon is not None:
            return Answer(
                status=409, message="this trace's beacon came already",
                outcome=BeaconOutcome.DUPLICATE,
            )  # fmt: skip
        return None

    def beacon(self, b: Beacon, origin: str | None, received_s: float) -> Answer:
        """A checked beacon arrived from `origin` (None: it named none)."""
        refused = self.admit(b.trace_id, origin)
        if refused is not None:
            return refused
        e = self.expected[b.trace_id]
        if e.result is not None:
            del self.expected[b.trace_id]
            self.parked -= 1
            self._join(b.trace_id, e.result, b, received_s)
            return Answer(status=204, message="", outcome=None)
        e.beacon, e.received_s = b, received_s
        self.waiting += 1
        while self.waiting > MAX_WAITING_BEACONS:
            oldest = next(t for t, x in self.expected.items() if x.beacon is not None)
            self.expected[oldest].beacon = None
            self.waiting -= 1
            self._count(BeaconOutcome.DROPPED)
        return Answer(status=202, message="", outcome=None)

    def drain(self) -> None:
        """Write every parked record now (the proxy is stopping)."""
        for trace_id, e in list(self.expected.items()):
            self._forget(trace_id, e, "hopmeter stopped before the beacon came")
        self.expected.clear()
        self.parked = self.waiting = 0

    def _join(self, trace_id: str, result: FlowResult, b: Beacon, received_s: float) -> None:
        self._finish(trace_id, BeaconOutcome.JOINED)
        self._count(BeaconOutcome.JOINED)
        try:
            joined = join_beacon(result.record, b, received_s, log_content=self.log_content)
            result = attach_beacon(result, joined)
        except Exception as exc:  # a bug in joining loses the lanes, never the record
            self._on_error("browser", exc)
            result = missing_beacon(result, f"joining the beacon failed: {type(exc).__name__}")
        self._write(result)

    def _expire(self, trace_id: str, e: Expected) -> None:
        if self.expected.get(trace_id) is not e or e.result is None:
            return  # joined meanwhile, or pushed out
        del self.expected[trace_id]
        self._forget(trace_id, e, f"no beacon within {WAIT_S:g} s of the stream's end")

    def _forget(self, trace_id: str, e: Expected, why: str) -> None:
        """`e` leaves the tables: its parked record is written without the lanes."""
        if e.beacon is not None:
            self.waiting -= 1
            self._count(BeaconOutcome.DROPPED)
        if e.result is not None:
            self.parked -= 1
            self._finish(trace_id, BeaconOutcome.MISSING)
            self._count(BeaconOutcome.MISSING)
            self._write(missing_beacon(e.result, why))

    def _write(self, result: FlowResult) -> None:
        assert self._emit is not None  # a record is held only by `take`, which sets it
        self._emit(result)

    def _finish(self, trace_id: str, outcome: BeaconOutcome) -> None:
        self.finished[trace_id] = outcome
        while len(self.finished) > MAX_FINISHED:
            self.finished.popitem(last=False)
