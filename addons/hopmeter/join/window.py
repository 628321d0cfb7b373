"""The join window: hopmeter spans of one trace kept for a bounded time, paired as they arrive.

Pairing follows the span tree, never start times: hopmeter forwards its own span id in
`traceparent`, so the inner hop's span is the outer hop's child whatever the clocks of their
hosts say. A pair is ready the moment its second span arrives, in either order (an inner span
before its outer one is counted out of order). Every link teaches the window which hop is in
front of which; spans of a trace that no link joins (an instrumented proxy between two hops adds
its own span) are put in that order, or the order declared (`--order`), when the trace leaves the
window, as `hopmeter join` does with files; where neither says, they are an unordered pair.

Memory is bounded by the window and by named limits, never by traffic: at most `max_traces`
traces and `max_events` timeline events are held (the oldest traces leave early, counted), and
ended traces leave a tombstone for one more window, so a span that comes after its trace left is
counted late instead of opening a one-sided trace. Time is a parameter (`now`, monotonic
seconds); the window does no I/O and no alignment: the service takes the ready pairs and aligns
them after it has answered the sender.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from hopmeter.core.order import HopOrder, Node, chains
from hopmeter.core.spans import HopSpan
from hopmeter.core.vocab import SegmentOrder, SpanOutcome, TraceOutcome

WINDOW_S = 30.0  # above the SDK's 5 s batch delay plus a Collector's 20 s of retries
# Traces held at once: ~7 KB each with two 200-event spans (bench/results), so ~1.4 GB at most.
MAX_TRACES = 200_000
# Timeline events held at once, ~17 B each in the window (bench/results): ~270 MB. One absurd
# sender could fill MAX_TRACES with 16,384-event spans; this bound holds however spans are sized.
MAX_EVENTS = 16_000_000
# Tombstones are kept for one window in TOMBSTONE_GENERATIONS slices (dropped a slice at a time),
# and never more than this many (~110 B each).
MAX_TOMBSTONES = 400_000
TOMBSTONE_GENERATIONS = 4


@dataclass(frozen=True, slots=True)
class Pair:
    """Two spans of one trace to align: `outer` saw the stream after `inner` did."""

    trace_id: bytes
    outer: HopSpan
    inner: HopSpan
    linked: bool  # by parent link (False: put in order by their hops, or unordered)
    order: SegmentOrder = SegmentOrder.LINK  # UNKNOWN: nothing said which is outer


@dataclass(slots=True)
class _Trace:
    first_seen_s: float
    spans: dict[bytes, HopSpan] = field(default_factory=dict)
    waiting: dict[bytes, list[HopSpan]] = field(default_factory=dict)  # children by parent id
    paired: set[bytes] = field(default_factory=set)  # span ids in at least one pair
    unlinked: bool = False  # some pair was made without a link
    events: int = 0


class JoinWindow:
    """Spans of each trace for `window_s` seconds; pairs out as soon as both sides are in."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        max_traces: int = MAX_TRACES,
        max_events: int = MAX_EVENTS,
        max_tombstones: int = MAX_TOMBSTONES,
        order: HopOrder | None = None,
    ) -> None:
        self.window_s = window_s
        self.order = order or HopOrder()  # declared (--order), and learned from every link
        self.max_traces = max_traces
        self.max_events = max_events
        self.max_tombstones = max_tombstones
        self.spans = dict.fromkeys(SpanOutcome, 0)
        self.traces = dict.fromkeys(TraceOutcome, 0)
        self.out_of_order = 0  # inner spans that arrived before their outer one
        self.held_events = 0
        self._traces: OrderedDict[bytes, _Trace] = OrderedDict()  # by first arrival
        self._ready: list[Pair] = []
        self._tombstones: deque[tuple[float, set[bytes]]] = deque()
        self._tombstone_count = 0

    @property
    def held_traces(self) -> int:
        """Traces in the window now."""
        return len(self._traces)

    @property
    def held_tombstones(self) -> int:
        """Ids of ended traces remembered now."""
        return self._tombstone_count

    def count(self, outcome: SpanOutcome) -> None:
        """Count a span the service turned away before the window (foreign, malformed, ...)."""
        self.spans[outcome] += 1

    def add(self, span: HopSpan, now: float) -> SpanOutcome:
        """File one span; any pair it completes is ready from now on. Its outcome, counted."""
        outcome = self._file(span, now)
        self.spans[outcome] += 1
        return outcome

    def _file(self, span: HopSpan, now: float) -> SpanOutcome:
        tid = span.trace_id
        trace = self._traces.get(tid)
        size = len(span.timeline)
        if trace is None:
            if self._is_tombstone(tid):
                return SpanOutcome.LATE
            if size > self.max_events:
                return SpanOutcome.OVERFLOW
            while len(self._traces) >= self.max_traces:
                self._end(*self._traces.popitem(last=False), TraceOutcome.EVICTED, now)
            trace = self._traces[tid] = _Trace(first_seen_s=now)
        elif span.span_id in trace.spans:
            return SpanOutcome.DUPLICATE
        while self.held_events + size > self.max_events:
            oldest = next(iter(self._traces))
            if oldest == tid:
                return SpanOutcome.OVERFLOW  # this trace alone fills the window
            self._end(oldest, self._traces.pop(oldest), TraceOutcome.EVICTED, now)
        trace.spans[span.span_id] = span
        trace.events += size
        self.held_events += size
        parent = trace.spans.get(span.parent_span_id) if span.parent_span_id else None
        if parent is not None:
            self._pair(tid, trace, parent, span, linked=True)
        elif span.parent_span_id:
            trace.waiting.setdefault(span.parent_span_id, []).append(span)
        for child in trace.waiting.pop(span.span_id, ()):
            self.out_of_order += 1
            self._pair(tid, trace, span, child, linked=True)
        return SpanOutcome.ACCEPTED

    def _pair(
        self,
        tid: bytes,
        trace: _Trace,
        outer: HopSpan,
        inner: HopSpan,
        *,
        linked: bool,
        order: SegmentOrder = SegmentOrder.LINK,
    ) -> None:
        trace.paired.update((outer.span_id, inner.span_id))
        if linked:
            self.order.learn(outer.hop, inner.hop)
        self._ready.append(Pair(tid, outer, inner, linked, order))

    def take_ready(self) -> list[Pair]:
        """The pairs completed since the last call, in the order they completed."""
        ready, self._ready = self._ready, []
        return ready

    def expire(self, now: float) -> None:
        """End every trace whose window has passed, and drop tombstones a window old."""
        while self._traces:
            tid, trace = next(iter(self._traces.items()))
            if now - trace.first_seen_s < self.window_s:
                break
            del self._traces[tid]
            self._end(tid, trace, None, now)
        horizon = now - self.window_s - self.window_s / TOMBSTONE_GENERATIONS
        while self._tombstones and self._tombstones[0][0] < horizon:
            self._tombstone_count -= len(self._tombstones.popleft()[1])

    def close(self, now: float) -> None:
        """End every trace still in the window: the service is stopping."""
        while self._traces:
            self._end(*self._traces.popitem(last=False), TraceOutcome.LOST, now)

    def _end(self, tid: bytes, trace: _Trace, early: TraceOutcome | None, now: float) -> None:
        """Count how a trace ended (`early`: why it left before its window passed)."""
        self.held_events -= trace.events
        spans = list(trace.spans.values())
        linked = bool(trace.paired)
        if len(spans) > 1 and len(trace.paired) < len(spans) and early is None:
            self._order_the_rest(tid, trace, spans)
        if trace.paired and not linked:
            self.traces[TraceOutcome.UNLINKED] += 1
        elif linked and len(trace.paired) == len(spans) and not trace.unlinked:
            self.traces[TraceOutcome.JOINED] += 1
        elif early is not None:
            self.traces[early] += 1
        elif trace.paired:
            self.traces[TraceOutcome.PARTLY_JOINED] += 1
        else:
            self.traces[TraceOutcome.ONE_SIDED] += 1
        self._bury(tid, now)

    def _order_the_rest(self, tid: bytes, trace: _Trace, spans: list[HopSpan]) -> None:
        """Pair the spans no link joined, by the order of their hops (hopmeter.core.order)."""
        nodes = [Node(s.hop, s.span_id, s.parent_span_id) for s in spans]
        for c in chains(nodes, self.order):
            for link in c.links:
                if link.order != SegmentOrder.LINK:
                    trace.unlinked = True
                    outer, inner = spans[link.outer], spans[link.inner]
                    self._pair(tid, trace, outer, inner, linked=False, order=link.order)

    def _bury(self, tid: bytes, now: float) -> None:
        step = self.window_s / TOMBSTONE_GENERATIONS
        if not self._tombstones or now - self._tombstones[-1][0] >= step:
            self._tombstones.append((now, set()))
        self._tombstones[-1][1].add(tid)
        self._tombstone_count += 1
        while self._tombstone_count > self.max_tombstones and self._tombstones:
            self._tombstone_count -= len(self._tombstones.popleft()[1])

    def _is_tombstone(self, tid: bytes) -> bool:
        return any(tid in ids for _, ids in self._tombstones)
