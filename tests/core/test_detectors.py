"""Detectors on literal timelines: each fault found with evidence, healthy streams left alone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.delivery import Delivery
from hopmeter.core.detectors import StreamView, detect_burst_gaps, diagnose
from hopmeter.core.figures import token_gaps

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


def test_a_stream_read_in_part_claims_no_missing_end() -> None:
    """Past its read budget the meter stops reading (a compression bomb): the end it never read
    is not "missing", nor its last event "not terminated"; a reset or an error still counts."""
    part = {"terminal_seen": False, "unterminated_bytes": 12, "read_in_part": True}
    assert not [f for f in diagnose(view(clock(20, 50), **part)) if f.kind == "truncated"]
    f = diagnose(view(clock(20, 50), ended="upstream_reset", **part))
    assert f[0].evidence["reasons"] == ["upstream reset the connection"]


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


def test_collapsed_gaps_in_a_steady_stream_are_not_bursts() -> None:
    """A steady coalesced stream whose reads now and then carry two events is not bursty."""
    times = clock(75, 25)
    for i in (10, 30, 50, 60):  # the next event shared this one's read
        times[i + 1] = times[i]
    assert kinds(view(times, [4] * 75)) == []


def test_stalls_shorter_than_a_frame_are_not_bursts() -> None:
    """Windows released a few ms apart reach the screen together: not burst_gaps."""
    times = [1.0 + 0.004 * (i // 20) for i in range(100)]
    assert detect_burst_gaps(view(times, ttfb_s=1.0)) is None
    slower = [1.0 + 0.4 * (i // 20) for i in range(100)]
    assert detect_burst_gaps(view(slower, ttfb_s=1.0)) is not None


def test_bursts_explain_their_stalls() -> None:
    """Windows a second apart are burst_gaps; the stalls between them are not reported twice."""
    times = [0.1 + 1.0 * (i // 30) + 0.0001 * (i % 30) for i in range(120)]
    found = diagnose(view(times, stalls=3, max_gap_s=1.0))
    assert [f.kind for f in found] == ["burst_gaps"]
    assert found[0].evidence["events_per_burst"] == 30


def test_body_released_in_reads_a_few_ms_apart_is_one_hold() -> None:
    """A held body that arrives in four reads up to 8 ms apart is still a whole-body hold."""
    times = [3.1] * 100 + [3.1002] * 100 + [3.1082] * 100 + [3.1102] * 4
    sizes = [3] * 304
    f = diagnose(view(times, sizes=sizes, ttfb_s=3.1))
    assert [x.kind for x in f] == ["whole_body_hold"]
    assert f[0].evidence["final_burst_share"] == 1.0
    assert f[0].evidence["wait_before_burst_s"] == 3.1


def test_hold_after_an_early_prelude_is_found() -> None:
    """A role prelude flushed at once and the rest held to the end is a whole-body hold."""
    times = [0.05] + [3.0] * 60
    sizes = [40] + [150] * 60
    f = diagnose(view(times, [0] + [1] * 60, sizes=sizes, ttfb_s=0.05, ttft_s=3.0))
    assert [x.kind for x in f] == ["whole_body_hold"]
    assert f[0].evidence["wait_before_burst_s"] == 2.95


def test_steady_reply_after_a_long_first_token_is_not_a_hold() -> None:
    """A short reply on a 100 tokens/s clock after 15 s of hidden reasoning is not held."""
    times = clock(40, 100, start=15.0)
    found = kinds(view(times, ttfb_s=0.05, ttft_s=15.0))
    assert "whole_body_hold" not in found
    assert "slow_first_token" in found


def test_fast_stream_after_a_slow_prefill_is_not_a_hold() -> None:
    """300 tokens at 200 tokens/s after a 0.8 s first byte arrive too slowly to be one burst."""
    assert kinds(view(clock(300, 200, start=0.8))) == []


def test_streaming_signals_behind_a_proxy_that_strips_one() -> None:
    """Either X-Accel-Buffering: no or a no-cache/no-transform Cache-Control is enough."""
    behind_nginx = {"content-type": "text/event-stream", "cache-control": "no-cache"}
    assert kinds(view(clock(20, 50), headers=behind_nginx)) == []
    accel_only = {"content-type": "text/event-stream", "x-accel-buffering": "no"}
    assert kinds(view(clock(20, 50), headers=accel_only)) == []
    bare = {"content-type": "text/event-stream"}
    f = diagnose(view(clock(20, 50), headers=bare))
    assert [x.kind for x in f] == ["buffering_headers"]
    assert f[0].severity == "info"


def test_content_length_is_flagged_even_with_streaming_signals() -> None:
    """Content-Length and ETag on a stream are a warning whatever else the headers say."""
    f = diagnose(view(clock(20, 50), headers={**GOOD, "content-length": "10", "etag": '"x"'}))
    assert f[0].kind == "buffering_headers"
    assert f[0].severity == "warning"
    assert f[0].evidence["problems"] == ["Content-Length on a stream", "ETag on a stream"]


def test_byte_window_survives_two_windows_in_one_read() -> None:
    """4 KiB windows stay a byte window when two of them land in one read."""
    counts = [22, 20, 24, 21, 23, 44, 22, 20, 23, 21, 24, 22, 9]  # the 6th read is two windows
    windows = [4096] * 12 + [1500]
    windows[5] = 8192
    chunk_times = [0.25 * (i + 1) for i in range(len(counts))]
    times = [t for t, n in zip(chunk_times, counts, strict=True) for _ in range(n)]
    f = diagnose(view(times, chunk_times_s=chunk_times, chunk_bytes=windows, ttfb_s=chunk_times[0]))
    assert [x.kind for x in f] == ["burst_gaps"]
    assert f[0].evidence["pattern"] == "byte_window"
    assert f[0].evidence["bytes_per_burst"] == 4096


def test_equal_token_batches_are_a_token_count_pattern() -> None:
    """Releases of exactly six events whose bytes vary with the words are a token count."""
    chunk_times = [0.3 * (i + 1) for i in range(10)]
    sizes = [900, 1040, 860, 1120, 980, 1010, 870, 1090, 940, 1000]
    times = [t for t in chunk_times for _ in range(6)]
    f = diagnose(view(times, chunk_times_s=chunk_times, chunk_bytes=sizes, ttfb_s=0.3))
    assert [x.kind for x in f] == ["burst_gaps"]
    assert f[0].evidence["pattern"] == "token_count"


def delivery(**kw: object) -> Delivery:
    """A measured delivery: a client that kept up and a hop that held nothing, unless told."""
    args: dict[str, object] = dict(
        measured=True,
        reason=None,
        http_version="HTTP/1.1",
        chunks_out=[],
        client_wait_s=0.0,
        client_wait_is_lower_bound=False,
        queued_bytes_max=0,
        queued_at_close_bytes=None,
        rwnd_limited_s=0.0,
        holds=(),
        hold_p50_s=0.0001,
        hold_p99_s=0.0003,
        hold_max_s=0.0004,
        own_steps=0,
        own_step_max_s=None,
        own_step_max_cpu_s=None,
        loop_lag_max_s=None,
        involuntary_switches=3,
    )
    args.update(kw)
    return Delivery(**args)  # type: ignore[arg-type]


class TestSlowClient:
    def test_a_client_that_kept_up_draws_nothing(self) -> None:
        """No wait on the client, no hold in the hop: no delivery finding."""
        assert kinds(view(clock(60, 50), delivery=delivery())) == []

    def test_a_long_wait_on_the_client_is_slow_client_with_its_evidence(self) -> None:
        """Waiting on the client for most of the stream is slow_client, the wait in evidence."""
        v = view(
            clock(60, 50),
            delivery=delivery(client_wait_s=2.5, queued_bytes_max=800_000, rwnd_limited_s=2.4),
        )
        (found,) = diagnose(v)
        assert found.kind == "slow_client" and found.severity == "warning"
        ev = found.evidence
        assert (ev["client_wait_s"], ev["queued_bytes_max"], ev["rwnd_limited_s"]) == (
            2.5,
            800_000,
            2.4,
        )
        assert ev["wait_to_stream"] == pytest.approx(2.5 / 1.18, abs=1e-3)

    def test_a_slow_clients_backpressure_is_not_an_upstream_stall(self) -> None:
        """A proxy reads no faster than its client takes the bytes: with slow_client, the gaps
        between reads (stalls, bursts) are the client's, not the upstream's, and are not
        reported as stall or burst_gaps (whose fixes point at the upstream)."""
        times = [0.1 + 1.5 * (i // 30) + 0.0001 * (i % 30) for i in range(120)]
        slow = delivery(client_wait_s=5.0, queued_bytes_max=3_600_000)
        assert kinds(view(times, stalls=3, max_gap_s=1.5)) == ["burst_gaps"]
        assert kinds(view(times, stalls=3, max_gap_s=1.5, delivery=slow)) == ["slow_client"]
        lone = [0.1 + 0.02 * i for i in range(60)] + [4.0 + 0.02 * i for i in range(60)]
        assert kinds(view(lone, stalls=1, max_gap_s=2.7)) == ["stall"]
        assert kinds(view(lone, stalls=1, max_gap_s=2.7, delivery=slow)) == ["slow_client"]

    def test_a_gap_longer_than_the_clients_wait_is_still_a_stall(self) -> None:
        """The client's wait cannot explain a gap longer than itself: the upstream's silence
        stays reported beside slow_client."""
        lone = [0.1 + 0.02 * i for i in range(60)] + [21.3 + 0.02 * i for i in range(60)]
        wait = delivery(client_wait_s=3.0, queued_bytes_max=600_000)
        found = kinds(view(lone, stalls=1, max_gap_s=20.0, delivery=wait))
        assert sorted(found) == ["slow_client", "stall"]

    def test_short_waits_are_noise(self) -> None:
        """A wait under both the share of the stream and the absolute floor is not a finding."""
        long_stream = clock(600, 50)  # 12 s: 10% is 1.2 s
        assert kinds(view(long_stream, delivery=delivery(client_wait_s=1.0))) == []
        assert kinds(view(clock(5, 50), delivery=delivery(client_wait_s=0.09))) == []

    def test_downloads_go_at_one_sides_pace_without_fault(self) -> None:
        """A body that is not an event stream is never slow_client."""
        v = view(clock(60, 50), event_stream=False, delivery=delivery(client_wait_s=5.0))
        assert "slow_client" not in kinds(v)


class TestProxyHold:
    def test_a_chunk_held_in_the_hop_is_proxy_hold(self) -> None:
        """A read-to-write hold of 60 ms inside this hop is proxy_hold."""
        v = view(clock(60, 50), delivery=delivery(hold_max_s=0.06, hold_p99_s=0.06))
        (found,) = diagnose(v)
        assert found.kind == "proxy_hold" and found.evidence["hold_max_s"] == 0.06

    def test_a_slow_own_step_is_proxy_hold_even_with_no_chunk_held(self) -> None:
        """hopmeter's own measuring using 50 ms of CPU while the flow streamed is proxy_hold."""
        d = delivery(own_steps=3, own_step_max_s=0.055, own_step_max_cpu_s=0.05)
        (found,) = diagnose(view(clock(60, 50), delivery=d))
        assert found.kind == "proxy_hold"
        assert (found.evidence["own_step_max_cpu_s"], found.evidence["own_steps"]) == (0.05, 3)

    def test_a_process_left_waiting_by_the_os_is_not_hopmeters_step(self) -> None:
        """A 50 ms step that used 1 ms of CPU was the host, not hopmeter: no finding from it."""
        d = delivery(own_steps=1, own_step_max_s=0.05, own_step_max_cpu_s=0.001)
        assert kinds(view(clock(60, 50), delivery=d)) == []


