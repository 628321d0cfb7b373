"""Client findings from literal beacons: each client from the seed's table is named for what it
did and for nothing else; a good client and an unfinished reply for nothing."""

from __future__ import annotations

import pytest

from hopmeter.core.client import (
    FIXES,
    THRESHOLDS,
    diagnose_client,
    evidence,
    evidence_dict,
    resistant_slope,
    screen_offsets,
    screen_scale,
)
from hopmeter.core.vocab import FindingKind, Severity
from tests.core.literal_beacons import FRAME_MS, beacon, frames, reads


def kinds(b: object) -> list[str]:
    return [f.kind for f in diagnose_client(evidence(b))]  # type: ignore[arg-type]


def test_a_good_client_has_no_finding() -> None:
    """Text written once per frame as it is read: lag under a frame, nothing withheld, cheap
    frames, one write each, everything on screen when the stream ends."""
    rs = reads()
    ev = evidence(beacon(rs, frames(rs)))
    assert ev.complete and ev.screen_chars == ev.stream_chars == 300
    assert ev.lag_p50_ms is not None and 0 < ev.lag_p50_ms < FRAME_MS + 1
    assert ev.withheld_share == 0 and ev.tasks_per_frame_p50 == 1
    assert ev.on_screen_at_end_share is not None and ev.on_screen_at_end_share > 0.9
    assert diagnose_client(ev) == []


