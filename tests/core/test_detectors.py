"""Detectors on literal timelines: each fault found with evidence, healthy streams left alone."""

from __future__ import annotations

import random

from hopmeter.core.detectors import StreamView, diagnose

GOOD = {
    "content-type": "text/event-stream",
    "x-accel-buffering": "no",
    "cache-control": "no-cache, no-transform",
}


def view(
    times: list[float],
    tokens: list[int] | None = None,
    *,
    sizes: list[int] | None = None,
    **kw: object,
) -> StreamView:
    """A terminated 200 event stream with one chunk per event unless sizes/chunks are given."""
    tokens = tokens or [1] * len(times)
    args: dict[str, object] = dict(
        status=200,
        api="openai.chat",
        event_stream=True,
        headers=GOOD,
        ended="complete",
        chunk_times_s=times,
        chunk_bytes=sizes or [150] * len(times),
        event_times_s=times,
        event_tokens=tokens,
        ttfb_s=times[0],
        ttft_s=times[0],
        terminal_seen=True,
    )
    args.update(kw)
    return StreamView(**args)  # type: ignore[arg-type]


def kinds(v: StreamView) -> list[str]:
    return [f.kind for f in diagnose(v)]


def clock(n: int, rate: float, start: float = 0.1) -> list[float]:
    return [start + i / rate for i in range(n)]


def test_clean_stream_has_no_findings() -> None:
    """A steady 50 tokens/s stream with good headers draws no finding."""
    assert kinds(view(clock(60, 50))) == []


def test_jittered_stream_is_not_bursty() -> None:
    """±30% jitter on every interval is natural, not bursts."""
    rng = random.Random(3)
    t, times = 0.1, []
    for _ in range(200):
        times.append(t)
        t += 0.02 * rng.uniform(0.7, 1.3)
    assert kinds(view(times)) == []


def test_single_stall_is_only_a_stall() -> None:
    """One 900 ms stall in a steady stream is a stall finding and nothing more."""
    times = clock(60, 50)
    times = times[:30] + [x + 0.9 for x in times[30:]]
    found = diagnose(view(times, stalls=1, max_gap_s=0.92))
    assert [f.kind for f in found] == ["stall"]
    assert found[0].evidence == {"stalls": 1, "max_gap_s": 0.92, "threshold_s": 0.5}


def test_coalesced_stream_is_not_bursty() -> None:
    """Four tokens per event at a steady clock is one gap mode: not bursts."""
    times = clock(30, 12.5)
    assert kinds(view(times, [4] * 30)) == []


def test_byte_window_bursts_are_found() -> None:
    """Eight events released together every 400 ms is burst_gaps with a byte-window pattern."""
    times, sizes = [], []
    for burst in range(8):
        for i in range(8):
            times.append(0.4 * (burst + 1) + 0.0002 * i)
            sizes.append(150)
    f = diagnose(view(times, sizes=sizes))
    assert [x.kind for x in f] == ["burst_gaps"]
    ev = f[0].evidence
    assert ev["bursts"] == 8
    assert ev["tokens_per_burst"] == 8
    assert abs(ev["stall_period_s"] - 0.4) < 0.01
    assert ev["pattern"] in ("byte_window", "token_count")


def test_whole_body_hold_is_found() -> None:
    """All events arriving in one burst after two seconds is a whole-body hold."""
    times = [2.0 + 0.0001 * i for i in range(40)]
    f = diagnose(view(times, ttfb_s=2.0))
    assert f[0].kind == "whole_body_hold"
    assert f[0].evidence["final_burst_share"] == 1.0
    assert "burst_gaps" not in [x.kind for x in f]


def test_headers_that_let_proxies_buffer() -> None:
    """Missing X-Accel-Buffering and no-cache, and a Content-Length, are listed."""
    f = diagnose(
        view(clock(20, 50), headers={"content-type": "text/event-stream", "content-length": "100"})
    )
    assert f[0].kind == "buffering_headers"
    assert f[0].severity == "warning"
    assert "Content-Length on a stream" in f[0].evidence["problems"]


def test_truncated_stream_reasons() -> None:
    """No terminal event, a reset and an error event are each a truncation reason."""
    f = diagnose(view(clock(20, 50), terminal_seen=False))
    assert f[0].kind == "truncated" and f[0].evidence["reasons"] == ["no terminal event"]
    f = diagnose(view(clock(20, 50), terminal_seen=False, ended="upstream_reset"))
    assert f[0].evidence["reasons"] == ["upstream reset the connection"]
    f = diagnose(view(clock(20, 50), errors=["overloaded_error"]))
    assert f[0].evidence["reasons"] == ["error event in a 200 stream"]


def test_not_streamed_document() -> None:
    """A chat reply as one document is not_streamed, an error when a stream was asked for."""
    v = view([3.0], [0], event_stream=False, document_tokens=200, stream_requested=True)
    f = diagnose(v)
    assert [x.kind for x in f] == ["not_streamed"]
    assert f[0].severity == "error"


def test_content_faults() -> None:
    """U+FFFD, split characters, compression and CRLF are each reported."""
    v = view(
        clock(20, 50),
        replacement_chars=2,
        events_incomplete_utf8=3,
        line_endings={"crlf": 40},
        headers={**GOOD, "content-encoding": "gzip"},
    )
    assert set(kinds(v)) == {
        "replacement_char",
        "split_utf8",
        "line_endings",
        "compression_on_stream",
    }


def test_findings_are_worst_first() -> None:
    """Errors come before warnings before informational findings."""
    v = view(
        clock(20, 50),
        replacement_chars=1,
        line_endings={"cr": 1},
        headers={"content-type": "text/event-stream", "content-length": "5"},
    )
    sev = [f.severity for f in diagnose(v)]
    assert sev == sorted(sev, key=["error", "warning", "info"].index)


def test_slow_first_token_reports_reasoning() -> None:
    """A first visible token 1.2 s after the first byte is reported with the lag."""
    f = diagnose(view(clock(20, 50, start=1.3), ttfb_s=0.1, ttft_s=1.3, ttft_content_s=2.0))
    assert [x.kind for x in f] == ["slow_first_token"]
    assert f[0].evidence["lag_s"] == 1.2