_BURSTS = st.lists(
    st.tuples(
        st.integers(1, 12),  # events in the burst
        st.sampled_from([0.0, 1e-5, 0.002, 0.01, 0.03]),  # the gap inside it
        st.sampled_from([0.0, 0.01, 0.05, 0.3, 1.5, -0.001]),  # the gap before it
        st.sampled_from([0, 1, 1, 1, 2]),  # tokens per event
    ),
    min_size=1,
    max_size=8,
)


@given(_BURSTS, st.sampled_from([None, 0.0, float("nan"), float("inf")]))
def test_burst_gaps_from_the_figures_gaps_are_the_ones_taken_here(
    bursts: list[tuple[int, float, float, int]], odd_time: float | None
) -> None:
    """detect_burst_gaps given the figures' gaps (each 0.0 unless above it) finds what it finds
    taking the gaps itself, for bursty, steady, out-of-order and too-short streams, and for
    times with a NaN or infinity in them (which it does not take the figures' way)."""
    times: list[float] = []
    tokens: list[int] = []
    t = 0.0
    for events, inner, before, k in bursts:
        t += before
        for i in range(events):
            t += inner if i else 0.0
            times.append(t)
            tokens.append(k)
    if odd_time is not None:
        times[len(times) // 2] = odd_time
    alone = view(times, tokens)
    gaps = token_gaps(times, tokens).event_gaps_s
    assert detect_burst_gaps(replace(alone, event_gaps_s=gaps)) == detect_burst_gaps(alone)


def test_the_burst_gaps_property_test_sees_bursts() -> None:
    """The shape the property test above draws finds bursts (it would compare None with None
    otherwise)."""
    times = [b * 0.5 + i * 0.002 for b in range(6) for i in range(10)]
    tokens = [1] * len(times)
    gaps = token_gaps(times, tokens).event_gaps_s
    found = detect_burst_gaps(replace(view(times, tokens), event_gaps_s=gaps))
    assert found is not None and found == detect_burst_gaps(view(times, tokens))
