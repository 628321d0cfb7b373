"""Live pairing: the outermost record of a trace is written last, with its hops."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from hopmeter.core.fingerprint import fingerprint
from hopmeter.core.record import FlowResult
from hopmeter.proxy.addon.pairing import (
    PARK_TIMEOUT_S,
    TRACE_DROP_LOG_INTERVAL_S,
    LiveFlow,
    Pairing,
)


def result(
    hop: str, t_start: float, trace: str = "t1", span: str = "", parent: str | None = None
) -> FlowResult:
    """A finished flow of `trace` (its span `span`, its parent's `parent`), 10 tokens."""
    events = [[0.1 + 0.05 * i, 1, 5 * (i + 1)] for i in range(10)]
    rec: dict[str, Any] = {
        "hop": hop,
        "trace_id": trace,
        "span_id": span or f"{hop}-{trace}",
        "parent_span_id": parent,
        "request": {"t_start": t_start},
        "response": {},
        "events": events,
        "figures": {},
        "findings": [],
    }
    return FlowResult(record=rec, figures=None, tokens=None)


def test_single_flow_is_written_at_once() -> None:
    """A trace seen at one hop only is written when it finishes, without hops."""
    p = Pairing()
    p.start("t1", 0.0)
    (out,) = p.finish(result("edge", 0.0))
    assert "hops" not in out.record


def test_inner_first_then_outer_with_hops() -> None:
    """The inner flow is written at once; the outer one carries the segment."""
    p = Pairing()
    p.start("t1", 0.0, "edge-t1")
    p.start("t1", 0.001, "origin-t1", "edge-t1")
    (inner,) = p.finish(result("origin", 0.001, parent="edge-t1"))
    assert inner.record["hop"] == "origin"
    (outer,) = p.finish(result("edge", 0.0))
    assert outer.record["hops"][0]["segment"] == "edge>origin"
    assert len(outer.segments) == 1


def test_as_a_wait_the_records_go_on_in_the_order_they_can_be_written() -> None:
    """take hands on what can be written now; an outer flow it held goes on, with its hops,
    when the inner one is taken."""
    p = Pairing()
    p.start("t1", 0.0, "edge-t1")
    p.start("t1", 0.001, "origin-t1", "edge-t1")
    passed: list[FlowResult] = []
    p.take(result("edge", 0.0), passed.append)
    assert passed == []
    p.take(result("origin", 0.001, parent="edge-t1"), passed.append)
    assert [r.record["hop"] for r in passed] == ["edge", "origin"]
    assert passed[0].record["hops"][0]["segment"] == "edge>origin"


def test_outer_first_waits_for_inner() -> None:
    """An outer flow that finishes first is parked until the inner one finishes."""
    p = Pairing()
    p.start("t1", 0.0, "edge-t1")
    p.start("t1", 0.001, "origin-t1", "edge-t1")
    assert p.finish(result("edge", 0.0)) == []
    out = p.finish(result("origin", 0.001, parent="edge-t1"))
    assert [r.record["hop"] for r in out] == ["edge", "origin"]
    assert "hops" in out[0].record


def test_parked_outer_is_written_after_the_timeout() -> None:
    """If the inner flow never finishes, the timer writes the outer record anyway."""
    timers: list[Callable[[], None]] = []
    emitted: list[FlowResult] = []
    p = Pairing(schedule=lambda _d, fn: timers.append(fn), emit=emitted.append)
    p.start("t1", 0.0, "edge-t1")
    p.start("t1", 0.001, "origin-t1", "edge-t1")
    assert p.finish(result("edge", 0.0)) == []
    timers[0]()
    assert [r.record["hop"] for r in emitted] == ["edge"]


def test_unrelated_traces_do_not_mix() -> None:
    """Flows of different traces are never paired."""
    p = Pairing()
    p.start("a", 0.0)
    p.start("b", 0.001)
    assert "hops" not in p.finish(result("edge", 0.0, "a"))[0].record
    assert "hops" not in p.finish(result("origin", 0.001, "b"))[0].record


def test_two_requests_in_one_trace_pair_each_with_its_own_inner_flow() -> None:
    """An instrumented client's two calls at once share a trace: each edge flow carries the
    segment to the origin flow that names it as parent, whatever the request starts say."""
    p = Pairing()
    p.start("t1", 0.0, "e1", "client")
    p.start("t1", 0.001, "e2", "client")
    p.start("t1", 0.002, "o2", "e2")
    p.start("t1", 0.003, "o1", "e1")
    assert p.finish(result("origin", 0.003, span="o1", parent="e1"))[0].record["hop"] == "origin"
    assert p.finish(result("edge", 0.0, span="e1", parent="client")) == []  # e2's trace goes on
    assert p.finish(result("origin", 0.002, span="o2", parent="e2"))[0].record["hop"] == "origin"
    out = p.finish(result("edge", 0.001, span="e2", parent="client"))
    hops = {r.record["span_id"]: r.record["hops"] for r in out}
    assert set(hops) == {"e1", "e2"}
    for span, inner in (("e1", "o1"), ("e2", "o2")):
        (seg,) = hops[span]
        assert (seg["segment"], seg["order"], seg["skew_basis"]) == (
            "edge>origin",
            "link",
            "one_clock",
        )
        assert seg["inner_flow_id"] is None or inner in str(seg["inner_flow_id"])


def test_linked_flows_teach_the_order_of_their_hops() -> None:
    """A trace whose flows are linked teaches which hop is outer; a later trace of the same two
    hops without a link (a proxy between them added its own span) is put in that order."""
    p = Pairing()
    p.start("t1", 0.0, "e1")
    p.start("t1", 0.001, "o1", "e1")
    p.finish(result("origin", 0.001, "t1", span="o1", parent="e1"))
    p.finish(result("edge", 0.0, "t1", span="e1"))
    p.start("t2", 1.0, "e2")
    p.start("t2", 1.001, "o2", "proxy")
    p.finish(result("origin", 1.001, "t2", span="o2", parent="proxy"))
    out = p.finish(result("edge", 1.0, "t2", span="e2"))
    (seg,) = next(r for r in out if "hops" in r.record).record["hops"]
    assert (seg["segment"], seg["order"]) == ("edge>origin", "learned")


def test_unlinked_hops_of_no_known_order_are_written_unordered() -> None:
    """Two flows of one trace with no link between them and no order known: one unordered pair,
    with its finding, and no holds."""
    p = Pairing()
    p.start("t1", 0.0, "e1")
    p.start("t1", 0.001, "o1", "proxy")
    p.finish(result("origin", 0.001, span="o1", parent="proxy"))
    out = p.finish(result("edge", 0.0, span="e1"))
    (seg,) = next(r for r in out if "hops" in r.record).record["hops"]
    assert (seg["segment"], seg["order"], seg["tokens_aligned"]) == ("edge~origin", "unknown", 0)
    assert [f["kind"] for f in seg["findings"]] == ["segment_unordered"]


# -- by content ---------------------------------------------------------------------------------

REPLY = "The answer is forty-two."
HOPS = frozenset({"edge", "origin"})


def reply(
    hop: str,
    trace: str,
    t_start: float,
    text: str = REPLY,
    flow_id: str = "",
    *,
    parent: str | None = None,
) -> FlowResult:
    """A finished flow of `text`, fingerprinted as measuring does, lasting 0.5 s or so."""
    base = result(hop, t_start, trace, parent=parent)
    fp = fingerprint(text, len(text))
    assert fp is not None
    lag = 0.03 if hop == "edge" else 0.0  # the edge sees each token 10 ms after the origin
    rec = {
        **base.record,
        "events": [[t + lag, k, c] for t, k, c in base.record["events"]],
        "flow_id": flow_id or f"{hop}-{trace}",
        "fingerprint": fp.as_dict(),
        "response": {"t_last_byte": t_start + (0.6 if hop == "edge" else 0.59)},
        "request": {"t_start": t_start, "t_end": t_start},
    }
    return FlowResult(record=rec, figures=None, tokens=None, opening=text)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def content_pairing(
    live: list[LiveFlow] | None = None, clock: Clock | None = None
) -> tuple[Pairing, list[Callable[[], None]], list[FlowResult]]:
    timers: list[Callable[[], None]] = []
    emitted: list[FlowResult] = []
    p = Pairing(
        schedule=lambda _d, fn: timers.append(fn),
        emit=emitted.append,
        in_flight=lambda: list(live or []),
        clock=clock or Clock(),
    )
    p.hops = HOPS
    p.order.declare(["edge", "origin"])  # the listeners, outermost first
    return p, timers, emitted


@pytest.mark.parametrize("client_span", [None, "c0ffee0000000001"])
def test_a_dropped_trace_is_paired_by_content(client_span: str | None) -> None:
    """The origin flow (a trace of its own) and the edge flow are written together: the edge one
    with hops paired by content, in the listeners' order, and a trace_context_dropped finding,
    both saying how; the same whether the client sent a trace context of its own or not."""
    p, _timers, _emitted = content_pairing()
    p.start("e1", 10.0, "edge-e1", client_span)
    p.start("o1", 10.02)
    assert p.finish(reply("origin", "o1", 10.02)) == []
    inner, outer = p.finish(reply("edge", "e1", 10.0, parent=client_span))
    (seg,) = outer.record["hops"]
    assert (seg["segment"], seg["paired_by"], seg["inner_flow_id"], seg["order"]) == (
        "edge>origin",
        "content",
        "origin-o1",
        "declared",
    )
    assert seg["request_delay_s"] == pytest.approx(0.02)
    assert [f["kind"] for f in outer.record["findings"]] == ["trace_context_dropped"]
    for r in (inner, outer):
        assert r.record["pairing"] == {
            "paired_by": "content",
            "match": "unique",
            "candidates": 1,
            "model_match": False,
        }
    assert "hops" not in inner.record and len(outer.segments) == 1


def test_a_shared_trace_in_a_process_of_two_hops_says_trace() -> None:
    """Flows that share a trace at every hop are paired by it, without the finding, at once:
    a flow in flight with the same opening cannot change that."""
    p, _timers, _emitted = content_pairing(
        [LiveFlow(trace_id="x", t_start=10.0, opening="", chars=0)]
    )
    p.start("t1", 10.0, "edge-t1")
    p.start("t1", 10.02, "origin-t1", "edge-t1")
    assert p.finish(reply("origin", "t1", 10.02, parent="edge-t1")) == []
    inner, outer = p.finish(reply("edge", "t1", 10.0))
    assert outer.record["hops"][0]["paired_by"] == "trace" and not outer.record["findings"]
    assert inner.record["pairing"] == {"paired_by": "trace", "match": "unique", "candidates": 0}


def test_a_flow_in_flight_that_may_be_the_same_reply_holds_the_decision() -> None:
    """While a flow in flight has said nothing that rules it out, nothing is written; once it has
    (a different word), the recheck pairs the two."""
    live = [LiveFlow(trace_id="x", t_start=10.01, opening="The answer", chars=10)]
    p, timers, emitted = content_pairing(live)
    p.start("e1", 10.0)
    p.start("o1", 10.02)
    assert p.finish(reply("origin", "o1", 10.02)) == []
    assert p.finish(reply("edge", "e1", 10.0)) == []
    live[0] = LiveFlow(trace_id="x", t_start=10.01, opening="The answer is nine", chars=18)
    timers.pop()()
    assert [r.record["pairing"]["match"] for r in emitted] == ["unique", "unique"]


def test_flows_that_cannot_be_the_reply_do_not_hold_it() -> None:
    """A stream in flight with another opening, one already longer, or one that started after
    the reply ended, is no candidate."""
    live = [
        LiveFlow(trace_id="a", t_start=10.0, opening="Hello", chars=5),
        LiveFlow(trace_id="b", t_start=10.0, opening=REPLY + " More", chars=len(REPLY) + 5),
        LiveFlow(trace_id="c", t_start=12.0, opening="", chars=0),
    ]
    p, _timers, _emitted = content_pairing(live)
    p.start("e1", 10.0)
    p.start("o1", 10.02)
    p.finish(reply("origin", "o1", 10.02))
    assert len(p.finish(reply("edge", "e1", 10.0))) == 2


def test_identical_replies_at_once_are_written_unpaired_and_ambiguous() -> None:
    """Two identical replies in flight together: four records, none with hops, all ambiguous."""
    p, _timers, _emitted = content_pairing()
    for trace, t in (("e1", 10.0), ("e2", 10.001), ("o1", 10.02), ("o2", 10.021)):
        p.start(trace, t)
    assert p.finish(reply("origin", "o1", 10.02)) == []
    assert p.finish(reply("origin", "o2", 10.021)) == []
    assert p.finish(reply("edge", "e1", 10.0)) == []
    out = p.finish(reply("edge", "e2", 10.001))
    assert len(out) == 4
    for r in out:
        assert "hops" not in r.record
        assert r.record["pairing"] == {"paired_by": None, "match": "ambiguous", "candidates": 2}


def test_after_the_timeout_a_held_reply_is_written_unpaired() -> None:
    """A flow in flight that never rules itself out: after PARK_TIMEOUT_S both records go out,
    unpaired and ambiguous, never paired on a guess."""
    clock = Clock()
    live = [LiveFlow(trace_id="x", t_start=10.01, opening="", chars=0)]
    p, timers, emitted = content_pairing(live, clock)
    p.start("e1", 10.0)
    p.start("o1", 10.02)
    p.finish(reply("origin", "o1", 10.02))
    p.finish(reply("edge", "e1", 10.0))
    timers.pop()()
    assert emitted == []
    clock.now = PARK_TIMEOUT_S + 1
    timers.pop()()
    assert [r.record["pairing"]["match"] for r in emitted] == ["ambiguous", "ambiguous"]
    assert not any("hops" in r.record for r in emitted)


def test_one_log_line_per_segment_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """Ten requests paired by content within a minute log one line; the next minute, one more
    saying how many were not logged."""
    clock = Clock()
    p, _timers, _emitted = content_pairing(clock=clock)
    for i in range(11):
        clock.now = 0.0 if i < 10 else TRACE_DROP_LOG_INTERVAL_S + 1
        t = 10.0 + i
        p.start(f"e{i}", t)
        p.start(f"o{i}", t + 0.02)
        p.finish(reply("origin", f"o{i}", t + 0.02, text=f"reply {i}"))
        p.finish(reply("edge", f"e{i}", t, text=f"reply {i}"))
    lines = [r.getMessage() for r in caplog.records if "drops the trace context" in r.getMessage()]
    assert len(lines) == 2
    assert "segment=edge>origin" in lines[0] and "more_since_last_line=9" in lines[1]


def test_drain_writes_what_waits() -> None:
    """At shutdown a reply held by a flow in flight is written (unpaired: it may be that one)."""
    live = [LiveFlow(trace_id="x", t_start=10.01, opening="", chars=0)]
    p, _timers, emitted = content_pairing(live)
    p.start("o1", 10.02)
    p.finish(reply("origin", "o1", 10.02))
    p.drain()
    assert [r.record["pairing"]["match"] for r in emitted] == ["ambiguous"]


def test_requests_decided_together_go_out_one_per_turn_of_the_loop() -> None:
    """Three requests a flow in flight held, decided at once when it rules itself out: one
    request's records (with its segment) now, each of the others on a turn of its own, in
    order, so that no turn of the loop every stream shares computes them all."""
    live = [LiveFlow(trace_id="x", t_start=10.0, opening="The answer", chars=10)]
    turns: list[Callable[[], None]] = []
    emitted: list[FlowResult] = []
    p = Pairing(
        schedule=lambda _d, fn: None,
        emit=emitted.append,
        in_flight=lambda: list(live),
        clock=Clock(),
        soon=turns.append,
    )
    p.hops = HOPS
    for i in range(3):
        t = 10.0 + 0.001 * i
        p.start(f"e{i}", t)
        p.start(f"o{i}", t + 0.02)
        assert p.finish(reply("origin", f"o{i}", t + 0.02, text=f"The answer {i}")) == []
        assert p.finish(reply("edge", f"e{i}", t, text=f"The answer {i}")) == []
    live.clear()  # the flow in flight ended: its record will be a request of its own
    p.start("z", 20.0)
    (lone,) = p.finish(result("edge", 20.0, trace="z"))  # decides all three
    assert lone.record["trace_id"] == "z" and emitted == []
    written = []
    while turns:
        turns.pop(0)()
        written.append([r.record["trace_id"] for r in emitted])
        assert [r.record["hop"] for r in emitted if "hops" in r.record] == ["edge"]
        emitted.clear()
    assert written == [["o0", "e0"], ["o1", "e1"], ["o2", "e2"]]


def test_a_wall_clock_step_between_two_requests_is_not_a_hold() -> None:
    """The wall clock stepped 3 h between the edge's request and the origin's (NTP, a suspended
    VM): their records' starts are 3 h apart, their monotonic starts 2 ms. One process's pair is
    aligned on the monotonic clock: the holds are the edge's own (~0), not -3 h or +3 h."""
    step = 3 * 3600.0
    for sign in (1, -1):
        p = Pairing()
        p.start("t1", 0.0, "edge-t1")
        p.start("t1", 0.002, "origin-t1", "edge-t1")
        inner = result("origin", 1000.002 + sign * step, parent="edge-t1")
        outer = result("edge", 1000.0)
        p.finish(dataclasses.replace(inner, mono_start_s=50.002))
        (out,) = p.finish(dataclasses.replace(outer, mono_start_s=50.0))
        (seg,) = out.record["hops"]
        assert abs(seg["first_token_hold_s"]) < 0.01, seg
        assert 0 <= seg["request_delay_s"] < 0.01, seg


def test_records_without_a_monotonic_start_align_on_their_wall_starts() -> None:
    """Results made of records alone (read back, or a test's) keep their wall starts."""
    p = Pairing()
    p.start("t1", 0.0, "edge-t1")
    p.start("t1", 0.5, "origin-t1", "edge-t1")
    p.finish(result("origin", 0.5, parent="edge-t1"))
    (out,) = p.finish(result("edge", 0.0))
    assert out.record["hops"][0]["request_delay_s"] == pytest.approx(0.5)
