"""The browser and screen lanes: a page's beacon joined to the record of the flow it streamed.

The beacon (hopmeter.core.beacon) says when the page's reader got each chunk and when each frame
that changed the reply's element was painted, on the page's clock, counted in visible characters.
The edge's record says when the edge read each token event, counted in the same characters
(`content_offset`). Aligned by those counts, as hops are (hopmeter.core.hops), they give the two
last segments of the stream's way, per token: `browser>edge` (the edge's read to the page's read:
the edge's own hold, the network, the page's reader) and `screen>browser` (the page's read to the
frame that painted it). Segments are named outer>inner, as `edge>origin` is: the page is the
outermost hop, the screen beyond it.

The page's clock is aligned to the edge's within bounds from causality, as `hopmeter join` aligns
two hosts: the request left the page (Resource Timing's requestStart, else the fetch() call)
before the edge saw it, the beacon left the page before the edge received it, and the response
headers and every token left the edge before the page got them. The screen and the reader share
the page's clock: their skew is 0.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hopmeter.core.beacon import Beacon
from hopmeter.core.client import (
    ScreenOffsets,
    diagnose_client,
    evidence,
    evidence_dict,
    screen_offsets,
)
from hopmeter.core.detectors import Finding
from hopmeter.core.figures import weighted_quantiles
from hopmeter.core.hops import HopFlow, Segment, align, with_suspects
from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import BROWSER, SCREEN, FindingKind

# The screen shows other than the stream's characters (Markdown hides link URLs and fences, a
# page adds text): the alignment of frames to the stream, scaled, is called approximate when
# the screen's count is off the stream's by more than this share. (U+FFFD a decoder per read
# adds is placed by the reads, exactly: hopmeter.core.client.screen_offsets.)
APPROXIMATE_SHARE = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Joined:
    """What a beacon adds to its trace's record, and the figures the metrics observe."""

    browser: dict[str, Any]  # the record's `browser` section
    screen: dict[str, Any] | None  # the record's `screen` section (None: no element watched)
    segments: tuple[Segment, ...]  # screen>browser, browser>edge: outermost first
    findings: tuple[Finding, ...]
    first_painted_s: float | None  # fetch() called -> the first frame that showed the reply
    paint_lags_s: tuple[float, ...]  # per token: read by the page -> painted


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def _view(hop: str, t_start: float, events: Sequence[Sequence[float]]) -> HopFlow:
    return HopFlow(
        hop=hop,
        t_start=t_start,
        t_first_byte=None,
        events=events,
        ttft_s=None,
        itl_p50_s=None,
        finding_kinds=frozenset(),
    )


class _Tokens:
    """The edge's tokens by content offset: how many a page's count of characters completed."""

    def __init__(self, events: Sequence[Sequence[Any]]) -> None:
        rows = [(int(e[2]), int(e[1])) for e in events if len(e) >= 3 and int(e[1]) > 0]
        self.offsets = [c for c, _ in rows]
        self.counts = [k for _, k in rows]

    def completed(self, chars: Sequence[int]) -> list[int]:
        """For each of `chars` (ascending), the tokens whose text ends at or before it: one walk
        over both lists (a beacon has thousands of entries, joined on the proxy's loop)."""
        out = []
        i = done = 0
        offsets, counts, n = self.offsets, self.counts, len(self.offsets)
        for c in chars:
            while i < n and offsets[i] <= c:
                done += counts[i]
                i += 1
            out.append(done)
        return out


def _read_events(b: Beacon, tokens: _Tokens, *, answer_only: bool = False) -> list[list[float]]:
    """[t_s, tokens, content_offset] of each read that added visible characters (`answer_only`:
    answer characters, what the element shows; reasoning and tool text are not painted there)."""
    r = b.reads
    out: list[list[float]] = []
    before = shown_before = done_before = 0
    for t_ms, chars, shown, done in zip(
        r.t_ms, r.chars, r.shown, tokens.completed(r.chars), strict=True
    ):
        if chars > before and (shown > shown_before or not answer_only):
            out.append([t_ms / 1000, done - done_before, chars])
        before, shown_before, done_before = chars, shown, done
    return out


