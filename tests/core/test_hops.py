"""Per-token holds from two vantage points, aligned by content offset, with bounded clock skew."""

from __future__ import annotations

from typing import Any

import pytest

from hopmeter.core.hops import (
    HopFlow,
    Segment,
    align,
    chain,
    chained,
    estimate_skew,
    median_or_none,
    skew_bounds,
    with_suspects,
)
from hopmeter.core.order import HopOrder
from hopmeter.core.vocab import SkewBasis


def record(hop: str, t_start: float, events: list[list[float]], **fig: Any) -> dict[str, Any]:
    return {
        "hop": hop,
        "request": {"t_start": t_start},
        "response": {},
        "events": events,
        "figures": fig,
        "findings": [{"kind": k} for k in fig.pop("kinds", [])],
    }


def steady(n: int, gap: float, start: float, offset_per: int = 5) -> list[list[float]]:
    return [[start + i * gap, 1, (i + 1) * offset_per] for i in range(n)]


def test_streaming_segment_holds_each_token_briefly() -> None:
    """An outer hop that sees each token 1 ms after the inner one holds every token 1 ms."""
    inner = record("origin", 1000.001, steady(20, 0.05, 0.1))
    outer = record("edge", 1000.0, steady(20, 0.05, 0.102))
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert seg.segment == "edge>origin"
    assert all(h == pytest.approx(0.001, abs=1e-9) for h in seg.holds_s)
    assert not seg.whole_body
    d = seg.as_dict()
    assert d["tokens_aligned"] == 20
    assert d["hold_p50_s"] == pytest.approx(0.001)


def test_whole_body_hold_shows_on_the_segment() -> None:
    """A segment that releases everything at the end holds the first token for the whole span."""
    inner = record("origin", 1000.001, steady(40, 0.05, 0.1))
    outer = record("edge", 1000.0, [[2.2 + i * 1e-5, 1, (i + 1) * 5] for i in range(40)])
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert seg.whole_body
    assert seg.first_token_hold_s == pytest.approx(2.2 - 0.101, abs=1e-6)
    assert seg.holds_s[-1] == pytest.approx(2.2 + 39e-5 - 0.101 - 39 * 0.05, abs=1e-6)
    assert {
        "kind": "whole_body_hold",
        "introduced_by": "edge>origin",
        "first_token_hold_s": seg.first_token_hold_s,
    } in seg.findings


def test_coalescing_between_hops_aligns_by_content() -> None:
    """An outer hop that sees two inner events in one aligns each token to when it arrived."""
    inner = record("origin", 0.0, [[0.1, 1, 5], [0.2, 1, 10], [0.3, 1, 15], [0.4, 1, 20]])
    outer = record("edge", 0.0, [[0.21, 2, 10], [0.41, 2, 20]])
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert seg.holds_s == pytest.approx((0.11, 0.01, 0.11, 0.01))


