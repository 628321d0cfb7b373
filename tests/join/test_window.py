"""The join window: pairs by parent link in either order, outcomes counted, bounds held."""

from __future__ import annotations

from array import array

from hopmeter.core.order import HopOrder
from hopmeter.core.spans import HopSpan
from hopmeter.core.timeline import Timeline
from hopmeter.core.vocab import SegmentOrder, SpanOutcome, TraceOutcome
from hopmeter.join.window import JoinWindow

T1 = b"\x01" * 16
T2 = b"\x02" * 16


def span(
    trace: bytes, sid: int, parent: int = 0, *, start_ns: int = 10**18, events: int = 3
) -> HopSpan:
    """A hopmeter span of `events` one-token events; ids are small ints."""
    return HopSpan(
        trace_id=trace,
        span_id=sid.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        hop=f"hop{sid}",
        start_ns=start_ns,
        timeline=Timeline(
            t_us=array("i", range(1, events + 1)),
            offset=array("i", range(1, events + 1)),
            tokens=None,
            dropped=0,
            span_us=None,
        ),
        ttft_s=None,
        itl_p50_s=None,
        finding_kinds=frozenset(),
    )


def test_a_child_after_its_parent_makes_a_linked_pair() -> None:
    """The origin's span, the edge's child, completes the pair when it arrives."""
    w = JoinWindow(window_s=10)
    assert w.add(span(T1, 1), 0.0) is SpanOutcome.ACCEPTED
    assert w.take_ready() == []
    w.add(span(T1, 2, parent=1), 0.1)
    (pair,) = w.take_ready()
    assert (pair.outer.hop, pair.inner.hop, pair.linked, pair.trace_id) == (
        "hop1",
        "hop2",
        True,
        T1,
    )
    assert w.out_of_order == 0


def test_a_child_before_its_parent_waits_and_is_counted_out_of_order() -> None:
    """An inner hop's span that arrives first is paired when its parent comes."""
    w = JoinWindow(window_s=10)
    w.add(span(T1, 2, parent=1), 0.0)
    w.add(span(T1, 1), 0.1)
    (pair,) = w.take_ready()
    assert (pair.outer.hop, pair.inner.hop) == ("hop1", "hop2")
    assert w.out_of_order == 1


def test_a_chain_of_three_hops_gives_two_pairs_and_ends_joined() -> None:
    """edge -> mid -> origin, arriving inner first, pairs twice; the trace ends joined."""
    w = JoinWindow(window_s=1)
    for s in (span(T1, 3, parent=2), span(T1, 2, parent=1), span(T1, 1)):
        w.add(s, 0.0)
    assert [(p.outer.hop, p.inner.hop) for p in w.take_ready()] == [
        ("hop2", "hop3"),
        ("hop1", "hop2"),
    ]
    w.expire(1.0)
    assert w.traces[TraceOutcome.JOINED] == 1 and w.held_traces == 0 and w.held_events == 0


def test_duplicates_and_late_spans_are_counted_not_kept() -> None:
    """The same span again is a duplicate; a span of a trace that left the window is late."""
    w = JoinWindow(window_s=1)
    w.add(span(T1, 1), 0.0)
    assert w.add(span(T1, 1), 0.5) is SpanOutcome.DUPLICATE
    w.expire(1.0)
    assert w.traces[TraceOutcome.ONE_SIDED] == 1
    assert w.add(span(T1, 2, parent=1), 1.1) is SpanOutcome.LATE
    assert w.take_ready() == [] and w.held_traces == 0
    assert w.spans[SpanOutcome.ACCEPTED] == 1


def test_tombstones_last_one_window() -> None:
    """After a window more, a trace id opens a new trace instead of being late."""
    w = JoinWindow(window_s=1)
    w.add(span(T1, 1), 0.0)
    w.expire(1.0)
    w.expire(2.5)
    assert w.add(span(T1, 2, parent=1), 2.5) is SpanOutcome.ACCEPTED


def test_spans_without_links_are_unordered_when_nothing_says_their_order() -> None:
    """Two spans of one trace with no parent link between them, of hops no link or declaration
    puts in order, leave the window as an unordered pair (listed by hop name), counted
    unlinked: their request starts do not decide."""
    w = JoinWindow(window_s=1)
    w.add(span(T1, 2, parent=9, start_ns=10**18), 0.0)
    w.add(span(T1, 1, parent=8, start_ns=10**18 + 1000), 0.0)
    assert w.take_ready() == []
    w.expire(1.0)
    (pair,) = w.take_ready()
    assert (pair.outer.hop, pair.inner.hop, pair.linked) == ("hop1", "hop2", False)
    assert pair.order == SegmentOrder.UNKNOWN
    assert w.traces[TraceOutcome.UNLINKED] == 1