def _screen_events(b: Beacon, tokens: _Tokens) -> tuple[list[list[float]], ScreenOffsets]:
    """[t_s, tokens, content_offset] of each frame that showed more of the reply, and how the
    element's characters were placed in the stream's (hopmeter.core.client.screen_offsets)."""
    f = b.screen
    placed = screen_offsets(b)
    if f is None or not f.chars or f.chars[-1] <= 0:
        return [], placed
    r = b.reads
    same = r.shown == r.chars  # no reasoning or tool text: answer characters are the offsets
    # what came before the answer (reasoning) is not painted there: tokens count from its end
    reached = (
        0 if same else max((c for c, s in zip(r.chars, r.shown, strict=True) if not s), default=0)
    )
    start = reached
    picked: list[tuple[float, int]] = []
    for t_ms, at in zip(f.t_ms, placed.offsets, strict=True):
        shown = round(at)
        if shown <= 0:
            continue
        if same:
            offset = shown
        else:  # the first read that had this much of the answer: its offset counts the rest
            j = bisect_left(r.shown, shown)
            offset = r.chars[min(j, len(r.chars) - 1)] if r.chars else shown
        if offset > reached:
            picked.append((t_ms / 1000, offset))
            reached = offset
    done = tokens.completed([start, *(c for _, c in picked)])
    return [[t, done[i + 1] - done[i], c] for i, (t, c) in enumerate(picked)], placed


def _skew_limits(
    record: Mapping[str, Any], b: Beacon, received_s: float
) -> tuple[float | None, float]:
    """Bounds on (edge clock - page clock) beyond the token events' own, from causality."""
    t0 = b.t0_ms / 1000
    req = record.get("request") or {}
    sent = t0 + b.sent_ms / 1000
    upper = received_s - sent  # the beacon left the page before the edge received it
    left = t0 + (b.request_start_ms or 0.0) / 1000  # the request left the page ...
    upper = min(upper, float(req.get("t_start", received_s)) - left)  # ... before the edge saw it
    lower = None
    headers = (record.get("response") or {}).get("t_headers")
    got = b.response_start_ms if b.response_start_ms is not None else b.headers_ms
    if headers is not None and got is not None:  # the headers left the edge before they came
        lower = float(headers) - (t0 + got / 1000)
    return lower, upper


def join_beacon(
    record: Mapping[str, Any], b: Beacon, received_s: float, *, log_content: bool = False
) -> Joined:
    """The browser and screen lanes of `record`'s stream, from its page's beacon.

    `received_s` is when the beacon reached this hop (epoch seconds, this hop's clock).
    """
    tokens = _Tokens(record.get("events") or [])
    edge = HopFlow.from_record(record)
    t0 = b.t0_ms / 1000
    reads = _read_events(b, tokens)
    browser_seg = align(_view(BROWSER, t0, reads), edge, _skew_limits(record, b, received_s))
    skew = browser_seg.skew_s  # this hop's clock minus the page's
    frames, placed = _screen_events(b, tokens)
    ev = evidence(b)
    findings = tuple(_with_edge_facts(f, record) for f in diagnose_client(ev))
    browser = _browser_section(b, reads, browser_seg, t0 + skew, findings)
    browser["evidence"] = evidence_dict(ev)
    screen = None
    segments: tuple[Segment, ...] = (browser_seg,)
    lags: tuple[float, ...] = ()
    if b.screen is not None:
        answer = _read_events(b, tokens, answer_only=True)
        screen_seg = align(_view(SCREEN, t0, frames), _view(BROWSER, t0, answer), (0.0, 0.0))
        # a reveal after the stream ended "holds the whole body" too: the client finding says
        # it, with the right fix (a whole_body_hold's fix would send the reader to the proxies);
        # a lag below zero (frames aligned wrong) keeps its alignment_suspect finding
        screen_seg = with_suspects(dataclasses.replace(screen_seg, whole_body=False, findings=()))
        segments = (screen_seg, browser_seg)
        lags = screen_seg.holds_s
        screen = _screen_section(
            b,
            frames,
            placed=placed,
            first_ms=ev.first_painted_ms,
            lags=lags,
            log_content=log_content,
        )
    return Joined(
        browser=browser,
        screen=screen,
        segments=segments,
        findings=findings,
        first_painted_s=None if ev.first_painted_ms is None else ev.first_painted_ms / 1000,
        paint_lags_s=lags,
    )


