"""Client findings: what the page did to a stream that arrived intact, from its beacon.

The second half of the seed "GPU to pixel"'s "Where to look first" table happens after the last
proxy, in the page: a TextDecoder per chunk (U+FFFD only in production), a parser that splits on
"\\n\\n" (an empty bubble on CRLF streams), re-rendering the whole message per token (slower as it
grows), one page write per token (stutter), a word-by-word reveal that starts only after the whole
answer arrived (fake streaming), and a smoothing buffer added on purpose (the AI SDK's
smoothStream). Each is read from evidence the beacon carries (hopmeter.core.beacon): when each
read reached the page, and each frame that changed the reply's element, painted when, showing how
many characters, after how much work and how many separate writes.

The thresholds come from the research runs of these clients in real headless Chromium 156
through a real hopmeter (12 pages, 48 of 48 runs diagnosed right), and from the demo page's
clients run on a loaded 2-core machine: each number says which. Growth and buffering are read
from the shape of the evidence against the page's own baseline, never from milliseconds that
depend on the device: a frame's work against the page's first frames, a lag against the lag the
page's own frame period and work give anyway.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from itertools import accumulate, pairwise
from typing import Any

from hopmeter.core.beacon import Beacon
from hopmeter.core.detectors import Finding
from hopmeter.core.figures import median
from hopmeter.core.vocab import FindingKind, Severity

FRAME_MS = 1000 / 60  # a display frame at 60 Hz (headless Chromium's rAF: 16.67 ms, measured)

THRESHOLDS: dict[str, float] = {
    # decodes chunks alone: the screen shows U+FFFD the stream did not carry. One is enough: a
    # streaming decoder never makes one (seed: "� only in production").
    "fffd_excess": 1,
    # missed events: the screen ends with under this share of the stream's answer. Markdown hides
    # syntax (link URLs, fences, emphasis), so not 0.9; an empty bubble (CRLF to a "\n\n"
    # parser) is 0 (measured: 0 of 809 characters).
    "missed_share": 0.5,
    # ... or under this share when the page declared plain text (data-hopmeter-reply="text").
    "missed_share_plain": 0.98,
    # ... of a reply at least this long: a shorter one says nothing.
    "missed_min_chars": 20,
    # render grows: a frame that removes at least this share of what the element showed ...
    "replace_share": 0.8,
    # ... in at least this share of the frames that changed it (re-render: 1.0, appending: 0) ...
    "replace_frames": 0.5,
    # ... while the work per frame rises with the reply: the last tenth of the frames' median
    # work over the page's own baseline frame (the first tenth's median). The demo's re-render
    # of 2,700 characters: 2.7-8.6 in 16 runs on a 2-core machine idle and loaded, whatever its
    # absolute 3.8-6.5 ms at the end; appending clients 0.6-2.6 (seed: re-parsing grows with the
    # reply) ...
    "work_growth": 1.5,
    # ... and rises with it, not in a burst at the end: Spearman's rank correlation of work with
    # the characters shown (re-render 0.59-0.96 in those runs; appending clients -0.1-0.7, a
    # longer text node lays out slower too, which is why replacing is the first condition).
    "work_rank_corr": 0.3,
    # writes per token: the median frame was written by this many separate tasks (a client that
    # writes once per frame: exactly 1; one write per token at 200 tokens/s: 3) ...
    "tasks_per_frame_p50": 2,
    # ... or this share of the frames that changed had two or more (per-token writer: 0.98-1.0).
    "multi_task_frames": 0.3,
    # reveal after end: at most this share of the final text was on screen when the stream
    # ended (measured: 0 for a reveal after res.text(); good clients 0.96-1.0) ...
    "at_end_max_share": 0.1,
    # ... the screen went on changing this many of the page's frames after (a reveal; a last
    # frame lands within one).
    "after_end_min_frames": 2,
    # ... of a stream at least this long (a shorter one cannot be told from a one-shot reply).
    "min_stream_ms": 300,
    # smoothing buffer (info): text read before a frame that changed the screen, yet not shown
    # by it, for this share of the reads (a client that shows what it has: 0; smoothStream
    # 0.91-0.95; a 100 ms playout buffer 0.98-0.99) ...
    "withheld_share": 0.5,
    # ... with a median read -> screen lag beyond the page's own frame lag (half its frame
    # period and its median work: what a client that writes once per frame has anyway, good
    # clients 8.5-10.8 ms at 60 Hz, measured) of at least this many of its frames (good clients
    # within 0.1 of it, the AI SDK's smoothStream 1.1-1.3, a 100 ms playout 6).
    "buffer_frames": 0.5,
    # Frames that must have changed the element before per-frame rules speak.
    "min_frames": 6,
}

FIXES: Mapping[str, str] = {
    FindingKind.CLIENT_DECODES_CHUNKS_ALONE: (
        "Keep one TextDecoder per stream and call decode(chunk, {stream: true}): a character "
        "split between two reads is then decoded whole."
    ),
    FindingKind.CLIENT_MISSED_EVENTS: (
        'Accept CR, LF and CRLF as line ends and end events at blank lines, not at "\\n\\n".'
    ),
    FindingKind.CLIENT_RENDER_GROWS: (
        "Append new text, or re-parse only the last open block; don't re-render the whole "
        "message per update."
    ),
    FindingKind.CLIENT_WRITES_PER_TOKEN: (
        "Collect the tokens that arrive between frames and write them to the page once per "
        "frame (requestAnimationFrame)."
    ),
    FindingKind.CLIENT_REVEALS_AFTER_END: (
        "Render tokens as they are read: a reveal after the whole answer arrived smooths the "
        "text, not the wait."
    ),
    FindingKind.CLIENT_SMOOTHING_BUFFER: (
        "A deliberate jitter buffer adds this delay to every token: lower its delay or chunk "
        "size if the wait matters more than an even pace."
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """The numbers the client findings read from one beacon (ms on the page's clock)."""

    complete: bool  # the body was read to its end, and the screen was watched throughout
    stream_chars: int  # the answer's characters in the stream
    stream_fffd: int
    screen_chars: int  # characters the element showed at the end
    screen_fffd: int  # the most U+FFFD it showed
    frames_changing: int
    lag_p50_ms: float | None  # read -> painted, per read that added text
    withheld_share: float
    work_p50_ms: float | None
    work_end_ms: float | None
    work_slope_ms_per_kchar: float | None
    replace_frames_share: float
    frame_ms: float  # the page's frame period, from its frames (a display frame without them)
    work_start_ms: float | None  # the page's baseline frame: the first tenth's median work
    work_growth: float | None  # the last tenth's median work over the baseline
    work_rank_corr: float | None  # Spearman's: work against the characters shown
    frame_lag_ms: float  # the lag a client writing once per frame has here: frame / 2 + work
    tasks_per_frame_p50: float
    multi_task_frames_share: float
    stream_ms: float | None  # first read to the end of the body
    on_screen_at_end_share: float | None
    reveal_after_end_ms: float | None
    first_painted_ms: float | None  # since t0: the first frame showing text
    plain: bool


def _q(xs: Sequence[float], p: float) -> float | None:
    """The p-quantile (nearest rank) of `xs`, None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]


def screen_scale(stream_chars: int, screen_chars: int) -> float:
    """The factor from the element's characters to the stream's answer characters.

    Markdown shows fewer characters than the stream carries (link URLs, fences, emphasis): the
    screen's counts are scaled up to the stream's; a screen that shows more (a prefix, a cursor)
    is scaled down. A screen with U+FFFD the stream did not carry is aligned by reads instead
    (`screen_offsets`).
    """
    if stream_chars <= 0 or screen_chars <= 0:
        return 1.0
    return stream_chars / screen_chars


@dataclass(frozen=True, slots=True, kw_only=True)
class ScreenOffsets:
    """Per frame, the stream's answer characters it showed, and how that was known."""

    offsets: tuple[float, ...]
    aligned_by: str  # "count" (the same characters), "scale", or "reads" (a decoder per read)
    scale: float  # the factor used ("scale"), 1.0 otherwise


def screen_offsets(b: Beacon) -> ScreenOffsets:
    """Where each frame of the screen is in the stream's answer characters.

    A page that decodes each read alone shows a U+FFFD for every piece of a character split
    between reads: more characters than the stream carried, the excess where the reads split.
    The snippet counts what such a decoder makes of each read (`reads.alone`), so a frame's
    count is placed in the read whose per-read count first reaches it, and the excess stays on
    the decoder, never on the timing: no frame is taken for text it does not show yet. Other
    differences (Markdown hiding syntax, a page adding text) are scaled, up or down.
    """
    f, r = b.screen, b.reads
    if f is None or not f.chars:
        return ScreenOffsets(offsets=(), aligned_by="count", scale=1.0)
    final, stream = f.chars[-1], b.stream_shown
    excess = max(f.fffd, default=0) - b.stream_fffd
    if excess > 0 and r.alone and r.alone[-1] > r.shown[-1]:
        return ScreenOffsets(
            offsets=tuple(_by_reads(c, r.alone, r.shown) for c in f.chars),
            aligned_by="reads",
            scale=1.0,
        )
    scale = screen_scale(stream, final)
    return ScreenOffsets(
        offsets=tuple(c * scale for c in f.chars),
        aligned_by="count" if scale == 1.0 else "scale",
        scale=scale,
    )


def _by_reads(chars: int, alone: Sequence[int], shown: Sequence[int]) -> float:
    """The stream's answer characters under a screen count from a decoder per read: inside the
    read whose per-read count first reaches it, never past that read's own characters."""
    j = bisect_left(alone, chars)
    if j >= len(alone):
        return float(shown[-1]) if shown else 0.0
    before_alone = alone[j - 1] if j else 0
    before = shown[j - 1] if j else 0
    return float(before + min(chars - before_alone, shown[j] - before))


def resistant_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Tukey's resistant line's slope: medians of the right and left thirds, sorted by x.

    As robust as Theil-Sen against a few slow frames (a garbage collection, a busy host) and
    O(n log n) where Theil-Sen's pairs are O(n^2): this runs on the proxy's loop.
    """
    if len(xs) < 6:
        return None
    pts = sorted(zip(xs, ys, strict=True))
    third = len(pts) // 3
    left, right = pts[:third], pts[-third:]
    dx = median(x for x, _ in right) - median(x for x, _ in left)
    if dx <= 0:
        return None
    return (median(y for _, y in right) - median(y for _, y in left)) / dx


def evidence(b: Beacon) -> Evidence:
    """What one beacon says about its client."""
    r = b.reads
    f = b.screen
    stream = b.stream_shown
    t, raf, write = (f.t_ms, f.raf_ms, f.write_ms) if f else ((), (), ())
    chars = f.chars if f else ()
    final = chars[-1] if chars else 0
    # what the screen had reached, in the stream's answer characters
    reach = list(accumulate(screen_offsets(b).offsets, max))
    changing = [i for i in range(len(chars)) if chars[i] != (chars[i - 1] if i else 0)]
    changed_at = [reach[i] for i in changing]
    changed_raf = [raf[i] for i in changing]  # frames run in order: these only grow
    # the reads that added answer text, and the first frame whose count reached each (in C)
    added = [
        (t_read, c - 0.5)
        for t_read, c, before in zip(r.t_ms, r.shown, (0, *r.shown), strict=False)
        if c > 0 and c != before
    ]
    painted = list(map(partial(bisect_left, reach), (c for _, c in added)))
    seen = [(t_read, t[k]) for (t_read, _), k in zip(added, painted, strict=True) if k < len(reach)]
    lags = [t_paint - t_read for t_read, t_paint in seen]
    # withheld: the first frame that changed the screen after a read did not show its text
    n = len(changing)
    firsts = map(partial(bisect_right, changed_raf), (t_read for t_read, _ in added))
    shown_by = map(partial(bisect_left, changed_at), (c for _, c in added))
    held = sum(1 for a, s in zip(firsts, shown_by, strict=True) if a < n and a < s < n)
    work = [_work(i, t, raf, write, r.t_ms) for i in changing]
    tail = work[int(len(work) * 0.9) :]
    head = work[: max(3, len(work) // 10)]
    start = median(head) if len(work) >= THRESHOLDS["min_frames"] else None
    frame = _frame_ms(changed_raf)
    work_p50 = _q(work, 0.5)
    replaced = [
        f.removed[i] / chars[i - 1] >= THRESHOLDS["replace_share"]
        for i in changing
        if f is not None and i and chars[i - 1] > 20
    ]
    tasks = [f.tasks[i] for i in changing] if f else []
    end = b.end_ms
    at_end = max((chars[i] for i in range(len(t)) if end is not None and t[i] <= end), default=0)
    last_change = t[changing[-1]] if changing else None
    first_shown = next((t[i] for i in changing if chars[i] > 0), None)
    slope = resistant_slope([reach[i] for i in changing], work)
    return Evidence(
        complete=b.how == "done" and f is not None,
        stream_chars=stream,
        stream_fffd=b.stream_fffd,
        screen_chars=final,
        screen_fffd=max(f.fffd, default=0) if f else 0,
        frames_changing=len(changing),
        lag_p50_ms=_q(lags, 0.5),
        withheld_share=round(held / len(lags), 3) if lags else 0.0,
        work_p50_ms=work_p50,
        work_end_ms=median(tail) if tail else None,
        work_slope_ms_per_kchar=None if slope is None else round(slope * 1000, 3),
        replace_frames_share=round(sum(replaced) / len(replaced), 3) if replaced else 0.0,
        frame_ms=frame,
        work_start_ms=start,
        work_growth=None if start is None or not tail else median(tail) / max(start, 0.1),
        work_rank_corr=rank_correlation([reach[i] for i in changing], work),
        frame_lag_ms=frame / 2 + (work_p50 or 0.0),
        tasks_per_frame_p50=_q(tasks, 0.5) or 0,
        multi_task_frames_share=round(sum(k >= 2 for k in tasks) / len(tasks), 3) if tasks else 0,
        stream_ms=None if end is None or not r.t_ms else round(end - r.t_ms[0], 1),
        on_screen_at_end_share=round(at_end / final, 3) if final else None,
        reveal_after_end_ms=None if end is None or last_change is None else last_change - end,
        first_painted_ms=first_shown,
        plain=f.plain if f else False,
    )


def _frame_ms(rafs: Sequence[float]) -> float:
    """The page's frame period: the lower quartile of the steps between the animation frames
    that changed the element (each a whole number of frames); a display frame when too few."""
    steps = sorted(b - a for a, b in pairwise(rafs) if b - a >= 1.0)
    if len(steps) < 4:
        return FRAME_MS
    return steps[len(steps) // 4]


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties take their mean rank); None for fewer than six points
    or no spread."""
    if len(xs) < 6:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return None if not vx or not vy else cov / (vx * vy) ** 0.5


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def _work(
    i: int, t: Sequence[float], raf: Sequence[float], write: Sequence[float], reads: Sequence[float]
) -> float:
    """A changing frame's work: its animation callbacks, style and layout (our rAF -> painted),
    and for a write made in a task between frames, the task's time from the last read to it."""
    w = t[i] - raf[i]
    if write[i] < raf[i]:
        j = bisect_right(reads, write[i]) - 1
        # the same task read and wrote only if it took under a frame: a write later than that
        # came from a timer (a reveal, a playout buffer), which is waiting, not work
        if j >= 0 and write[i] - reads[j] <= FRAME_MS:
            w += write[i] - reads[j]
    return w


def _finding(kind: FindingKind, severity: Severity, **ev: Any) -> Finding:
    rounded = {k: round(v, 2) if isinstance(v, float) else v for k, v in ev.items()}
    return Finding(kind=kind, severity=severity, evidence=rounded, fix=FIXES[kind])


def diagnose_client(ev: Evidence) -> list[Finding]:
    """The client findings of one reply, worst first (none when the reply did not end or the
    screen was not watched: a page left mid-stream shows less than it read, for no fault)."""
    if not ev.complete:
        return []
    out: list[Finding] = []
    if ev.screen_fffd - ev.stream_fffd >= THRESHOLDS["fffd_excess"]:
        out.append(
            _finding(
                FindingKind.CLIENT_DECODES_CHUNKS_ALONE,
                Severity.ERROR,
                screen_fffd=ev.screen_fffd,
                stream_fffd=ev.stream_fffd,
            )
        )
    share = THRESHOLDS["missed_share_plain"] if ev.plain else THRESHOLDS["missed_share"]
    missed = (
        ev.stream_chars >= THRESHOLDS["missed_min_chars"]
        and ev.screen_chars < share * ev.stream_chars
    )
    if missed:
        out.append(
            _finding(
                FindingKind.CLIENT_MISSED_EVENTS,
                Severity.ERROR,
                screen_chars=ev.screen_chars,
                stream_chars=ev.stream_chars,
                plain_text=ev.plain,
            )
        )
    grows = _grows(ev)
    if grows:
        out.append(
            _finding(
                FindingKind.CLIENT_RENDER_GROWS,
                Severity.WARNING,
                replace_frames_share=ev.replace_frames_share,
                work_start_ms=ev.work_start_ms,
                work_end_ms=ev.work_end_ms,
                work_growth=ev.work_growth,
                work_rank_corr=ev.work_rank_corr,
                work_slope_ms_per_kchar=ev.work_slope_ms_per_kchar,
            )
        )
    if ev.frames_changing >= THRESHOLDS["min_frames"] and (
        ev.tasks_per_frame_p50 >= THRESHOLDS["tasks_per_frame_p50"]
        or ev.multi_task_frames_share >= THRESHOLDS["multi_task_frames"]
    ):
        out.append(
            _finding(
                FindingKind.CLIENT_WRITES_PER_TOKEN,
                Severity.WARNING,
                tasks_per_frame_p50=ev.tasks_per_frame_p50,
                multi_task_frames_share=ev.multi_task_frames_share,
                frames=ev.frames_changing,
            )
        )
    reveal = _reveals(ev)
    if reveal:
        out.append(
            _finding(
                FindingKind.CLIENT_REVEALS_AFTER_END,
                Severity.ERROR,
                on_screen_at_end_share=ev.on_screen_at_end_share,
                reveal_after_end_ms=ev.reveal_after_end_ms,
                stream_ms=ev.stream_ms,
            )
        )
    decodes = bool(out) and out[0].kind == FindingKind.CLIENT_DECODES_CHUNKS_ALONE
    # every other finding explains the lag its own way (a re-render, a reveal, a screen short of
    # the stream or with characters the stream did not carry: misaligned counts)
    if not (reveal or grows or missed or decodes) and _smooths(ev):
        lag = ev.lag_p50_ms or 0.0
        out.append(
            _finding(
                FindingKind.CLIENT_SMOOTHING_BUFFER,
                Severity.INFO,
                delay_ms=max(0.0, lag - ev.frame_lag_ms),
                lag_p50_ms=lag,
                frame_lag_ms=ev.frame_lag_ms,
                withheld_share=ev.withheld_share,
                work_p50_ms=ev.work_p50_ms,
            )
        )
    return out


def _grows(ev: Evidence) -> bool:
    return (
        ev.frames_changing >= THRESHOLDS["min_frames"]
        and ev.replace_frames_share >= THRESHOLDS["replace_frames"]
        and (ev.work_growth or 0.0) >= THRESHOLDS["work_growth"]
        and (ev.work_rank_corr or 0.0) >= THRESHOLDS["work_rank_corr"]
    )


def _reveals(ev: Evidence) -> bool:
    return (
        (ev.stream_ms or 0.0) >= THRESHOLDS["min_stream_ms"]
        and ev.on_screen_at_end_share is not None
        and ev.on_screen_at_end_share <= THRESHOLDS["at_end_max_share"]
        and (ev.reveal_after_end_ms or 0.0) >= THRESHOLDS["after_end_min_frames"] * ev.frame_ms
    )


def _smooths(ev: Evidence) -> bool:
    beyond = (ev.lag_p50_ms or 0.0) - ev.frame_lag_ms
    return (
        ev.frames_changing >= THRESHOLDS["min_frames"]
        and ev.withheld_share >= THRESHOLDS["withheld_share"]
        and beyond >= THRESHOLDS["buffer_frames"] * ev.frame_ms
    )


def evidence_dict(ev: Evidence) -> dict[str, Any]:
    """The evidence as the record's JSON (ms rounded to 0.01)."""
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(ev).items()}
