"""Per-token holds from two vantage points, aligned by content offset, with bounded clock skew."""

from __future__ import annotations

from typing import Any

import pytest

from hopmeter.core.hops import HopView, Segment, align, chain, chain_views, median, skew_bounds


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
    seg = align(HopView.from_record(outer), HopView.from_record(inner))
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
    seg = align(HopView.from_record(outer), HopView.from_record(inner))
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
    seg = align(HopView.from_record(outer), HopView.from_record(inner))
    assert seg.holds_s == pytest.approx((0.11, 0.01, 0.11, 0.01))


def test_skew_is_bounded_by_causality() -> None:
    """A clock 2 s ahead at the inner host is corrected within the causal bounds."""
    inner = record("origin", 1002.001, steady(10, 0.05, 0.1))  # its clock runs 2 s ahead
    outer = record("edge", 1000.0, steady(10, 0.05, 0.102))
    lower, upper = skew_bounds(HopView.from_record(outer), HopView.from_record(inner))
    assert lower is not None and upper is not None
    assert lower <= 2.0 <= upper
    seg = align(HopView.from_record(outer), HopView.from_record(inner))
    assert all(h >= 0 for h in seg.holds_s)
    assert max(seg.holds_s) < 0.01


def test_known_skew_limits_narrow_the_bounds() -> None:
    """Bounds the caller knows from elsewhere narrow the causal ones; equal limits (one clock)
    fix the skew whatever the events say."""
    inner = record("origin", 1002.001, steady(10, 0.05, 0.1))
    outer = record("edge", 1000.0, steady(10, 0.05, 0.102))
    o, i = HopView.from_record(outer), HopView.from_record(inner)
    lower, upper = skew_bounds(o, i)
    assert lower is not None and upper is not None
    narrowed = align(o, i, (None, upper - 0.0005))
    assert narrowed.skew_bounds_s == (lower, pytest.approx(upper - 0.0005))
    fixed = align(o, i, (0.0, 0.0))
    assert fixed.skew_bounds_s == (0.0, 0.0) and fixed.skew_s == 0.0
    assert min(fixed.holds_s) < -1.9  # the events disagree: one clock was claimed


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
    seg = align(HopView.from_record(outer), HopView.from_record(inner))
    kinds = [f["kind"] for f in seg.findings]
    assert kinds == ["burst_gaps", "segment_batching"]


def test_chain_orders_hops_by_request_start() -> None:
    """Three hops give two segments, outermost first."""
    recs = [
        record("b", 1.0, steady(5, 0.1, 0.2)),
        record("a", 0.0, steady(5, 0.1, 1.3)),
        record("c", 2.0, steady(5, 0.1, 0.1)),
    ]
    assert [s.segment for s in chain(recs)] == ["a>b", "b>c"]


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
    d = align(HopView.from_record(outer), HopView.from_record(inner)).as_dict()
    assert d["tokens_out"] == d["tokens_aligned"] == 10
    assert d["inner_hold_p50_s"] == pytest.approx(0.0002)
    assert d["inner_hold_max_s"] == pytest.approx(0.03)
    assert d["wire_hold_max_s"] == pytest.approx(0.001)
    assert d["hold_max_s"] == pytest.approx(0.031)  # unchanged: inner own + wire


def test_without_out_times_the_split_is_empty() -> None:
    """A record from a hopmeter that did not follow its bytes out has no split, only the hold."""
    inner = record("origin", 1000.001, steady(5, 0.05, 0.1))
    outer = record("edge", 1000.0, steady(5, 0.05, 0.102))
    d = align(HopView.from_record(outer), HopView.from_record(inner)).as_dict()
    assert d["tokens_out"] == 0 and d["wire_hold_p99_s"] is None and d["inner_hold_max_s"] is None
    assert d["tokens_aligned"] == 5


def test_a_capped_inner_timeline_uses_the_whole_streams_token_span() -> None:
    """When the inner hop lists only the head of a long stream, whole_body is judged against
    the whole stream's token span, not the head's."""
    head = steady(10, 0.05, 0.1)  # 0.45 s of a stream that went on for 20 s
    outer = record("edge", 1000.0, [[0.8 + i * 0.05, 1, (i + 1) * 5] for i in range(10)])
    inner = record("origin", 1000.0, head)
    held = align(HopView.from_record(outer), HopView.from_record(inner))
    inner["figures"]["token_span_s"] = 20.0
    whole = align(HopView.from_record(outer), HopView.from_record(inner))
    assert held.first_token_hold_s == whole.first_token_hold_s == pytest.approx(0.7)
    assert not whole.whole_body  # 0.7 s of a 20 s stream is no whole-body hold


def test_chain_views_orders_by_request_start() -> None:
    """chain_views pairs views by request start whatever order they are given in."""
    a = HopView.from_record(record("edge", 10.0, steady(3, 0.1, 0.2)))
    b = HopView.from_record(record("mid", 10.001, steady(3, 0.1, 0.1)))
    c = HopView.from_record(record("origin", 10.002, steady(3, 0.1, 0.05)))
    assert [s.segment for s in chain_views([c, a, b])] == ["edge>mid", "mid>origin"]


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
    assert median((0.287,) * 20 + (1.205,) * 21) == 1.205
    assert median((0.287,) * 21 + (1.205,) * 20) == 0.287
    assert median(()) is None


def test_request_delay_and_added_ttft_come_from_the_request_starts() -> None:
    """On one clock the inner hop saw the request 12 ms after the outer one; the segment added
    that plus the first token's hold to the time to first token, and causality bounds the delay."""
    inner = record("origin", 1000.012, steady(10, 0.02, 0.05))
    outer = record("edge", 1000.0, steady(10, 0.02, 0.065))
    d = align(HopView.from_record(outer), HopView.from_record(inner)).as_dict()
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
    d = align(HopView.from_record(outer), HopView.from_record(inner)).as_dict()
    assert d["added_ttft_s"] == pytest.approx(0.015)
    assert 0.0 <= d["request_delay_s"] <= d["request_delay_bounds_s"][1]