def _browser_section(
    b: Beacon,
    reads: list[list[float]],
    seg: Segment,
    t_start: float,
    findings: Sequence[Finding],
) -> dict[str, Any]:
    r = b.reads

    def at(ms: float | None) -> float | None:
        return None if ms is None else _r(t_start + ms / 1000)

    lo, hi = seg.skew_bounds_s
    return {
        "joined": True,
        "t_start": _r(t_start),
        "skew_s": _r(seg.skew_s),
        "skew_bounds_s": [_r(lo), _r(hi)],
        "path": b.url,
        "status": b.status,
        "how": b.how,
        "t_headers": at(b.headers_ms),
        "t_first_byte": at(r.t_ms[0] if r.t_ms else None),
        "t_last_byte": at(r.t_ms[-1] if r.t_ms else None),
        "t_end": at(b.end_ms),
        "bytes": b.stream_bytes,
        "reads": len(r.t_ms) * r.step + r.lost,
        "reads_merged": r.step,
        "reads_dropped": r.lost,
        "chars": b.stream_chars,
        "shown_chars": b.stream_shown,
        "fffd": b.stream_fffd,
        "events": [[round(t * 1e6) / 1e6, k, c] for t, k, c in reads],  # round(t, 6), faster
        "ttft_s": _r(reads[0][0]) if reads else None,
        "findings": [f.as_dict() for f in findings],
    }


def _screen_section(
    b: Beacon,
    frames: list[list[float]],
    *,
    placed: ScreenOffsets,
    first_ms: float | None,
    lags: Sequence[float],
    log_content: bool,
) -> dict[str, Any]:
    f = b.screen
    assert f is not None
    p50, p90 = weighted_quantiles(lags, [1] * len(lags), (0.5, 0.9))
    out: dict[str, Any] = {
        "events": [[round(t * 1e6) / 1e6, k, c] for t, k, c in frames],
        "frames": len(f.t_ms) * f.step + f.lost,
        "frames_merged": f.step,
        "frames_dropped": f.lost,
        "slow_frames": f.slow,
        "chars": f.chars[-1] if f.chars else 0,
        "fffd": max(f.fffd, default=0),
        "plain_text": f.plain,
        "scale": round(placed.scale, 4),
        "aligned_by": placed.aligned_by,
        "approximate": placed.aligned_by == "scale"
        and _approximate(b.stream_shown, f.chars[-1] if f.chars else 0),
        "ttft_s": None if first_ms is None else _r(first_ms / 1000),
        "first_paint_s": None if f.paint_ms is None else _r(f.paint_ms / 1000),
        "first_present_s": None if f.present_ms is None else _r(f.present_ms / 1000),
        "paint_lag_p50_s": _r(p50),
        "paint_lag_p90_s": _r(p90),
        # lags below zero: in the quantiles above (the alignment_suspect finding on the
        # screen>browser segment says why), counted, never observed into paint_lag_seconds
        "paint_lags_negative": sum(1 for x in lags if x < 0),
    }
    if log_content and b.text is not None:
        out["text"] = b.text
    return out


def _approximate(stream_chars: int, screen_chars: int) -> bool:
    if stream_chars <= 0:
        return False
    return abs(screen_chars / stream_chars - 1) > APPROXIMATE_SHARE


def _with_edge_facts(f: Finding, record: Mapping[str, Any]) -> Finding:
    """A client finding with what the edge saw that explains it: CR or CRLF line endings for
    missed events, characters split across reads for a decoder per chunk."""
    stream = record.get("stream") or {}
    extra: dict[str, Any] = {}
    if f.kind == FindingKind.CLIENT_MISSED_EVENTS:
        endings = stream.get("line_endings") or {}
        if endings.get("cr") or endings.get("crlf"):
            extra["line_endings"] = dict(endings)
    elif f.kind == FindingKind.CLIENT_DECODES_CHUNKS_ALONE:
        extra["chunks_split_utf8_at_edge"] = stream.get("chunks_split_utf8")
    return dataclasses.replace(f, evidence={**f.evidence, **extra}) if extra else f


def attach_beacon(result: FlowResult, joined: Joined) -> FlowResult:
    """`result` with the browser and screen lanes, their segments first in `hops`."""
    record = {**result.record, "browser": joined.browser}
    if joined.screen is not None:
        record["screen"] = joined.screen
    record["hops"] = [s.as_dict() for s in joined.segments] + list(result.record.get("hops", []))
    return dataclasses.replace(result, record=record, segments=(*joined.segments, *result.segments))


def missing_beacon(result: FlowResult, reason: str) -> FlowResult:
    """`result` saying its page announced a beacon that did not come."""
    record = {**result.record, "browser": {"joined": False, "reason": reason}}
    return dataclasses.replace(result, record=record)
