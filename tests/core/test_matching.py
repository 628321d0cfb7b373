"""Flows at two hops paired by trace id, else by their reply's fingerprint, never wrongly."""

from __future__ import annotations

from typing import Any

from hopmeter.core.fingerprint import fingerprint
from hopmeter.core.matching import (
    Flow,
    match,
    match_records,
    segments,
    trace_dropped,
    with_findings,
    without_content,
)
from hopmeter.core.order import HopOrder
from hopmeter.core.vocab import FindingKind, PairedBy, PairingMatch


def flow(*args: Any, model: str = "m") -> Flow:
    """A flow from (ref, hop, trace id, reply text, request start, last byte)."""
    ref, hop, trace, text, t0, t1 = args
    fp = fingerprint(text, len(text)) if text else None
    return Flow(ref=ref, hop=hop, trace_id=trace, fingerprint=fp, t_start=t0, t_end=t1, model=model)


def test_three_replies_in_flight_pair_each_with_its_own() -> None:
    """Three replies through a gateway that drops the trace, at once, two of them opening alike:
    each edge flow pairs with the origin flow of the same reply."""
    texts = ["Alpha beta gamma.", "The answer is forty-two.", "The answer is forty-one."]
    edge = [
        flow(i, "edge", f"e{i}", t, 0.0 + i * 0.001, 1.0 + i * 0.001) for i, t in enumerate(texts)
    ]
    origin = [
        flow(3 + i, "origin", f"o{i}", t, 0.02 + i * 0.001, 0.99 + i * 0.001, model="m-1")
        for i, t in enumerate(texts)
    ]
    m = match([*origin, *edge])
    assert sorted(m.groups) == [[0, 3], [1, 4], [2, 5]]
    for ref in range(6):
        out = m.outcomes[ref]
        assert (out.paired_by, out.match, out.candidates) == (
            PairedBy.CONTENT,
            PairingMatch.UNIQUE,
            1,
        )
        assert out.model_match is False  # the gateway renamed the model: reported, not used


def test_identical_replies_at_once_are_never_paired() -> None:
    """Two identical replies in flight together: each origin flow fits in both edge windows, so
    none is paired and every one of them says ambiguous."""
    flows = [
        flow(0, "edge", "e0", "same reply", 0.0, 1.0),
        flow(1, "edge", "e1", "same reply", 0.001, 1.001),
        flow(2, "origin", "o0", "same reply", 0.02, 0.99),
        flow(3, "origin", "o1", "same reply", 0.021, 0.991),
    ]
    m = match(flows)
    assert m.groups == []
    assert {r: (o.paired_by, o.match, o.candidates) for r, o in m.outcomes.items()} == {
        r: (None, PairingMatch.AMBIGUOUS, 2) for r in range(4)
    }


def test_a_flow_whose_only_candidate_is_contested_is_ambiguous() -> None:
    """Identical replies whose windows overlap unevenly (the second request reached the edge
    after the first reached the origin): the later edge flow has one candidate, which has two,
    so nothing pairs and every flow says ambiguous, never none."""
    flows = [
        flow(0, "edge", "e0", "same reply", 0.0, 0.839),
        flow(1, "edge", "e1", "same reply", 0.051, 0.880),
        flow(2, "origin", "o0", "same reply", 0.029, 0.787),
        flow(3, "origin", "o1", "same reply", 0.073, 0.827),
    ]
    m = match(flows)
    assert m.groups == []
    assert {r: (o.match, o.candidates) for r, o in m.outcomes.items()} == {
        0: (PairingMatch.AMBIGUOUS, 2),
        1: (PairingMatch.AMBIGUOUS, 1),
        2: (PairingMatch.AMBIGUOUS, 1),
        3: (PairingMatch.AMBIGUOUS, 2),
    }


def test_identical_replies_one_after_the_other_pair() -> None:
    """The same reply asked twice in a row: the windows do not nest across requests."""
    flows = [
        flow(0, "edge", "e0", "same", 0.0, 1.0),
        flow(1, "origin", "o0", "same", 0.02, 0.99),
        flow(2, "edge", "e1", "same", 1.5, 2.5),
        flow(3, "origin", "o1", "same", 1.52, 2.49),
    ]
    assert sorted(match(flows).groups) == [[0, 1], [2, 3]]


def test_windows_must_nest() -> None:
    """An inner flow that started before the outer one, or ended long after it, is not its own."""
    early = match([flow(0, "edge", "e", "x", 1.0, 2.0), flow(1, "origin", "o", "x", 0.5, 1.9)])
    late = match([flow(0, "edge", "e", "x", 1.0, 2.0), flow(1, "origin", "o", "x", 1.1, 2.5)])
    for m in (early, late):
        assert m.groups == [] and m.outcomes[0].match == PairingMatch.NONE
    assert match(
        [flow(0, "edge", "e", "x", 1.0, 2.0), flow(1, "origin", "o", "x", 1.1, 2.5)], 1.0
    ).groups


