"""Live pairing of the flows one request makes through several listeners of this process.

By trace: hopmeter forwards `traceparent` with each flow's own span id, so an inner flow names
the outer one as its parent. A flow whose parent is not a flow of this process (the outermost of
its request) is written last, with a `hops` section, once every other flow of its trace has
finished: the inner flows usually finish first (the inner hop sees the end of the body before the
outer one), so the wait is short; a bounded timeout writes it without waiting longer. The
segments follow the parent links (hopmeter.core.order), so an instrumented client's calls that
share one trace pair each with its own inner flows; where no link joins two flows of a request,
the listeners' order (outermost first) or what links taught says which is outer, never a clock.

By content, when this process has listeners of two or more hops (`hops`): a gateway between them
that drops `traceparent` gives the inner flow a trace of its own, so a trace that closes seen at
fewer than every hop waits, pending, until nothing that could still turn out to be the same reply
is in flight (hopmeter.core.matching decides, and never pairs two different replies). A flow in
flight cannot be the same reply once its text so far departs from the pending reply's opening or
outgrows its length, so unrelated streams in flight do not hold records back. Then every flow of
the decided requests is written with a `pairing` field, the outermost with its `hops`, and a
segment paired by content gets a `trace_context_dropped` finding and, once per interval, a log
line.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hopmeter.core.fingerprint import Fingerprint
from hopmeter.core.hops import Segment, chained
from hopmeter.core.matching import (
    LIVE_SLACK_S,
    match_records,
    segments,
    trace_dropped,
    with_findings,
    without_content,
)
from hopmeter.core.order import HopOrder
from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import SegmentOrder
from hopmeter.log import get_logger

log = get_logger()

# Traces tracked at once. A trace is forgotten when its last flow finishes; this bound only
# matters if flows are never finished (it drops the oldest).
MAX_TRACES = 8192
# How long the outer record waits for inner flows that have not finished. An inner flow finishes
# before the outer one unless something between them is broken; 30 s covers a slow tail. A
# request waiting to be paired by content waits at most this long too, then is written unpaired
# (ambiguous) if a flow that could be the same reply is still in flight.
PARK_TIMEOUT_S = 30.0
# Requests waiting to be paired by content. Each holds its finished records (a few KB); past the
# bound, groups are decided at once (as on the timeout) until it holds again.
MAX_PENDING = 4096
# While requests wait, how often flows in flight are looked at again (their text grows and may
# rule them out); a finishing flow looks at once.
RECHECK_S = 0.1
# Records handed out in one turn of the loop when many requests are decided at once (a reply
# many clients got alike, decided when the last of them ends): each costs ~1 ms to write, and a
# turn of the loop every stream shares should stay well under a display frame (16.7 ms).
RECORDS_PER_TURN = 4
# One log line per segment that drops the trace context, then at most one per this many seconds.
TRACE_DROP_LOG_INTERVAL_S = 60.0
# one process's wall and monotonic clocks disagreeing on the gaps between its flows' starts by
# more than this: the wall clock stepped (reading either clock twice differs by microseconds)
WALL_STEP_S = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveFlow:
    """A flow still in flight, as far as content pairing needs it."""

    trace_id: str
    t_start: float
    opening: str  # its visible text so far, up to the fingerprint's opening
    chars: int  # visible characters so far


@dataclass(slots=True)
class _Trace:
    # flows in flight: their key (span id) -> (request start, parent span id)
    live: dict[str, tuple[float, str | None]] = field(default_factory=dict)
    spans: set[str] = field(default_factory=set)  # span ids of this trace's flows here
    done: list[FlowResult] = field(default_factory=list)
    parked: list[FlowResult] = field(default_factory=list)  # outermost flows that ended first
    timer: bool = False  # a timeout is set for the parked ones


def _key(span_id: object, t_start: float) -> str:
    """A flow's key in its trace: its span id (a record read from elsewhere may have none)."""
    return span_id if isinstance(span_id, str) and span_id else f"@{t_start!r}"


@dataclass(slots=True)
class _Unit:
    """The finished flows of one trace, waiting to be paired by content."""

    results: list[FlowResult]
    since: float  # clock() when it began to wait
    trace_id: str = ""
    key: tuple[str, int] | None = None
    opening: str = ""
    t_start: float = 0.0
    t_end: float = 0.0

    def __post_init__(self) -> None:
        outer = min(self.results, key=lambda r: r.record["request"]["t_start"])
        self.trace_id = str(outer.record.get("trace_id"))
        fp = Fingerprint.from_record(outer.record)
        self.key = None if fp is None else fp.key
        self.opening = outer.opening
        self.t_start = min(_start(r) for r in self.results)
        self.t_end = max(_end(r) for r in self.results)

    def could_be(self, flow: LiveFlow) -> bool:
        """Whether a flow in flight may still turn out to carry this unit's reply."""
        if self.key is None or flow.trace_id == self.trace_id:
            return False
        if flow.t_start > self.t_end + LIVE_SLACK_S:
            return False  # started after this request ended: neither its outer nor its inner
        if flow.chars > self.key[1]:
            return False
        n = min(len(flow.opening), len(self.opening))
        return flow.opening[:n] == self.opening[:n]