def test_unlinked_spans_take_the_order_links_taught_or_the_declared_one() -> None:
    """A linked pair of two hops teaches their order: a later trace of the same hops without a
    link is paired in it ("learned"), whatever its spans' starts; a declared order serves hops
    no link has joined yet."""
    w = JoinWindow(window_s=1, order=HopOrder(["hop5", "hop4"]))
    w.add(span(T2, 2), 0.0)
    w.add(span(T2, 1, parent=2), 0.0)  # hop2 is outer of hop1
    w.take_ready()
    w.add(span(T1, 1, parent=8, start_ns=10**18), 0.0)
    w.add(span(T1, 2, parent=9, start_ns=10**18 + 1000), 0.0)
    w.add(span(b"\x03" * 16, 4, start_ns=10**18), 0.0)
    w.add(span(b"\x03" * 16, 5, start_ns=10**18 + 1000), 0.0)
    w.expire(1.0)
    got = {(p.outer.hop, p.inner.hop, p.order) for p in w.take_ready()}
    assert got == {("hop2", "hop1", "learned"), ("hop5", "hop4", "declared")}


def test_partly_joined_traces_are_told_apart() -> None:
    """A trace where one span found its neighbour and another did not is partly joined."""
    w = JoinWindow(window_s=1)
    for s in (span(T1, 1), span(T1, 2, parent=1), span(T1, 7, parent=6)):
        w.add(s, 0.0)
    w.expire(1.0)
    assert w.traces[TraceOutcome.PARTLY_JOINED] == 1


def test_the_trace_bound_evicts_the_oldest_early() -> None:
    """Past max_traces the oldest trace leaves early, counted evicted (or joined if it was)."""
    w = JoinWindow(window_s=100, max_traces=2)
    w.add(span(T1, 1), 0.0)
    w.add(span(T1, 2, parent=1), 0.0)
    w.add(span(T2, 3), 0.0)
    w.add(span(b"\x03" * 16, 4), 0.0)
    w.add(span(b"\x04" * 16, 5), 0.0)
    assert w.held_traces == 2
    assert w.traces[TraceOutcome.JOINED] == 1 and w.traces[TraceOutcome.EVICTED] == 1


def test_the_event_bound_holds_whatever_the_spans_size() -> None:
    """Held events never pass max_events: old traces leave, and a span too big alone overflows."""
    w = JoinWindow(window_s=100, max_events=10)
    w.add(span(T1, 1, events=6), 0.0)
    w.add(span(T2, 2, events=6), 0.0)
    assert w.held_events == 6 and w.traces[TraceOutcome.EVICTED] == 1
    assert w.add(span(b"\x03" * 16, 3, events=11), 0.0) is SpanOutcome.OVERFLOW
    assert w.add(span(T2, 4, parent=2, events=5), 0.0) is SpanOutcome.OVERFLOW
    assert w.held_events == 6


def test_close_counts_what_was_still_waiting_as_lost() -> None:
    """At a stop, one-sided traces are lost; joined ones stay joined."""
    w = JoinWindow(window_s=100)
    w.add(span(T1, 1), 0.0)
    w.add(span(T1, 2, parent=1), 0.0)
    w.add(span(T2, 3), 0.0)
    w.close(1.0)
    assert w.traces[TraceOutcome.JOINED] == 1 and w.traces[TraceOutcome.LOST] == 1
    assert w.held_traces == 0


def test_a_flood_leaves_nothing_behind_after_two_windows() -> None:
    """Many one-sided traces: all counted, and nothing (traces, events, tombstones) remains."""
    w = JoinWindow(window_s=1, max_tombstones=1000)
    for i in range(5000):
        w.add(span(i.to_bytes(16, "big"), 1), i / 5000)
    w.expire(2.0)
    w.expire(3.5)
    assert w.traces[TraceOutcome.ONE_SIDED] == 5000
    assert (w.held_traces, w.held_events, w.held_tombstones) == (0, 0, 0)


def test_count_records_spans_turned_away_before_the_window() -> None:
    """Foreign and malformed spans the service read are counted here too."""
    w = JoinWindow()
    w.count(SpanOutcome.FOREIGN)
    w.count(SpanOutcome.MALFORMED)
    assert (w.spans[SpanOutcome.FOREIGN], w.spans[SpanOutcome.MALFORMED]) == (1, 1)
