"""Tests for hopmeter.probe.strict: the canary's byte, line-ending, text and hold checks alone."""

from __future__ import annotations

from typing import Any

from hopmeter.core.meter import FlowMeter
from hopmeter.probe.canary import Spec
from hopmeter.probe.strict import (
    MAX_HOLD_S,
    check_bytes,
    check_holds,
    check_line_endings,
    check_text,
)

SPEC = Spec(line_ending="cr", tokens=20, rate=20.0)  # a 0.95 s clock: long enough to hold


def _reads(spec: Spec, late_s: float = 0.0) -> list[tuple[float, bytes]]:
    """The canary's events at their clock times (each token `late_s` later still)."""
    clock = iter(spec.clock_s())
    out, t = [], spec.scenario().ttft_s
    for planned in spec.plan():
        if planned.last_token is not None:
            t = next(clock) + late_s
        out.append((t, planned.body.replace(b"\n", b"\r")))
    return out


def test_bytes_and_events_intact() -> None:
    """The canary's own bytes pass; one byte off is named with its offset."""
    figures: dict[str, Any] = {"events": len(SPEC.plan()), "events_expected": len(SPEC.plan())}
    problems: list[str] = []
    reads = _reads(SPEC)
    check_bytes(SPEC, {}, reads, figures, problems)
    assert problems == [] and figures["bytes_intact"]
    damaged = [(t, d.replace(b"Streaming", b"streaming")) for t, d in reads]
    check_bytes(SPEC, {}, damaged, figures, problems)
    assert problems[0].startswith("bytes changed: byte ")


def test_line_endings_other_than_asked_fail() -> None:
    """LF lines in a CR canary are named."""
    problems: list[str] = []
    check_line_endings(SPEC, {"line_endings": {"cr": 30, "lf": 2}}, problems)
    assert problems == ["line endings changed: asked for cr, got {'lf': 2}"]


def test_text_and_terminal_from_the_meter() -> None:
    """The meter's text is the canary's and the stream ended with its terminal event."""
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    for t, data in _reads(SPEC):
        meter.feed(data, t)
    meter.close(3.0)
    figures: dict[str, Any] = {}
    problems: list[str] = []
    check_text(SPEC, "".join(meter.event_texts()), meter, figures, problems)
    assert problems == [] and figures["text_intact"]


def test_holds_against_the_clock_and_a_late_burst() -> None:
    """On the clock: no hold. Every token after the last was due: a whole-body hold."""
    arrivals = [t for t, d in _reads(SPEC) if b'"content":"' in d and b'"content":""' not in d]
    figures: dict[str, Any] = {"token_arrivals_s": arrivals}
    problems: list[str] = []
    check_holds(SPEC, None, 0.0, figures, problems)
    assert problems == [] and figures["holds"]["max_s"] < 1e-9
    end = max(arrivals)
    figures = {"token_arrivals_s": [end + 0.001 * i for i in range(len(arrivals))]}
    check_holds(SPEC, None, 0.0, figures, problems)
    assert figures["holds"]["whole_body"] and problems[0].startswith("held: the first word")
    assert figures["holds"]["first_word_s"] > MAX_HOLD_S - 0.1