def test_skew_is_bounded_by_causality() -> None:
    """A clock 2 s ahead at the inner host is corrected within the causal bounds."""
    inner = record("origin", 1002.001, steady(10, 0.05, 0.1))  # its clock runs 2 s ahead
    outer = record("edge", 1000.0, steady(10, 0.05, 0.102))
    lower, upper = skew_bounds(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert lower is not None and upper is not None
    assert lower <= 2.0 <= upper
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert all(h >= 0 for h in seg.holds_s)
    assert max(seg.holds_s) < 0.01


def test_known_skew_limits_narrow_the_bounds() -> None:
    """Bounds the caller knows from elsewhere narrow the causal ones; equal limits (one clock)
    fix the skew whatever the events say."""
    inner = record("origin", 1002.001, steady(10, 0.05, 0.1))
    outer = record("edge", 1000.0, steady(10, 0.05, 0.102))
    o, i = HopFlow.from_record(outer), HopFlow.from_record(inner)
    lower, upper = skew_bounds(o, i)
    assert lower is not None and upper is not None
    narrowed = align(o, i, (None, upper - 0.0005))
    assert narrowed.skew_bounds_s == (lower, pytest.approx(upper - 0.0005))
    fixed = align(o, i, (0.0, 0.0))
    assert fixed.skew_bounds_s == (0.0, 0.0) and fixed.skew_s == 0.0
    assert min(fixed.holds_s) < -1.9  # the events disagree: one clock was claimed
    (suspect,) = fixed.findings
    assert suspect["kind"] == "alignment_suspect"
    assert suspect["evidence"]["negative"] == {"hold": 10}
    assert fixed.as_dict()["hold_uncertainty_s"] == [0.0, 0.0]


def test_segment_findings_are_those_the_segment_introduced() -> None:
    """Bursts at the edge but not at the origin belong to the segment; ITL falling is the tell."""
    inner = record(
        "origin", 0.0, steady(20, 0.05, 0.1), itl_p50_s=0.05, ttft_s=0.1, kinds=["stall"]
    )
    outer = record(
        "edge",
        0.0,
        steady(20, 0.05, 0.5),
        itl_p50_s=0.001,
        ttft_s=0.5,
        kinds=["burst_gaps", "stall"],
    )
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    kinds = [f["kind"] for f in seg.findings]
    assert kinds == ["burst_gaps", "segment_batching"]


def linked(rec: dict[str, Any], span: str, parent: str | None) -> dict[str, Any]:
    return {**rec, "span_id": span, "parent_span_id": parent, "flow_id": f"f-{span}"}


def test_chain_follows_parent_links_whatever_the_clocks_say() -> None:
    """Three hops linked by their spans give two segments, outermost first, even where the inner
    hosts' clocks say their requests started first."""
    recs = [
        linked(record("b", 0.5, steady(5, 0.1, 0.2)), "bb", "aa"),
        linked(record("a", 1.0, steady(5, 0.1, 1.3)), "aa", "client"),
        linked(record("c", 0.2, steady(5, 0.1, 0.1)), "cc", "bb"),
    ]
    segs = chain(recs)
    assert [(s.segment, s.order, s.inner_flow_id) for s in segs] == [
        ("a>b", "link", "f-bb"),
        ("b>c", "link", "f-cc"),
    ]


def test_unlinked_hops_are_unordered_unless_their_order_is_known() -> None:
    """Two flows of one request with no link between them: an unordered pair (named by hop,
    no holds, a segment_unordered finding) unless a declared or learned order says which hop is
    in front; the clocks never decide."""
    recs = [
        linked(record("origin", 999.0, steady(5, 0.1, 0.1)), "oo", "proxy-span"),
        linked(record("edge", 1000.0, steady(5, 0.1, 0.3)), "ee", None),
    ]
    (seg,) = chain(recs)
    assert seg.segment == "edge~origin" and seg.order == "unknown" and seg.holds_s == ()
    assert [f["kind"] for f in seg.findings] == ["segment_unordered"]
    d = seg.as_dict()
    assert d["tokens_aligned"] == 0 and d["request_delay_s"] is None and d["hold_p50_s"] is None
    (declared,) = chain(recs, HopOrder(["edge", "origin"]))
    assert (declared.segment, declared.order) == ("edge>origin", "declared")
    learned = HopOrder(["origin", "edge"])  # a link outranks the declaration
    learned.learn("edge", "origin")
    (seg,) = chain(recs, learned)
    assert (seg.segment, seg.order) == ("edge>origin", "learned")


def test_a_trace_shared_by_two_requests_pairs_each_by_its_links() -> None:
    """An instrumented client's two calls in one trace: each edge flow pairs with the origin
    flow that names it as parent, and the two requests are never stitched together."""
    recs = [
        linked(record("edge", 1.0, steady(5, 0.1, 0.3)), "e1", "client"),
        linked(record("edge", 1.01, steady(5, 0.1, 0.3)), "e2", "client"),
        linked(record("origin", 1.02, steady(5, 0.1, 0.1)), "o2", "e2"),
        linked(record("origin", 1.001, steady(5, 0.1, 0.1)), "o1", "e1"),
    ]
    found = {
        recs[c.head]["span_id"]: [s.inner_flow_id for _, s in segs] for c, segs in chained(recs)
    }
    assert found == {"e1": ["f-o1"], "e2": ["f-o2"]}


def test_the_inner_hops_own_hold_and_the_wire_are_told_apart() -> None:
    """Where the inner hop followed its bytes out, each hold splits into its own read -> out and
    the wire's out -> the outer hop's read; the old hold keeps its meaning (their sum)."""
    events = steady(10, 0.05, 0.1)
    inner = record("origin", 1000.0, events)
    inner["chunks"] = [[e[0], 100] for e in events]
    # the origin's process held each chunk 0.2 ms, except the fourth: 30 ms
    inner["chunks_out"] = [
        [e[0] + (0.03 if i == 3 else 0.0002), None] for i, e in enumerate(events)
    ]
    outer = record(
        "edge",
        1000.0,
        [[e[0] + (0.031 if i == 3 else 0.0012), 1, e[2]] for i, e in enumerate(events)],
    )
    d = align(HopFlow.from_record(outer), HopFlow.from_record(inner)).as_dict()
    assert d["tokens_out"] == d["tokens_aligned"] == 10
    assert d["inner_hold_p50_s"] == pytest.approx(0.0002)
    assert d["inner_hold_max_s"] == pytest.approx(0.03)
    assert d["wire_hold_max_s"] == pytest.approx(0.001)
    assert d["hold_max_s"] == pytest.approx(0.031)  # unchanged: inner own + wire


def test_without_out_times_the_split_is_empty() -> None:
    """A record from a hopmeter that did not follow its bytes out has no split, only the hold."""
    inner = record("origin", 1000.001, steady(5, 0.05, 0.1))
    outer = record("edge", 1000.0, steady(5, 0.05, 0.102))
    d = align(HopFlow.from_record(outer), HopFlow.from_record(inner)).as_dict()
    assert d["tokens_out"] == 0 and d["wire_hold_p99_s"] is None and d["inner_hold_max_s"] is None
    assert d["tokens_aligned"] == 5


def test_a_capped_inner_timeline_uses_the_whole_streams_token_span() -> None:
    """When the inner hop lists only the head of a long stream, whole_body is judged against
    the whole stream's token span, not the head's."""
    head = steady(10, 0.05, 0.1)  # 0.45 s of a stream that went on for 20 s
    outer = record("edge", 1000.0, [[0.8 + i * 0.05, 1, (i + 1) * 5] for i in range(10)])
    inner = record("origin", 1000.0, head)
    held = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    inner["figures"]["token_span_s"] = 20.0
    whole = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert held.first_token_hold_s == whole.first_token_hold_s == pytest.approx(0.7)
    assert not whole.whole_body  # 0.7 s of a 20 s stream is no whole-body hold


def test_hold_p50_is_a_median_of_two_clusters() -> None:
    """Tokens released in two bursts (held 0.287 s and 1.205 s): an even split has its median
    between them, not at the lower cluster as a nearest rank would say; an odd one at the larger."""
    even = (0.287,) * 20 + (1.205,) * 20
    seg = Segment(
        segment="edge>origin",
        inner_hop="origin",
        holds_s=even,
        first_token_hold_s=0.287,
        whole_body=False,
        skew_s=0.0,
        skew_bounds_s=(None, None),
        findings=(),
    )
    assert seg.as_dict()["hold_p50_s"] == pytest.approx(0.746)
    assert median_or_none((0.287,) * 20 + (1.205,) * 21) == 1.205
    assert median_or_none((0.287,) * 21 + (1.205,) * 20) == 0.287
    assert median_or_none(()) is None


def test_request_delay_and_added_ttft_come_from_the_request_starts() -> None:
    """On one clock the inner hop saw the request 12 ms after the outer one; the segment added
    that plus the first token's hold to the time to first token, and causality bounds the delay."""
    inner = record("origin", 1000.012, steady(10, 0.02, 0.05))
    outer = record("edge", 1000.0, steady(10, 0.02, 0.065))
    d = align(HopFlow.from_record(outer), HopFlow.from_record(inner)).as_dict()
    assert d["request_delay_s"] == pytest.approx(0.012)
    assert d["first_token_hold_s"] == pytest.approx(0.003)
    assert d["added_ttft_s"] == pytest.approx(0.015)
    low, high = d["request_delay_bounds_s"]
    assert low == 0.0 and high == pytest.approx(0.012 + 0.003)
    assert d["paired_by"] == "trace" and d["inner_flow_id"] is None


def test_a_skewed_clock_moves_the_delay_not_the_added_time() -> None:
    """An inner host whose clock runs 0.5 s fast: the skew estimate takes it back out of the
    request delay, and the sum the segment added to the first token is the same."""
    inner = record("origin", 1000.512, steady(10, 0.02, 0.05))
    outer = record("edge", 1000.0, steady(10, 0.02, 0.065))
    d = align(HopFlow.from_record(outer), HopFlow.from_record(inner)).as_dict()
    assert d["added_ttft_s"] == pytest.approx(0.015)
    assert 0.0 <= d["request_delay_s"] <= d["request_delay_bounds_s"][1]


@pytest.mark.parametrize("shift", [2.5, -2.5, 0.05, -0.05])
def test_a_shifted_clock_costs_each_hold_the_fastest_token_only(shift: float) -> None:
    """An inner host whose clock is off by more than the request's way in, ahead or behind: the
    skew is taken where the fastest token had no hold, so every hold is short by that token's
    0.1 ms alone, and the record says how far the bounds leave each hold open."""
    holds = [0.0001 + 0.0001 * (i % 3) for i in range(10)]
    events = steady(10, 0.02, 0.05)
    inner = record("origin", 1000.002 + shift, events)
    outer = record(
        "edge", 1000.0, [[e[0] + 0.002 + h, 1, e[2]] for e, h in zip(events, holds, strict=True)]
    )
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert seg.skew_basis == SkewBasis.FASTEST_TOKEN
    assert seg.holds_s == pytest.approx([h - 0.0001 for h in holds], abs=1e-9)
    d = seg.as_dict()
    lo, hi = d["hold_uncertainty_s"]
    assert lo == 0.0 and hi == pytest.approx(0.002 + 0.0001)  # the request's way in, and more
    assert d["request_delay_s"] == pytest.approx(0.002 + 0.0001)


def test_the_skew_estimate_keeps_agreeing_clocks_where_the_bounds_allow() -> None:
    """Bounds around 0: clocks that agree (0); bounds beside 0: the lower one; bounds that
    contradict each other: the request's."""
    assert estimate_skew(-0.001, 0.002) == (0.0, SkewBasis.CLOCKS_AGREE)
    assert estimate_skew(None, None) == (0.0, SkewBasis.CLOCKS_AGREE)
    assert estimate_skew(0.5, 0.6) == (0.5, SkewBasis.FASTEST_TOKEN)
    assert estimate_skew(-0.6, -0.5) == (-0.6, SkewBasis.FASTEST_TOKEN)
    assert estimate_skew(0.2, 0.1) == (0.1, SkewBasis.REQUEST_ORDER)
    assert estimate_skew(None, -0.1) == (-0.1, SkewBasis.REQUEST_ORDER)


def test_contradicting_clocks_give_negative_holds_kept_and_flagged() -> None:
    """A clock that stepped back during the request (tokens seen at the outer hop before the
    inner one saw them, on the bounds' request order): the negative holds stay in the segment,
    and a clock_skew_suspect finding counts them by what they are."""
    inner = record("origin", 1000.001, steady(5, 0.05, 0.2))
    outer = record("edge", 1000.0, steady(5, 0.05, 0.1))
    seg = align(HopFlow.from_record(outer), HopFlow.from_record(inner))
    assert seg.skew_basis == SkewBasis.REQUEST_ORDER
    assert sum(h < 0 for h in seg.holds_s) == 5
    # the bounds contradict each other: nothing bounds the holds nor the request's delay ([0, 0]
    # would say one clock)
    assert seg.as_dict()["hold_uncertainty_s"] == [None, None]
    assert seg.as_dict()["request_delay_bounds_s"] == [None, None]
    (f,) = seg.findings
    assert f["kind"] == "clock_skew_suspect"
    assert f["evidence"]["negative"] == {"hold": 5, "added_ttft": 1}
    assert f["evidence"]["hold_min_s"] == pytest.approx(-0.1, abs=1e-6)


@pytest.mark.parametrize(("skew_s", "suspect"), [(8_640_000.0, True), (-5.0, True), (0.5, False)])
def test_a_host_clock_far_from_its_neighbours_is_suspect(skew_s: float, suspect: bool) -> None:
    """The inner host's clock `skew_s` ahead of the outer one's: the holds, corrected by the
    estimate, stay sound either way; past a second of skew (a host's time gone wrong, 100 days
    in the first case) the segment says so in clock_skew_suspect with the estimate; half a
    second says nothing."""
    inner = record("origin", 1000.001 + skew_s, steady(5, 0.05, 0.1))
    outer = record("edge", 1000.0, steady(5, 0.05, 0.102))
    seg = with_suspects(align(HopFlow.from_record(outer), HopFlow.from_record(inner)))
    assert all(0 <= h < 0.01 for h in seg.holds_s)
    found = [f for f in seg.findings if f["kind"] == "clock_skew_suspect"]
    if not suspect:
        assert found == []
        return
    (f,) = found
    assert f["evidence"]["skew_s"] == pytest.approx(skew_s, abs=0.01)
    assert f["evidence"]["negative"] == {}