def on_one_clock(results: Sequence[FlowResult]) -> list[dict[str, Any]]:
    """The records of one process's flows, for aligning them as read from one clock. Their
    wall-clock starts, unless the wall clock stepped between them (NTP, a suspended VM: the two
    clocks disagree on their gaps by more than WALL_STEP_S): then each start moves to where the
    process's monotonic clock puts it, one wall reading (the first record's) anchoring them all,
    so that a step does not become hours of hold. Records without a monotonic start (read back,
    a test's) are taken as they are."""
    records = [r.record for r in results]
    if not results or any(r.mono_start_s is None for r in results):
        return records
    first = results[0]
    anchor = float(first.record["request"]["t_start"]) - (first.mono_start_s or 0.0)
    starts = [anchor + (r.mono_start_s or 0.0) for r in results]
    walls = [float(rec["request"]["t_start"]) for rec in records]
    if all(abs(a - b) < WALL_STEP_S for a, b in zip(starts, walls, strict=True)):
        return records  # one clock's gaps either way: the records' own, to the microsecond
    return [
        {**rec, "request": {**rec["request"], "t_start": t}}
        for rec, t in zip(records, starts, strict=True)
    ]


def _start(r: FlowResult) -> float:
    return float(r.record["request"]["t_start"])


def _end(r: FlowResult) -> float:
    resp = r.record.get("response") or {}
    ends = [resp.get("t_last_byte"), r.record["request"].get("t_end"), _start(r)]
    return max(float(t) for t in ends if isinstance(t, int | float))


