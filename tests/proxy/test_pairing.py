"""Live pairing: the outermost record of a trace is written last, with its hops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hopmeter.core.record import FlowResult
from hopmeter.proxy.pairing import Pairing


def result(hop: str, t_start: float, trace: str = "t1") -> FlowResult:
    events = [[0.1 + 0.05 * i, 1, 5 * (i + 1)] for i in range(10)]
    rec: dict[str, Any] = {
        "hop": hop,
        "trace_id": trace,
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
    p.start("t1", 0.0)
    p.start("t1", 0.001)
    (inner,) = p.finish(result("origin", 0.001))
    assert inner.record["hop"] == "origin"
    (outer,) = p.finish(result("edge", 0.0))
    assert outer.record["hops"][0]["segment"] == "edge>origin"
    assert len(outer.segments) == 1


def test_outer_first_waits_for_inner() -> None:
    """An outer flow that finishes first is parked until the inner one finishes."""
    p = Pairing()
    p.start("t1", 0.0)
    p.start("t1", 0.001)
    assert p.finish(result("edge", 0.0)) == []
    out = p.finish(result("origin", 0.001))
    assert [r.record["hop"] for r in out] == ["edge", "origin"]
    assert "hops" in out[0].record


def test_parked_outer_is_written_after_the_timeout() -> None:
    """If the inner flow never finishes, the timer writes the outer record anyway."""
    timers: list[Callable[[], None]] = []
    emitted: list[FlowResult] = []
    p = Pairing(schedule=lambda _d, fn: timers.append(fn), emit=emitted.append)
    p.start("t1", 0.0)
    p.start("t1", 0.001)
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
