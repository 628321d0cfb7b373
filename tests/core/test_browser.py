"""Joining a page's beacon to the record of its stream: the browser and screen lanes, their
segments per token, the page's clock bounded by causality, on literal records and beacons."""

from __future__ import annotations

from typing import Any

import pytest

from hopmeter.core.browser import attach_beacon, join_beacon, missing_beacon
from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import FindingKind
from tests.core.literal_beacons import T0_MS, beacon, frames, reads

EDGE_AHEAD_S = 0.0005  # the edge read each token this long before the page did


def record(
    rs: list[tuple[float, int, int]], *, clock_s: float = 0.0, **extra: Any
) -> dict[str, Any]:
    """The edge's record of the stream the page read as `rs`, on a clock `clock_s` ahead of the
    page's: the request arrived 5 ms after fetch(), every token 0.5 ms before the page read it."""
    t_start = T0_MS / 1000 + 0.005 + clock_s
    events = [
        [round((T0_MS + t) / 1000 + clock_s - EDGE_AHEAD_S - t_start, 6), 1, c] for t, _, c in rs
    ]
    rec: dict[str, Any] = {
        "trace_id": "ab" * 16,
        "flow_id": "f1",
        "hop": "edge",
        "request": {"t_start": t_start, "path": "/v1/chat/completions"},
        "response": {"t_headers": t_start + 0.04},
        "events": [[0.03, 0, 0], *events],
        "figures": {"ttft_s": events[0][0]},
        "findings": [],
        "stream": {"line_endings": {"crlf": 62, "lf": 0, "cr": 0}, "chunks_split_utf8": 4},
    }
    rec.update(extra)
    return rec


def received(rs: list[tuple[float, int, int]], clock_s: float = 0.0) -> float:
    """When the beacon reached the edge: 50 ms after it was sent (1.2 s after the last read)."""
    return (T0_MS + rs[-1][0] + 1250) / 1000 + clock_s


def test_a_good_client_s_lanes() -> None:
    """Both lanes, each token aligned: browser>edge holds the 0.5 ms the edge was ahead, the
    screen paints within a frame of the read, the clocks agree (skew 0 inside its bounds)."""
    rs = reads()
    j = join_beacon(record(rs), beacon(rs, frames(rs)), received(rs))
    screen_seg, browser_seg = j.segments
    assert (screen_seg.segment, browser_seg.segment) == ("screen>browser", "browser>edge")
    assert browser_seg.holds_s == pytest.approx([EDGE_AHEAD_S] * 60, abs=1e-6)
    lo, hi = browser_seg.skew_bounds_s
    assert lo == pytest.approx(-EDGE_AHEAD_S, abs=1e-6)
    assert hi == pytest.approx(0.003, abs=1e-6)  # the request left 2 ms after fetch()
    assert browser_seg.skew_s == 0.0
    assert len(screen_seg.holds_s) == 60 and 0 < max(screen_seg.holds_s) < 0.018
    assert screen_seg.skew_bounds_s == (0.0, 0.0)
    b = j.browser
    assert b["joined"] is True and b["t_start"] == pytest.approx(T0_MS / 1000)
    assert b["events"][0] == [0.1, 1, 5] and len(b["events"]) == 60
    assert b["findings"] == [] and b["evidence"]["complete"] is True
    assert j.screen is not None and j.screen["chars"] == 300 and not j.screen["approximate"]
    assert j.first_painted_s == pytest.approx(j.screen["ttft_s"])
    assert j.paint_lags_s == screen_seg.holds_s


def test_the_page_s_clock_may_be_off_by_seconds() -> None:
    """A page clock 2 s behind the edge's: the skew is found within bounds, the holds are the
    same, and the browser lane's times are on the edge's clock."""
    rs = reads()
    j = join_beacon(record(rs, clock_s=2.0), beacon(rs, frames(rs)), received(rs, 2.0))
    _, seg = j.segments
    lo, hi = seg.skew_bounds_s
    assert lo is not None and hi is not None and lo <= seg.skew_s <= hi
    assert seg.skew_s == pytest.approx(2.0 - EDGE_AHEAD_S)
    assert max(seg.holds_s) == pytest.approx(0.0, abs=1e-6)
    assert j.browser["t_start"] == pytest.approx(T0_MS / 1000 + 2.0, abs=0.001)


