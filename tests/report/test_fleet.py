"""The fleet summary on hand-written records: counts, quantiles over flows and tokens, findings."""

from __future__ import annotations

from typing import Any

import pytest

from hopmeter.report.fleet import ALL, FindingCount, latency, summarise
from hopmeter.report.traces import build, group
from tests.report.literal import EDGE, ORIGIN, T0, flow

STALL = {"kind": "stall", "severity": "warning", "evidence": {"threshold_s": 0.5}}
HELD = {"kind": "whole_body_hold", "severity": "error", "evidence": {}}


def _fleet(records: list[dict[str, Any]]) -> Any:
    traces = [build(recs, 0.5) for recs in group(records)]
    return summarise(records, traces)


def test_latency_quantiles_are_nearest_rank_over_flows() -> None:
    """TTFB and TTFT p50/p99 are nearest-rank over the flows that have one."""
    recs = [
        flow("a", T0, [], figures={"ttfb_s": 0.01, "ttft_s": 0.1}),
        flow("b", T0, [], figures={"ttfb_s": 0.03, "ttft_s": 0.3}),
        flow("c", T0, [], figures={"ttfb_s": 0.02, "ttft_s": None}),
    ]
    lat = latency(recs)
    assert lat.flows == 3
    assert lat.ttfb == (0.02, 0.03)
    assert lat.ttft == (0.1, 0.3)
    assert lat.itl == (None, None)  # no flow had two token-carrying events


def test_inter_token_latency_is_pooled_and_token_weighted() -> None:
    """A gap before an event of k tokens counts k gaps of a k-th of it, across flows: one flow
    of one 0.1 s gap and one of a 0.6 s gap before three tokens give a median of 0.2 s."""
    recs = [
        flow("a", T0, [[0.1, 1, 1], [0.2, 1, 2]]),
        flow("b", T0, [[0.3, 1, 1], [0.35, 0, 1], [0.9, 3, 4]]),  # a quiet event changes nothing
    ]
    assert latency(recs).itl == pytest.approx((0.2, 0.2))
    assert latency(recs[:1]).itl == pytest.approx((0.1, 0.1))


def test_flows_are_counted_by_hop_api_and_model() -> None:
    """Counts run most first, then by name; a record without a model counts as "-"."""
    lone = flow("proxy", T0 + 5, [[0.1, 1, 3]], trace=None, api="anthropic.messages", model=None)
    fleet = _fleet([ORIGIN, lone, EDGE])
    assert (fleet.flows, fleet.traces, fleet.multi_hop) == (3, 2, 1)
    assert (fleet.t_first, fleet.t_last) == (T0, T0 + 5)
    assert fleet.by_hop == [("edge", 1), ("origin", 1), ("proxy", 1)]
    assert fleet.by_api == [("openai.chat", 2), ("anthropic.messages", 1)]
    assert fleet.by_model == [("gpt-4o", 2), ("-", 1)]


def test_the_latency_table_pools_every_hop_then_one_row_per_hop() -> None:
    """The first row covers every flow; the next ones, each hop's flows, busiest hop first."""
    recs = [
        flow("edge", T0, [], trace="x", figures={"ttfb_s": 0.5}),
        flow("origin", T0, [], trace="y", figures={"ttfb_s": 0.1}),
        flow("origin", T0, [], trace="z", figures={"ttfb_s": 0.2}),
    ]
    rows = _fleet(recs).latency
    assert [(name, lat.flows) for name, lat in rows] == [(ALL, 3), ("origin", 2), ("edge", 1)]
    assert [lat.ttfb for _, lat in rows] == [(0.2, 0.5), (0.1, 0.2), (0.5, 0.5)]


def test_findings_count_flows_and_segments_worst_first() -> None:
    """Each kind counts the flows and the segments that showed it; errors come before warnings
    even when warnings are more common."""
    segment_hold = {"kind": "whole_body_hold", "introduced_by": "edge>origin"}  # no severity
    live = [{"segment": "edge>origin", "whole_body": True, "findings": [segment_hold]}]
    recs = [
        {**ORIGIN, "findings": [STALL]},
        {**EDGE, "hops": live},
        flow("proxy", T0 + 5, [[0.1, 1, 3]], trace=None, findings=[HELD, STALL]),
    ]
    fleet = _fleet(recs)
    assert fleet.findings == [
        FindingCount(kind="whole_body_hold", severity="error", flows=1, segments=1),
        FindingCount(kind="stall", severity="warning", flows=2, segments=0),
    ]
    assert fleet.segments == [("edge>origin", 1, 1)]


def test_an_empty_fleet_has_no_times() -> None:
    """No records: no flows, no first or last time, and a latency row with no data."""
    fleet = summarise([], [])
    assert (fleet.flows, fleet.t_first, fleet.t_last, fleet.findings) == (0, None, None, [])
    assert [(name, lat.ttfb) for name, lat in fleet.latency] == [(ALL, (None, None))]


def test_client_findings_count_with_the_flow_s_own() -> None:
    """A page's finding (its record's browser section) counts as one of that flow's; its lanes
    make the trace one seen at several hops, its two segments are listed."""
    from tests.report.literal import PAGE_EDGE

    fleet = _fleet([PAGE_EDGE])
    assert fleet.findings == [
        FindingCount(kind="client_smoothing_buffer", severity="info", flows=1, segments=0)
    ]
    assert fleet.flows == 1 and fleet.multi_hop == 1
    assert [s for s, _, _ in fleet.segments] == ["browser>edge", "screen>browser"]
