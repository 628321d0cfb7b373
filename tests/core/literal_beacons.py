"""Literal beacons for the core's tests: a stream's reads and the frames a kind of client paints.

A reply of `n` tokens of 5 characters arrives one read per token every `gap_ms`; frames come
every 1000/60 ms. Each client shows a read's text at its own time (at once, after a delay, after
the end), with its own work per frame, writes per frame and characters removed per frame.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hopmeter.core.beacon import Beacon, Frames, Reads

FRAME_MS = 1000 / 60
T0_MS = 1_733_000_000_000.0  # the page's fetch() call, epoch ms
FIRST_READ_MS = 100.0
CHARS_PER_TOKEN = 5


def reads(n: int = 60, gap_ms: float = 20.0) -> list[tuple[float, int, int]]:
    """(t_ms, bytes, characters so far) per read: one token each."""
    return [(FIRST_READ_MS + i * gap_ms, 80, (i + 1) * CHARS_PER_TOKEN) for i in range(n)]


def frames(
    rs: Sequence[tuple[float, int, int]],
    *,
    shown_at: Callable[[float], float] = lambda t: t,
    work_ms: Callable[[int], float] = lambda chars: 1.0,
    in_task: bool = False,
    replace: bool = False,
    fffd: Callable[[int], int] = lambda chars: 0,
    until_ms: float | None = None,
    frame_ms: float = FRAME_MS,
) -> list[tuple[float, float, float, int, int, int, int]]:
    """(painted, raf, write, chars, tasks, removed, fffd) per frame that changed the element.

    A read's text is written when `shown_at(read time)` has passed: by the app's own animation
    frame callback (once per frame), or, `in_task`, by the task that read it (one write each).
    """
    out = []
    end = until_ms if until_ms is not None else max(shown_at(t) for t, _, _ in rs) + 3 * frame_ms
    shown = 0
    k = 0
    while (raf := k * frame_ms) <= end:
        k += 1
        due = [c for t, _, c in rs if shown_at(t) <= raf]
        chars = max(due, default=0)
        if chars == shown:
            continue
        writes = [t for t, _, c in rs if shown < c <= chars]
        tasks = len(writes) if in_task else 1
        painted = raf + work_ms(chars)
        write = min(shown_at(t) for t in writes) + 0.2 if in_task else raf + 0.3
        out.append((painted, raf, write, chars, tasks, shown if replace else 0, fffd(chars)))
        shown = chars
    return out


def beacon(
    rs: Sequence[tuple[float, int, int]],
    fs: Sequence[tuple[float, float, float, int, int, int, int]] | None,
    *,
    end_ms: float | None = None,
    how: str = "done",
    stream_fffd: int = 0,
    plain: bool = True,
    shown: Sequence[int] | None = None,
    alone: Sequence[int] | None = None,
    **changes: Any,
) -> Beacon:
    """The beacon of reads `rs` and frames `fs` (None: no element watched); `alone`: the
    answer characters a decoder per read makes (default: what a correct one does)."""
    chars = tuple(c for _, _, c in rs)
    screen = None
    if fs is not None:
        screen = Frames(
            t_ms=tuple(f[0] for f in fs),
            raf_ms=tuple(f[1] for f in fs),
            write_ms=tuple(f[2] for f in fs),
            chars=tuple(f[3] for f in fs),
            tasks=tuple(f[4] for f in fs),
            removed=tuple(f[5] for f in fs),
            fffd=tuple(f[6] for f in fs),
            lost=0,
            step=1,
            slow=0,
            paint_ms=fs[0][0] if fs else None,
            present_ms=fs[0][0] + 3 if fs else None,
            plain=plain,
        )
    last = rs[-1][0] if rs else 0.0
    fields: dict[str, Any] = {
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
        "url": "/v1/chat/completions",
        "t0_ms": T0_MS,
        "status": 200,
        "headers_ms": 60.0,
        "end_ms": last + 1 if end_ms is None else end_ms,
        "how": how,
        "sent_ms": last + 1200,
        "request_start_ms": 2.0,
        "response_start_ms": 58.0,
        "reads": Reads(
            t_ms=tuple(t for t, _, _ in rs),
            bytes=tuple(b for _, b, _ in rs),
            chars=chars,
            shown=tuple(shown) if shown is not None else chars,
            alone=tuple(alone)
            if alone is not None
            else (tuple(shown) if shown is not None else chars),
            lost=0,
            step=1,
        ),
        "stream_bytes": sum(b for _, b, _ in rs),
        "stream_chars": chars[-1] if chars else 0,
        "stream_shown": (shown[-1] if shown else 0)
        if shown is not None
        else (chars[-1] if chars else 0),
        "stream_fffd": stream_fffd,
        "screen": screen,
        "text": None,
    }
    fields.update(changes)
    return Beacon(**fields)
