"""Grouping records into traces and the lanes' measured runs: literal records, then real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hopmeter.core.fingerprint import fingerprint
from hopmeter.core.order import HopOrder
from hopmeter.export.records import read_records
from hopmeter.report.traces import build, group, severity, stall_threshold

T0 = 1796000000.0


def _rec(
    hop: str,
    t_start: float,
    events: list[list[float]],
    *,
    trace: str = "t1",
    findings: list[dict[str, Any]] | None = None,
    hops: list[dict[str, Any]] | None = None,
    parent: str | None = None,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "schema": "hopmeter.flow/1",
        "trace_id": trace,
        "span_id": f"{trace}-{hop}",
        "parent_span_id": None if parent is None else f"{trace}-{parent}",
        "flow_id": f"{trace}-{hop}",
        "hop": hop,
        "request": {"method": "POST", "path": "/v1/chat/completions", "t_start": t_start},
        "response": {"status": 200, "t_first_byte": t_start + events[0][0], "ended": "complete"},
        "events": events,
        "figures": {},
        "findings": findings or [],
    }
    if hops is not None:
        rec["hops"] = hops
    return rec


# The origin sees three tokens 0.1 s apart; the edge (started 1 ms earlier) sees all at 0.5 s.
ORIGIN = _rec(
    "origin", T0 + 0.001, [[0.05, 0, 0], [0.1, 1, 5], [0.2, 1, 9], [0.3, 1, 14]], parent="edge"
)
EDGE = _rec("edge", T0, [[0.5, 0, 0], [0.5, 1, 5], [0.5, 1, 9], [0.501, 1, 14]])


def test_records_of_a_trace_group_together_in_request_order() -> None:
    """Records sharing a trace id form one group, outermost first; one without an id is alone."""
    lone = {**_rec("proxy", T0 + 5, [[0.1, 1, 3]]), "trace_id": None}
    groups = group([ORIGIN, lone, EDGE])
    assert [[r["hop"] for r in g] for g in groups] == [["edge", "origin"], ["proxy"]]


def test_two_requests_of_one_trace_are_two_groups_by_their_links() -> None:
    """An instrumented client's two calls share a trace: each edge record groups with the origin
    record that names it as parent, outermost first, whatever the request starts say."""
    second = [
        {**EDGE, "span_id": "e2", "flow_id": "e2", "request": {**EDGE["request"], "t_start": T0}},
        {**ORIGIN, "span_id": "o2", "parent_span_id": "e2", "flow_id": "o2"},
    ]
    groups = group([ORIGIN, *second, EDGE])
    assert sorted([r["flow_id"] for r in g] for g in groups) == [
        ["e2", "o2"],
        ["t1-edge", "t1-origin"],
    ]


def test_segment_runs_go_from_inner_arrival_to_outer_arrival() -> None:
    """Each aligned token's run starts when the inner hop saw it and ends when the outer hop did."""
    trace = build([ORIGIN, EDGE], 0.5)
    assert [lane.hop for lane in trace.lanes] == ["edge", "origin"]
    (band,) = trace.bands
    assert band.segment == "edge>origin" and not band.live
    runs = [(round(r.t0_s, 6), round(r.t1_s, 6), r.tokens) for r in band.runs]
    assert runs == [(0.101, 0.5, 1), (0.201, 0.5, 1), (0.301, 0.501, 1)]
    assert band.summary["first_token_hold_s"] == pytest.approx(0.399)
    assert [m.t_s for m in trace.lanes[1].marks] == pytest.approx([0.101, 0.201, 0.301], abs=1e-6)
    assert trace.lanes[1].quiet_s == pytest.approx((0.051,), abs=1e-6)


def test_inner_clock_ahead_is_shifted_back_as_causality_allows() -> None:
    """An inner host whose clock runs 2 s ahead is shifted until no token arrives before it left."""
    ahead = {**ORIGIN, "request": {**ORIGIN["request"], "t_start": T0 + 2.001}}
    trace = build([ahead, EDGE], 0.5)
    holds = [run.t1_s - run.t0_s for run in trace.bands[0].runs]
    assert min(holds) == pytest.approx(0.0, abs=1e-6) and all(h >= -1e-9 for h in holds)
    assert 0 <= trace.lanes[1].t_start_s < 2