def test_the_same_hop_or_no_text_never_pairs() -> None:
    """Two flows at one hop are two requests; a flow without text has nothing to pair by."""
    same_hop = match([flow(0, "edge", "a", "x", 0, 1), flow(1, "edge", "b", "x", 0.1, 0.9)])
    assert same_hop.groups == [] and same_hop.outcomes[1].match == PairingMatch.NONE
    no_text = match([flow(0, "edge", "a", None, 0, 1), flow(1, "origin", "b", None, 0.1, 0.9)])
    assert no_text.groups == []


def test_a_shared_trace_is_paired_by_trace_and_joins_a_dropped_segment() -> None:
    """edge and mid share a trace; the gateway behind mid drops it: one group of three, the
    record pairing by content, each flow once."""
    flows = [
        flow(0, "edge", "t1", "reply", 0.0, 1.0),
        flow(1, "mid", "t1", "reply", 0.01, 0.99),
        flow(2, "origin", "t2", "reply", 0.03, 0.98),
        flow(3, "edge", "t3", "other", 0.0, 1.0),
        flow(4, "origin", "t3", "other", 0.02, 0.97),
    ]
    m = match(flows)
    assert sorted(m.groups) == [[0, 1, 2], [3, 4]]
    assert m.outcomes[2].paired_by == PairedBy.CONTENT
    assert (m.outcomes[3].paired_by, m.outcomes[3].match) == (PairedBy.TRACE, PairingMatch.UNIQUE)


def test_a_chain_of_three_hops_that_all_drop_the_trace_joins() -> None:
    """edge, mid and origin each with a trace of its own: one candidate per other hop each."""
    flows = [
        flow(0, "edge", "a", "reply", 0.0, 1.0),
        flow(1, "mid", "b", "reply", 0.01, 0.99),
        flow(2, "origin", "c", "reply", 0.03, 0.98),
    ]
    assert match(flows).groups == [[0, 1, 2]]


def _rec(
    hop: str, trace: str, flow_id: str, text: str, *, t0: float, events: list[list[float]]
) -> dict[str, Any]:
    fp = fingerprint(text, len(text))
    assert fp is not None
    return {
        "hop": hop,
        "trace_id": trace,
        "flow_id": flow_id,
        "request": {"t_start": t0},
        "response": {"t_last_byte": t0 + events[-1][0]},
        "events": events,
        "fingerprint": fp.as_dict(),
        "findings": [{"kind": "stall", "severity": "info"}],
    }


def test_segments_say_how_they_were_paired_and_findings_follow() -> None:
    """A content-paired segment names its inner flow, says content, and yields one
    trace_context_dropped finding, sorted among the record's own by severity."""
    edge = _rec("edge", "t-edge", "f1", "abcde", t0=100.0, events=[[0.3, 1, 2], [0.5, 1, 5]])
    origin = _rec("origin", "t-origin", "f2", "abcde", t0=100.1, events=[[0.1, 1, 2], [0.3, 1, 5]])
    (group,) = match_records([origin, edge]).groups
    assert group == [1, 0]
    ((members, (seg,)),) = segments([origin, edge], HopOrder(["edge", "origin"]))
    assert (members, seg.segment, seg.paired_by, seg.inner_flow_id, seg.order) == (
        (1, 0),
        "edge>origin",
        PairedBy.CONTENT,
        "f2",
        "declared",
    )
    (finding,) = trace_dropped([seg])
    assert finding["kind"] == FindingKind.TRACE_CONTEXT_DROPPED and "traceparent" in finding["fix"]
    assert finding["evidence"]["segment"] == "edge>origin"
    rec = with_findings(edge, [finding])
    assert [f["kind"] for f in rec["findings"]] == ["trace_context_dropped", "stall"]
    ((_, traced),) = segments([edge, {**origin, "trace_id": "t-edge", "parent_span_id": "s1"}])
    assert [s.segment for s in traced] == ["edge~origin"]  # a link to elsewhere: no order known
    linked = [{**edge, "span_id": "s1"}, {**origin, "trace_id": "t-edge", "parent_span_id": "s1"}]
    ((_, traced),) = segments(linked)
    assert traced[0].paired_by == PairedBy.TRACE and trace_dropped(traced) == []


def test_without_content_keeps_trace_pairs_and_makes_the_rest_ambiguous() -> None:
    """When something in flight may still carry the same reply, content pairs are undone: the
    flows of a trace seen at two hops stay paired by trace, the others say ambiguous."""
    a = _rec("edge", "t1", "f1", "same", t0=100.0, events=[[0.3, 1, 4]])
    b = _rec("mid", "t1", "f2", "same", t0=100.01, events=[[0.2, 1, 4]])
    c = _rec("origin", "t2", "f3", "same", t0=100.02, events=[[0.1, 1, 4]])
    full = match_records([c, b, a])
    assert full.groups == [[2, 1, 0]]
    undone = without_content(full, [c, b, a])
    assert undone.groups == [[2, 1]]
    assert undone.outcomes[0].match == PairingMatch.AMBIGUOUS
    assert undone.outcomes[1].paired_by == undone.outcomes[2].paired_by == PairedBy.TRACE