def test_a_decoder_per_chunk_shows_fffd_the_stream_did_not_carry() -> None:
    """U+FFFD on screen and none in the stream: decodes chunks alone, and nothing else (its
    extra characters do not pass for a smoothing buffer)."""
    rs = reads()
    b = beacon(rs, frames(rs, fffd=lambda chars: chars // 50))
    (f,) = diagnose_client(evidence(b))
    assert f.kind == FindingKind.CLIENT_DECODES_CHUNKS_ALONE and f.severity == Severity.ERROR
    assert f.evidence["screen_fffd"] == 6 and f.evidence["stream_fffd"] == 0
    assert f.fix == FIXES[FindingKind.CLIENT_DECODES_CHUNKS_ALONE]


def test_fffd_the_stream_carried_is_not_the_client_s() -> None:
    """The server sent U+FFFD itself: the screen shows as many, no client finding."""
    rs = reads()
    assert kinds(beacon(rs, frames(rs, fffd=lambda c: 2), stream_fffd=2)) == []


def test_an_empty_bubble_is_missed_events() -> None:
    """The stream carried 300 characters and the element never changed: missed events."""
    (f,) = diagnose_client(evidence(beacon(reads(), [])))
    assert f.kind == FindingKind.CLIENT_MISSED_EVENTS
    assert f.evidence == {"screen_chars": 0, "stream_chars": 300, "plain_text": True}


def test_markdown_may_hide_some_text_but_plain_text_may_not() -> None:
    """A screen showing 80% of the stream is fine for a Markdown element, missed events for one
    that declared plain text."""
    rs = reads()
    fewer = [(*f[:3], int(f[3] * 0.8), *f[4:]) for f in frames(rs)]
    assert kinds(beacon(rs, fewer, plain=False)) == []
    assert kinds(beacon(rs, fewer, plain=True)) == [FindingKind.CLIENT_MISSED_EVENTS]


def test_a_short_reply_says_nothing_of_missed_events() -> None:
    """Under 20 characters, an empty screen is not called missed events."""
    assert THRESHOLDS["missed_min_chars"] == 20
    assert kinds(beacon(reads(n=3), [])) == []


@pytest.mark.parametrize("speed", [1.0, 0.25, 4.0])
def test_a_whole_message_re_render_grows_with_the_reply_on_any_device(speed: float) -> None:
    """Every frame replaces what the element showed, and its work rises with the reply against
    the page's own first frames: render grows, on a device four times faster or slower alike
    (the same shape, other milliseconds)."""
    rs = reads(n=600)
    work = lambda c: speed * (0.5 + c * 0.004)  # noqa: E731 - a one-line table
    b = beacon(rs, frames(rs, replace=True, work_ms=work), plain=False)
    (f,) = diagnose_client(evidence(b))
    assert f.kind == FindingKind.CLIENT_RENDER_GROWS
    assert f.evidence["replace_frames_share"] == 1.0
    assert f.evidence["work_growth"] > THRESHOLDS["work_growth"]
    assert f.evidence["work_rank_corr"] > 0.9


def test_replacing_with_flat_work_or_growing_work_while_appending_is_not_render_grows() -> None:
    """Either half alone is fine: a cheap re-render, or an append whose layout grows."""
    rs = reads(n=600)
    flat = beacon(rs, frames(rs, replace=True, work_ms=lambda c: 1.0), plain=False)
    growing = beacon(rs, frames(rs, work_ms=lambda c: 0.5 + c * 0.004), plain=False)
    assert kinds(flat) == []
    assert FindingKind.CLIENT_RENDER_GROWS not in kinds(growing)


def test_a_write_per_token_when_tokens_come_faster_than_frames() -> None:
    """Three tokens a frame, each written by the task that read it: writes per token."""
    rs = reads(n=200, gap_ms=5)
    (f,) = diagnose_client(evidence(beacon(rs, frames(rs, in_task=True))))
    assert f.kind == FindingKind.CLIENT_WRITES_PER_TOKEN
    assert f.evidence["tasks_per_frame_p50"] >= 3


def test_one_write_per_token_at_a_slow_pace_is_harmless() -> None:
    """A token every 20 ms is at most one write a frame: no finding."""
    rs = reads(gap_ms=20)
    assert kinds(beacon(rs, frames(rs, in_task=True))) == []


def test_a_reveal_after_the_stream_ended() -> None:
    """Nothing on screen when the stream ended, then the text word by word for seconds."""
    rs = reads()
    end = rs[-1][0] + 1
    fs = frames(rs, shown_at=lambda t: end + 50 + (t - rs[0][0]) * 1.5, in_task=True)
    (f,) = diagnose_client(evidence(beacon(rs, fs, end_ms=end)))
    assert f.kind == FindingKind.CLIENT_REVEALS_AFTER_END
    assert f.evidence["on_screen_at_end_share"] == 0
    assert f.evidence["reveal_after_end_ms"] > 1000


def test_a_playout_buffer_is_an_informational_smoothing_buffer_with_its_delay() -> None:
    """Each token shown 100 ms after it was read, on cheap frames: a smoothing buffer (info),
    whose delay is its lag beyond what a per-frame writer has anyway."""
    rs = reads()
    (f,) = diagnose_client(evidence(beacon(rs, frames(rs, shown_at=lambda t: t + 100))))
    assert f.kind == FindingKind.CLIENT_SMOOTHING_BUFFER and f.severity == Severity.INFO
    assert f.evidence["withheld_share"] > 0.9
    frame_lag = f.evidence["frame_lag_ms"]  # half the page's frame and its work: 8.3 + 1.0
    assert frame_lag == pytest.approx(FRAME_MS / 2 + 1.0, abs=0.1)
    assert f.evidence["delay_ms"] == pytest.approx(f.evidence["lag_p50_ms"] - frame_lag, abs=0.02)
    assert 90 < f.evidence["delay_ms"] < 110


def test_a_slow_device_s_own_frames_set_the_lag_it_has_anyway() -> None:
    """A device drawing 30 frames a second: its frame period is read from its own frames, and
    the lag a frame writer has anyway is half of that plus its work."""
    rs = reads()
    slow = frames(rs, frame_ms=2 * FRAME_MS)
    ev = evidence(beacon(rs, slow))
    assert ev.frame_ms == pytest.approx(2 * FRAME_MS, abs=0.5)
    assert ev.frame_lag_ms == pytest.approx(FRAME_MS + 1.0, abs=0.5)
    assert kinds(beacon(rs, slow)) == []


def test_an_unfinished_reply_gets_no_client_finding() -> None:
    """A page left (or hidden) mid-stream shows less than it read, for no fault of its own."""
    rs = reads()
    assert kinds(beacon(rs, [], how="pagehide")) == []
    assert kinds(beacon(rs, None)) == []  # no element watched


def test_a_timer_s_write_is_waiting_not_work() -> None:
    """A write long after the last read (a timer) adds nothing to the frame's work; a write in
    the task that read adds its time."""
    rs = reads()
    end = rs[-1][0] + 1
    late = frames(rs, shown_at=lambda t: end + 50 + (t - rs[0][0]) * 1.5, in_task=True)
    assert evidence(beacon(rs, late, end_ms=end)).work_p50_ms == pytest.approx(1.0)
    fast = reads(n=200, gap_ms=5)
    assert evidence(beacon(fast, frames(fast, in_task=True))).work_p50_ms == pytest.approx(1.2)


def test_resistant_slope_ignores_a_few_outliers() -> None:
    """Tukey's resistant line: the slope of a line through the thirds' medians, unmoved by two
    wild points; None for fewer than six points or no spread."""
    xs = [float(x) for x in range(30)]
    ys = [2 * x + 1 for x in xs]
    ys[3], ys[25] = 500.0, -500.0
    assert resistant_slope(xs, ys) == pytest.approx(2.0, rel=0.1)
    assert resistant_slope(xs[:5], ys[:5]) is None
    assert resistant_slope([1.0] * 9, list(range(9))) is None


def test_the_screen_scales_up_and_down_to_the_stream() -> None:
    """Markdown shows fewer characters: scaled up; a page that adds some: scaled down."""
    assert screen_scale(1000, 800) == 1.25
    assert screen_scale(1000, 1250) == 0.8
    assert screen_scale(0, 10) == screen_scale(10, 0) == 1.0


def decoder_per_read(rs: list[tuple[float, int, int]]) -> tuple[list[int], list[int]]:
    """What a decoder per read shows after each read when every third read ends inside a
    4-byte character (split 2|2: one U+FFFD for its head, two for its tail): the answer
    characters so far, and the U+FFFD so far."""
    alone, bad, extra = [], [], 0
    for i, (_, _, c) in enumerate(rs):
        if i % 3 == 1 and i + 1 < len(rs):
            extra += 2  # 3 U+FFFD in place of 1 character
        alone.append(c + extra)
        bad.append(extra // 2 * 3)
    return alone, bad


def test_a_screen_with_u_fffd_is_placed_by_its_reads_so_no_lag_is_negative() -> None:
    """A page decoding each read alone shows more characters than the stream carried: each
    frame is placed in the read whose per-read count first reaches it, so its lags are those
    of the same page decoding right (none below zero), and the placement says so."""
    rs = reads()
    alone, bad = decoder_per_read(rs)
    shown_as = [(t, b, a) for (t, b, _), a in zip(rs, alone, strict=True)]
    fffd = dict(zip(alone, bad, strict=True))
    b = beacon(rs, frames(shown_as, fffd=lambda c: fffd.get(c, 0)), alone=alone)
    placed = screen_offsets(b)
    assert placed.aligned_by == "reads" and placed.scale == 1.0
    assert list(placed.offsets) == [float(c) for _, _, c in rs][: len(placed.offsets)]
    right = evidence(beacon(rs, frames(rs)))
    ev = evidence(b)
    assert ev.lag_p50_ms == right.lag_p50_ms
    assert ev.lag_p50_ms is not None and ev.lag_p50_ms >= 0
    assert kinds(b) == [FindingKind.CLIENT_DECODES_CHUNKS_ALONE]
    unread = beacon(rs, frames(shown_as, fffd=lambda c: fffd.get(c, 0)))  # no per-read counts
    assert screen_offsets(unread).aligned_by == "scale"  # an older snippet: scaled down


def test_the_evidence_is_plain_json() -> None:
    """The record's evidence: every number rounded, nothing but plain types."""
    rs = reads()
    d = evidence_dict(evidence(beacon(rs, frames(rs))))
    assert d["complete"] is True and d["screen_chars"] == 300
    assert all(isinstance(v, bool | int | float | type(None)) for v in d.values())
