"""Tests for hopmeter.report.timeline: a response's view and verdict from its record and body."""

from __future__ import annotations

from typing import Any

from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import finish
from hopmeter.core.tokens import Counter, estimate_counter
from hopmeter.core.vocab import Severity
from hopmeter.report import timeline

SSE = {"content-type": "text/event-stream", "x-accel-buffering": "no"}
WORDS = ["Hello", " 🦙", " 日本語", " there", " friend", " of", " mine", " today", " ok"]


class EstimateCounters:
    """The text-shape estimate for every model."""

    def for_model(self, model: str | None) -> Counter:
        del model
        return estimate_counter()


def chat_event(text: str) -> bytes:
    """One OpenAI chat chunk carrying `text`."""
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


DONE = b"data: [DONE]\n\n"


def measure(chunks: list[tuple[float, bytes]], headers: dict[str, str] = SSE) -> dict[str, Any]:
    """The record the proxy would write for these (time, bytes) chunks."""
    meter = FlowMeter(
        api="openai.chat",
        content_type=headers["content-type"],
        content_encoding=None,
        headers=headers,
    )
    for t, data in chunks:
        meter.feed(data, t)
    meter.close(chunks[-1][0])
    result = finish(
        Seen(
            flow_id="f1",
            trace_id="t1",
            hop="edge",
            listener="edge",
            request=RequestInfo(
                method="POST",
                scheme="http",
                host="h",
                path="/v1/chat/completions",
                t_start=1.7e9,
                t_end=1.7e9,
                bytes=10,
            ),
            response=ResponseInfo(status=200, http_version="HTTP/1.1", headers=headers),
            meter=meter,
            ended="complete",
            bytes_out=meter.bytes_wire,
            stall_threshold_s=0.5,
        ),
        EstimateCounters(),
    )
    return result.record


def steady(stall_before: int = -1) -> list[tuple[float, bytes]]:
    """The words 50 ms apart, one event each, with a 0.8 s stall before word `stall_before`."""
    out, t = [], 0.1
    for i, word in enumerate(WORDS):
        t += 0.8 if i == stall_before else 0.05
        out.append((t, chat_event(word)))
    return [*out, (t + 0.01, DONE)]


def body(chunks: list[tuple[float, bytes]]) -> bytes:
    """The body a client got: every chunk, joined."""
    return b"".join(data for _, data in chunks)


def rows(text: str) -> list[str]:
    """The event rows of a rendered view."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("#"))
    return lines[start + 1 :]


def test_clean_stream_shows_its_verdict_figures_and_each_event_text() -> None:
    """A clean stream: a tick, no findings, one row per event with its time and text."""
    chunks = steady()
    rec = measure(chunks)
    text = timeline.render(body(chunks), rec, content_type="text/event-stream")
    lines = text.splitlines()
    assert lines[0].startswith("hopmeter · openai.chat")
    assert lines[1].startswith("✔ TTFT 150ms · ITL p50 50ms") and lines[1].endswith("· clean")
    assert "FINDINGS  none: the stream looks clean" in lines
    assert any(line.startswith("  ttfb 150ms · ttft 150ms") for line in lines)
    events = rows(text)
    assert len(events) == len(WORDS) + 1
    assert '"Hello"' in events[0] and "150.0" in events[0]
    assert '" 🦙"' in events[1] and '" 日本語"' in events[2]
    assert not any("STALL" in row or "burst" in row for row in events)


def test_a_stall_is_marked_on_its_row_and_found() -> None:
    """The event after a stall carries the STALL tag and a full gap bar; the finding has a fix."""
    chunks = steady(stall_before=4)
    rec = measure(chunks)
    text = timeline.render(body(chunks), rec, content_type="text/event-stream")
    assert text.splitlines()[1].startswith("▲ TTFT") and text.splitlines()[1].endswith("stall")
    (found,) = [line for line in text.splitlines() if line.startswith("  ▲ stall (warning): ")]
    assert found.endswith("max_gap_s=0.8 stalls=1 threshold_s=0.5")  # evidence sorted by name
    assert "fix: A gap above the stall" in text
    stalled = [row for row in rows(text) if "STALL" in row]
    assert len(stalled) == 1 and '" friend"' in stalled[0] and "◀ ▲ STALL 0.800 s" in stalled[0]
    assert "█" * timeline.BAR_CELLS in stalled[0]
    assert timeline.worst_severity(rec) is Severity.WARNING


def test_a_held_body_is_one_burst_and_an_error() -> None:
    """Every event in one read after a long wait: whole_body_hold, every row marked a burst."""
    events = b"".join(data for _, data in steady())
    rec = measure([(0.9, events)])
    text = timeline.render(events, rec, content_type="text/event-stream")
    assert text.splitlines()[1].startswith("✖ ") and "whole_body_hold" in text.splitlines()[1]
    assert "  ✖ whole_body_hold (error):" in text
    assert all(row.endswith("≡ burst") for row in rows(text))
    assert timeline.worst_severity(rec) is Severity.ERROR


def test_a_body_without_a_record_still_lists_its_events() -> None:
    """A flow captured without hopmeter: its events and texts, no times, and it says so."""
    chunks = steady()
    text = timeline.render(body(chunks), None, content_type="text/event-stream")
    assert text.startswith("hopmeter: not measured live")
    events = rows(text)
    assert len(events) == len(WORDS) + 1 and all("       -" in row for row in events)


def test_a_body_that_disagrees_with_the_record_says_so() -> None:
    """A stored body that reads as fewer events than the record lists is named, not hidden."""
    chunks = steady()
    rec = measure(chunks)
    text = timeline.render(body(chunks[:3]), rec, content_type="text/event-stream")
    assert "the stored body reads as 3 events, the record lists 10" in text
    assert len(rows(text)) == 10


def test_markup_and_control_characters_are_shown_as_text() -> None:
    """A model name with an escape sequence and text with controls reach no terminal raw."""
    chunks = [(0.1, chat_event("a\\u001b[2Jb")), (0.2, DONE)]
    rec = measure(chunks)
    rec["model"] = "evil\x1b[31m"
    text = timeline.render(body(chunks), rec, content_type="text/event-stream")
    assert "\x1b" not in text and "evil\\x1b[31m" in text


def test_verdict_of_an_unmeasured_flow_and_what_counts_as_measured() -> None:
    """A flow without figures says so; a plain page with no finding is not an LLM reply."""
    rec = {"api": "openai.chat", "response": {"status": 502, "ended": "error"}, "findings": []}
    assert timeline.verdict(rec) == "hopmeter: not measured (502, error) · clean"
    assert timeline.measured(rec)
    refused = {
        "api": "other",
        "ended": "connect_refused",
        "upstream_error": {"cause": "connect_refused", "status_sent": 502},
        "findings": [{"kind": "upstream_unreachable", "severity": "error"}],
    }
    assert timeline.measured(refused)  # the proxy answered for a failed upstream: worth a verdict
    assert timeline.verdict(refused) == (
        "hopmeter: not measured (502, connect_refused) · upstream_unreachable"
    )
    assert not timeline.measured({"api": "other", "findings": []})
    assert timeline.worst_severity({"findings": [{"severity": "bogus"}]}) is None