def test_the_beacon_s_own_arrival_bounds_the_clock() -> None:
    """The beacon left the page before the edge got it: a beacon received 1 ms after it was sent
    caps the skew at 1 ms past the page's clock."""
    rs = reads()
    b = beacon(rs, frames(rs), request_start_ms=None)
    sent = (T0_MS + b.sent_ms) / 1000
    j = join_beacon(record(rs), b, sent + 0.001)
    assert j.segments[1].skew_bounds_s[1] == pytest.approx(0.001, abs=1e-6)


def test_tokens_follow_the_edge_s_events() -> None:
    """A read that completed three of the edge's tokens carries three; reads that added no text
    are not events of the lane."""
    rs = [(100.0, 50, 0), (120.0, 90, 15), (140.0, 30, 15), (160.0, 40, 20)]
    rec = record([(100.0, 0, 5), (100.0, 0, 10), (120.0, 0, 15), (160.0, 0, 20)])
    j = join_beacon(rec, beacon(rs, frames(rs)), received(rs))
    assert [e[1:] for e in j.browser["events"]] == [[3, 15], [1, 20]]


def test_reasoning_maps_the_screen_to_content_offsets() -> None:
    """A stream with reasoning first: the element shows the answer only, and each frame is
    aligned at the offset of the read that carried that much of the answer."""
    rs = [(100.0 + 20 * i, 80, 5 * (i + 1)) for i in range(20)]
    shown = [0] * 10 + [5 * (i + 1) for i in range(10)]  # 10 reasoning tokens, then the answer
    answer = [(t, b, s) for (t, b, _), s in zip(rs, shown, strict=True)]
    j = join_beacon(record(rs), beacon(rs, frames(answer), shown=shown), received(rs))
    assert j.screen is not None
    offsets = [e[2] for e in j.screen["events"]]
    assert offsets[0] > 50 and offsets[-1] == 100  # past the reasoning's 50 characters
    assert sum(e[1] for e in j.screen["events"]) == 10  # the answer's tokens only
    assert len(j.segments[0].holds_s) == 10


def test_markdown_s_fewer_characters_scale_up_and_say_approximate() -> None:
    """An element showing 80% of the characters: frames scaled to the stream, flagged."""
    rs = reads()
    fewer = [(*f[:3], int(f[3] * 0.8), *f[4:]) for f in frames(rs)]
    j = join_beacon(record(rs), beacon(rs, fewer, plain=False), received(rs))
    assert j.screen is not None
    assert j.screen["scale"] == 1.25 and j.screen["approximate"] is True
    assert j.screen["events"][-1][2] == 300