def test_live_hops_entry_is_used_when_the_record_has_one() -> None:
    """The outer record's measured `hops` entry is the band's summary, marked live."""
    live = [{"segment": "edge>origin", "first_token_hold_s": 0.4, "whole_body": True}]
    trace = build([ORIGIN, {**EDGE, "hops": live}], 0.5)
    assert trace.bands[0].live and trace.bands[0].summary["first_token_hold_s"] == 0.4


def test_gaps_at_the_threshold_are_stall_runs() -> None:
    """In one lane, a gap at or above the stall threshold is a run from one token to the next."""
    rec = _rec("proxy", T0, [[0.1, 1, 2], [0.25, 1, 4], [0.75, 2, 9], [0.8, 1, 11]])
    (lane,) = build([rec], 0.5).lanes
    assert [(r.t0_s, r.t1_s, r.tokens) for r in lane.runs] == [(0.25, 0.75, 2)]
    assert [(r.t0_s, r.t1_s) for r in build([rec], 0.6).lanes[0].runs] == []


def test_whole_body_and_not_streamed_findings_become_runs() -> None:
    """A whole-body wait and a reply that was not streamed are drawn from their evidence."""
    held = _rec(
        "proxy",
        T0,
        [[1.0, 1, 2], [1.0, 1, 4]],
        findings=[
            {
                "kind": "whole_body_hold",
                "severity": "error",
                "evidence": {"final_burst_at_s": 1.0, "wait_before_burst_s": 0.95},
            }
        ],
    )
    (run,) = build([held], 0.5).lanes[0].runs
    assert (run.t0_s, run.t1_s) == pytest.approx((0.05, 1.0))
    doc = _rec(
        "proxy",
        T0,
        [[0.8, 30, 120]],
        findings=[{"kind": "not_streamed", "evidence": {"first_visible_at_s": 0.8}}],
    )
    (run,) = build([doc], 0.5).lanes[0].runs
    assert (run.t0_s, run.t1_s) == (0.0, 0.8) and run.label.startswith("not streamed")


def test_findings_worst_first_and_segment_severity() -> None:
    """A trace lists its hops' and segments' findings, errors first; segment kinds get one."""
    stall = {"kind": "stall", "severity": "warning", "evidence": {"threshold_s": 0.25}}
    seg = {"kind": "whole_body_hold", "introduced_by": "edge>origin"}
    edge = {**EDGE, "hops": [{"segment": "edge>origin", "findings": [seg]}]}
    trace = build([{**ORIGIN, "findings": [stall]}, edge], 0.5)
    assert [(where, f["kind"]) for where, f in trace.findings()] == [
        ("edge>origin", "whole_body_hold"),
        ("origin", "stall"),
    ]
    assert severity(seg) == "error"
    assert stall_threshold([EDGE, {**ORIGIN, "findings": [stall]}]) == 0.25
    assert stall_threshold([EDGE]) == 0.5


@pytest.mark.integration
def test_alignment_from_events_alone_matches_the_live_hold(held_path: Path) -> None:
    """Without the `hops` section, aligning real records by offset gives the live holds."""
    records = list(read_records([str(held_path)]))
    for recs in group(records):
        live = build(recs, 0.5).bands[0]
        bare = build([{k: v for k, v in r.items() if k != "hops"} for r in recs], 0.5).bands[0]
        assert live.live and not bare.live
        for key in ("first_token_hold_s", "hold_p50_s", "hold_max_s"):
            assert bare.summary[key] == pytest.approx(live.summary[key], abs=0.002), key
        assert bare.summary["whole_body"] and live.summary["whole_body"]
        first = bare.runs[0]
        assert first.t1_s - first.t0_s == pytest.approx(
            live.summary["first_token_hold_s"], abs=0.002
        )


def test_records_without_offsets_or_events_still_build() -> None:
    """Events without a content offset are drawn but not aligned; a record with none is a lane."""
    bare = {**ORIGIN, "events": [e[:2] for e in ORIGIN["events"]]}
    trace = build([bare, EDGE], 0.5)
    assert trace.bands[0].runs == () and trace.bands[0].summary["hold_max_s"] is None
    assert len(trace.lanes[1].marks) == 3
    empty = build([{**EDGE, "events": []}], 0.5)
    assert empty.lanes[0].marks == () and empty.span_s > 0