class Pairing:
    """Groups finished flows by trace id (and by content, across hops) and attaches per-segment
    holds to the outermost."""

    def __init__(
        self,
        schedule: Callable[[float, Callable[[], None]], object] | None = None,
        emit: Callable[[FlowResult], None] | None = None,
        *,
        in_flight: Callable[[], Iterable[LiveFlow]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        soon: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        """`schedule(delay_s, fn)` runs `fn` later and `soon(fn)` on the loop's next turn; `emit`
        writes a record decided outside `finish` (a timeout, a recheck, a later turn). Without
        `soon`, everything decided is handed out at once."""
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._schedule = schedule
        self._emit = emit
        self._in_flight = in_flight
        self._clock = clock
        self.hops: frozenset[str] = frozenset()  # this process's hops: content pairing at 2+
        # which hop is outer where no parent link says: the listeners' order, and what links
        # between the same hops showed
        self.order = HopOrder()
        self._pending: list[_Unit] = []
        self._recheck = False  # a recheck timer is set
        self._logged: dict[str, tuple[float, int]] = {}  # segment -> (last line, since then)
        self._soon = soon
        # decided requests whose records are still to be handed out, one item per loop turn:
        # each gives its records (computing a paired request's segments when its turn comes)
        self._turns: deque[Callable[[], list[FlowResult]]] = deque()
        self._turn_set = False  # a turn is scheduled

    @property
    def by_content(self) -> bool:
        """Whether flows are paired by content too (listeners of two or more hops)."""
        return len(self.hops) > 1

    def start(
        self, trace_id: str, t_start: float, span_id: str = "", parent_span_id: str | None = None
    ) -> None:
        """A flow of `trace_id` began (its request started at `t_start`; its own span and its
        parent's, as it forwarded and received them in `traceparent`)."""
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _Trace()
            while len(self._traces) > MAX_TRACES:
                self._traces.popitem(last=False)
        key = _key(span_id, t_start)
        trace.live[key] = (t_start, parent_span_id)
        trace.spans.add(key)

    def take(self, result: FlowResult, then: Callable[[FlowResult], None]) -> None:
        """A wait of a flow's end (hopmeter.proxy.addon.ending): hand the records that can be
        written now to `then`, in order; those decided later (a timeout, a recheck, a later
        turn) go to `then` too (every take of one chain passes the same `then`)."""
        self._emit = then
        for r in self.finish(result):
            then(r)

    def finish(self, result: FlowResult) -> list[FlowResult]:
        """A flow finished: the records that can be written now, in order."""
        rec = result.record
        trace_id = rec.get("trace_id")
        trace = self._traces.get(trace_id) if isinstance(trace_id, str) else None
        if trace is None or not isinstance(trace_id, str):
            return self._lone(result)
        t_start = rec["request"]["t_start"]
        if trace.live.pop(_key(rec.get("span_id"), t_start), None) is None:
            # started without its span id: known by its request start
            key = next((k for k, (t, _) in trace.live.items() if t == t_start), None)
            if key is not None:
                del trace.live[key]
        trace.done.append(result)
        if trace.live:
            if rec.get("parent_span_id") not in trace.spans:
                # the outermost flow of its request ended first: wait for the inner ones
                trace.parked.append(result)
                if self._schedule is not None and not trace.timer:
                    trace.timer = True
                    self._schedule(PARK_TIMEOUT_S, lambda: self._expire(trace_id))
                return []
            if self.by_content:
                return []  # the whole trace is decided together when it closes
            return [result]
        if self.by_content:
            self._traces.pop(trace_id)
            self._wait(trace.done)
            return self._hand_out()
        return self._close(trace_id, result)

    def _lone(self, result: FlowResult) -> list[FlowResult]:
        if not self.by_content:
            return [result]
        self._wait([result])
        return self._hand_out()

    def _close(self, trace_id: str, last: FlowResult) -> list[FlowResult]:
        trace = self._traces.pop(trace_id)
        out = [*trace.parked, last]
        if len(trace.done) < 2:
            return out
        return self._with_hops(out, trace.done)

    def _with_hops(self, out: list[FlowResult], done: list[FlowResult]) -> list[FlowResult]:
        """`out` with each request's outermost record carrying the segments of its chain."""
        heads: dict[int, FlowResult] = {}
        for c, links in chained(on_one_clock(done), self.order, one_clock=True):
            segs = [s for _, s in links]
            self._learn(segs)
            if segs:
                heads[id(done[c.head])] = attach(done[c.head], segs)
        return [heads.get(id(r), r) for r in out]

    def _learn(self, segs: Iterable[Segment]) -> None:
        """Remember the order of hops that parent links joined."""
        for s in segs:
            if s.order == SegmentOrder.LINK:
                self.order.learn(s.outer_hop, s.inner_hop)

    def drain(self) -> None:
        """Write every parked and pending record now (the proxy is stopping)."""
        for trace_id in list(self._traces):
            self._expire(trace_id)
        self._traces.clear()
        self._settle_all(force=True)
        while self._turns:
            for r in self._turns.popleft()():
                self._send(r)

    def _expire(self, trace_id: str) -> None:
        trace = self._traces.get(trace_id)
        if trace is None:
            return
        trace.timer = False
        if not trace.parked:
            return
        if self.by_content:  # what finished of the trace waits as one request
            self._traces.pop(trace_id)
            self._wait(trace.done)
            for r in self._hand_out():
                self._send(r)
            return
        parked, trace.parked = trace.parked, []
        for r in self._with_hops(parked, trace.done):
            self._send(r)
        trace.done = [r for r in trace.done if r not in parked]

    def _send(self, result: FlowResult) -> None:
        if self._emit is not None:
            self._emit(result)

    # -- by content ----------------------------------------------------------------------------
    def _wait(self, results: list[FlowResult]) -> None:
        """A trace closed: decide it now if it cannot pair further, else let it wait."""
        if not results:
            return
        unit = _Unit(results, self._clock())
        if {r.record.get("hop") for r in results} >= self.hops:
            # seen at every hop: no other trace can be its partner or make another's ambiguous
            # (candidates share no hop), so nothing in flight can change its pairing
            self._settle([unit], unsure=False)
            return
        self._pending.append(unit)
        self._settle_all()

    def _recheck_later(self) -> None:
        if self._recheck or self._schedule is None or not self._pending:
            return
        self._recheck = True
        self._schedule(RECHECK_S, self._on_recheck)

    def _on_recheck(self) -> None:
        self._recheck = False
        self._settle_all()
        for r in self._hand_out():
            self._send(r)

    def _hand_out(self) -> list[FlowResult]:
        """The records to write now: the first turn's worth of what is decided; the rest go out
        on the loop's next turns (all at once without `soon`)."""
        if self._soon is None:
            out: list[FlowResult] = []
            while self._turns:
                out += self._turns.popleft()()
            return out
        if self._turn_set or not self._turns:
            return []  # a turn is already set: it hands them out in order
        out = self._turns.popleft()()
        if self._turns:
            self._turn_set = True
            self._soon(self._on_turn)
        return out

    def _on_turn(self) -> None:
        self._turn_set = False
        if self._turns:
            for r in self._turns.popleft()():
                self._send(r)
        if self._turns:
            self._turn_set = True
            assert self._soon is not None
            self._soon(self._on_turn)

    def _settle_all(self, *, force: bool = False) -> None:
        """Decide every group of waiting requests that nothing in flight can still join."""
        live = self._live()
        now = self._clock()
        keep: list[_Unit] = []
        overflow = len(self._pending) - MAX_PENDING
        for comp in _components(self._pending):
            blocked = any(u.could_be(f) for u in comp for f in live)
            expired = force or overflow > 0 or any(now - u.since >= PARK_TIMEOUT_S for u in comp)
            if blocked and not expired:
                keep += comp
                continue
            overflow -= len(comp)
            self._settle(comp, unsure=blocked)
        self._pending = keep
        self._recheck_later()

    def _live(self) -> list[LiveFlow]:
        """Every flow not finished here: those in flight with their text so far, and those
        started here that the proxy no longer lists (ended, record not built yet), text unknown."""
        live = list(self._in_flight()) if self._in_flight is not None else []
        seen = {(f.trace_id, f.t_start) for f in live}
        for trace_id, trace in self._traces.items():
            live += [
                LiveFlow(trace_id=trace_id, t_start=t, opening="", chars=0)
                for t, _ in trace.live.values()
                if (trace_id, t) not in seen
            ]
        return live

    def _settle(self, comp: Sequence[_Unit], *, unsure: bool) -> None:
        """Pair one group of waiting requests and give every record its `pairing`; queue their
        records to be handed out, a few per turn, a paired request's with its segments."""
        results = [r for u in comp for r in u.results]
        records = on_one_clock(results)
        matching = match_records(records, LIVE_SLACK_S)
        if unsure:  # a flow that may carry the same reply is still in flight: trace pairs only
            matching = without_content(matching, records)
        out = [
            dataclasses.replace(r, record={**r.record, "pairing": matching.outcomes[i].as_dict()})
            for i, r in enumerate(results)
        ]
        paired = {i for refs in matching.groups for i in refs}
        alone = sorted((r for i, r in enumerate(out) if i not in paired), key=lambda r: -_start(r))
        for k in range(0, len(alone), RECORDS_PER_TURN):
            self._turns.append(partial(list, alone[k : k + RECORDS_PER_TURN]))
        for refs in matching.groups:
            self._turns.append(partial(self._with_segments, [out[i] for i in refs]))

    def _with_segments(self, group: list[FlowResult]) -> list[FlowResult]:
        """One paired group's records, each request's outermost with its segments, inner flows
        first as they finished."""
        out = list(group)
        for members, segs in segments(on_one_clock(group), self.order, one_clock=True):
            self._learn(segs)
            head = members[0]
            dropped = trace_dropped(segs)
            with_hops = attach(group[head], segs)
            if dropped:
                with_hops = dataclasses.replace(
                    with_hops, record=with_findings(with_hops.record, dropped)
                )
                for f in dropped:
                    self._log_dropped(f["evidence"]["segment"])
            out[head] = with_hops
        return sorted(out, key=lambda r: -_start(r))

    def _log_dropped(self, segment: str) -> None:
        """One line per segment, then one per TRACE_DROP_LOG_INTERVAL_S saying how many more."""
        now = self._clock()
        last, more = self._logged.get(segment, (None, 0))
        if last is not None and now - last < TRACE_DROP_LOG_INTERVAL_S:
            self._logged[segment] = (last, more + 1)
            return
        self._logged[segment] = (now, 0)
        log.warning(
            "hopmeter: a hop between these listeners drops the trace context (traceparent); "
            "its flows are paired by their reply text (see the trace_context_dropped finding)",
            segment=segment,
            more_since_last_line=more,
        )


def _components(units: Sequence[_Unit]) -> list[list[_Unit]]:
    """Waiting requests that may pair with each other: the same reply, overlapping in time."""
    by_key: dict[tuple[str, int] | None, list[_Unit]] = defaultdict(list)
    out: list[list[_Unit]] = []
    for u in units:
        if u.key is None:
            out.append([u])
        else:
            by_key[u.key].append(u)
    for same in by_key.values():
        same.sort(key=lambda u: u.t_start)
        comp = [same[0]]
        end = same[0].t_end
        for u in same[1:]:
            if u.t_start <= end + LIVE_SLACK_S:
                comp.append(u)
                end = max(end, u.t_end)
            else:
                out.append(comp)
                comp, end = [u], u.t_end
        out.append(comp)
    return out


def attach(outer: FlowResult, segments: list[Segment]) -> FlowResult:
    """`outer` with its record's `hops` section and the per-token holds for metrics."""
    if not segments:
        return outer
    record = {**outer.record, "hops": [s.as_dict() for s in segments]}
    return dataclasses.replace(outer, record=record, segments=tuple(segments))