def test_a_decoder_per_read_s_screen_lags_its_reads_as_a_right_one_would() -> None:
    """A page decoding each read alone (every third read splits a 4-byte character): its frames
    are placed by its reads, every paint lag is the right decoder's, none below zero, and the
    screen says how it was aligned."""
    rs = reads()
    extra, alone = 0, []
    for i, (_, _, c) in enumerate(rs):
        extra += 2 if i % 3 == 1 else 0
        alone.append(c + extra)
    shown_as = [(t, b, a) for (t, b, _), a in zip(rs, alone, strict=True)]
    fs = frames(shown_as, fffd=lambda c: 1 + (c - 5) // 20)
    j = join_beacon(record(rs), beacon(rs, fs, alone=alone), received(rs))
    right = join_beacon(record(rs), beacon(rs, frames(rs)), received(rs))
    assert j.screen is not None and j.screen["aligned_by"] == "reads"
    assert j.screen["approximate"] is False and j.screen["paint_lags_negative"] == 0
    assert j.paint_lags_s == right.paint_lags_s and min(j.paint_lags_s) >= 0
    assert j.segments[0].findings == ()


def test_lags_below_zero_are_kept_counted_and_flagged() -> None:
    """Frames that claim text before the page read it (a screen count that does not measure the
    stream): the negative lags stay in the quantiles, the screen counts them, and the segment
    carries an alignment_suspect finding with the same count."""
    rs = reads()
    early = frames(rs, shown_at=lambda t: t - 60)
    j = join_beacon(record(rs), beacon(rs, early), received(rs))
    assert j.screen is not None
    below = sum(1 for x in j.paint_lags_s if x < 0)
    assert below > 0 and j.screen["paint_lags_negative"] == below
    (f,) = j.segments[0].findings
    assert f["kind"] == "alignment_suspect"
    assert f["evidence"]["negative"] == {"hold": below, "added_ttft": 1}


def test_a_missed_events_finding_carries_the_edge_s_line_endings() -> None:
    """An empty bubble on a CRLF stream: the finding says the edge saw CRLF."""
    rs = reads()
    j = join_beacon(record(rs), beacon(rs, []), received(rs))
    (f,) = j.findings
    assert f.kind == FindingKind.CLIENT_MISSED_EVENTS
    assert f.evidence["line_endings"] == {"crlf": 62, "lf": 0, "cr": 0}
    assert j.screen is not None and j.screen["events"] == [] and j.screen["ttft_s"] is None


def test_a_reveal_after_the_end_is_not_a_whole_body_hold_of_the_screen() -> None:
    """The screen segment of a reveal held every token for seconds: the client finding says so,
    not a whole_body_hold pointing at proxies."""
    rs = reads()
    end = rs[-1][0] + 1
    fs = frames(rs, shown_at=lambda t: end + 50 + (t - rs[0][0]) * 1.5, in_task=True)
    j = join_beacon(record(rs), beacon(rs, fs, end_ms=end), received(rs))
    screen_seg = j.segments[0]
    assert screen_seg.whole_body is False and screen_seg.findings == ()
    assert min(screen_seg.holds_s) > 1.0
    assert [f.kind for f in j.findings] == [FindingKind.CLIENT_REVEALS_AFTER_END]


def test_no_element_watched_gives_the_browser_lane_only() -> None:
    """A beacon without a screen: one segment, no screen section."""
    rs = reads()
    j = join_beacon(record(rs), beacon(rs, None), received(rs))
    assert j.screen is None and [s.segment for s in j.segments] == ["browser>edge"]


def test_opted_in_text_reaches_the_record_only_with_log_content() -> None:
    """The page's text is kept in the screen section with --log-content, dropped without."""
    rs = reads()
    b = beacon(rs, frames(rs), text="hello")
    assert "text" not in (join_beacon(record(rs), b, received(rs)).screen or {})
    with_text = join_beacon(record(rs), b, received(rs), log_content=True).screen
    assert with_text is not None and with_text["text"] == "hello"


def test_attach_puts_the_lanes_and_segments_first() -> None:
    """The record gains browser, screen and the two segments before its own hops; the result's
    segments (for the metrics) likewise."""
    rs = reads()
    rec = record(rs, hops=[{"segment": "edge>origin"}])
    result = FlowResult(record=rec, figures=None, tokens=None, segments=("inner",))
    out = attach_beacon(result, join_beacon(rec, beacon(rs, frames(rs)), received(rs)))
    assert [h["segment"] for h in out.record["hops"]] == [
        "screen>browser",
        "browser>edge",
        "edge>origin",
    ]
    assert out.record["browser"]["joined"] and out.record["screen"]["frames"] > 0
    assert [getattr(s, "segment", s) for s in out.segments] == [
        "screen>browser",
        "browser>edge",
        "inner",
    ]
    assert "browser" not in rec  # the record given is left as it was


def test_a_missing_beacon_says_why() -> None:
    """A record that waited in vain says so, and nothing else changes."""
    rec = record(reads())
    out = missing_beacon(FlowResult(record=rec, figures=None, tokens=None), "no beacon")
    assert out.record["browser"] == {"joined": False, "reason": "no beacon"}
    assert out.record["events"] == rec["events"]