def test_a_run_splits_where_the_inner_hop_followed_its_bytes_out() -> None:
    """With the origin's out times, each run knows when the token left the origin's process."""
    origin = {
        **ORIGIN,
        "chunks": [[0.05, 20], [0.1, 30], [0.2, 30], [0.3, 30]],
        "chunks_out": [[0.0501, 0.0501], [0.1001, 0.1001], [0.25, 0.25], [0.3001, 0.3001]],
    }
    (band,) = build([origin, EDGE], 0.5).bands
    lefts = [round(r.t_left_s, 6) for r in band.runs if r.t_left_s is not None]
    assert lefts == [0.1011, 0.251, 0.3011]  # shifted by the origin's 1 ms later start
    assert "0.0500 s in origin's own process" in band.runs[1].label


def test_records_without_out_times_draw_whole_runs() -> None:
    """A record from a hopmeter that did not follow its bytes out: no split, as before."""
    (band,) = build([ORIGIN, EDGE], 0.5).bands
    assert all(r.t_left_s is None for r in band.runs)


def _fingerprinted(rec: dict[str, Any], trace: str) -> dict[str, Any]:
    """`rec` under another trace id, carrying the fingerprint of one shared reply."""
    fp = fingerprint("fourteen chars", 14)
    assert fp is not None
    last = rec["request"]["t_start"] + rec["events"][-1][0]
    return {
        **rec,
        "trace_id": trace,
        "span_id": f"{trace}-span",
        "parent_span_id": None,  # a trace of its own: no link to the other hop
        "flow_id": f"{trace}-{rec['hop']}",
        "fingerprint": fp.as_dict(),
        "response": {**rec["response"], "t_last_byte": last},
    }


def test_records_paired_by_content_group_together() -> None:
    """An edge and an origin record with different trace ids but one reply (a gateway dropped
    the trace) are one trace: the band says content and carries the request's way in."""
    edge, origin = _fingerprinted(EDGE, "t-edge"), _fingerprinted(ORIGIN, "t-origin")
    (unknown,) = group([origin, edge])
    (band,) = build(unknown, 0.5).bands  # nothing says which is outer: an unordered band
    assert (band.segment, band.runs, band.summary["order"]) == ("edge~origin", (), "unknown")
    order = HopOrder(["edge", "origin"])
    (g,) = group([origin, edge], order)
    assert [r["hop"] for r in g] == ["edge", "origin"]
    (band,) = build(g, 0.5, order).bands
    assert band.summary["paired_by"] == "content"
    assert band.summary["request_delay_s"] == pytest.approx(0.001)
    assert band.request is not None
    assert (band.request.t0_s, band.request.t1_s) == pytest.approx((0.0, 0.001), abs=1e-6)
    assert band.request.label == "request took 1.0 ms from edge to origin"


def test_a_joined_beacon_adds_the_page_s_two_lanes_outside_its_hop() -> None:
    """A record with browser and screen sections is drawn as three lanes, client side first
    (screen, browser, edge), its two segments aligned with no skew, the trace still named by
    the edge's record, the client finding listed at the browser."""
    from tests.report.literal import PAGE_EDGE

    trace = build([PAGE_EDGE], 0.5)
    assert [lane.hop for lane in trace.lanes] == ["screen", "browser", "edge"]
    assert [b.segment for b in trace.bands] == ["screen>browser", "browser>edge"]
    assert all(b.live for b in trace.bands)  # the record's own hops entries
    assert trace.t0 == T0 - 0.005 and trace.outer is PAGE_EDGE
    screen, browser, edge = trace.lanes
    assert [m.t_s for m in edge.marks] == pytest.approx([0.105, 0.125, 0.145], abs=1e-6)
    assert [m.t_s for m in browser.marks] == pytest.approx([0.1055, 0.1255, 0.1455], abs=1e-6)
    assert [m.t_s for m in screen.marks] == pytest.approx([0.115, 0.132, 0.148], abs=1e-6)
    runs = trace.bands[1].runs  # browser>edge: from the edge's read to the page's
    flat = [t for r in runs for t in (r.t0_s, r.t1_s)]
    assert flat == pytest.approx([0.105, 0.1055, 0.125, 0.1255, 0.145, 0.1455], abs=1e-6)
    assert ("browser", PAGE_EDGE["browser"]["findings"][0]) in trace.findings()


def test_a_record_whose_beacon_did_not_come_has_its_own_lane_only() -> None:
    """`browser.joined: false`: nothing to draw beyond the hop."""
    rec = {**EDGE, "browser": {"joined": False, "reason": "no beacon"}}
    assert [lane.hop for lane in build([rec], 0.5).lanes] == ["edge"]
