"""Helpers for testing incremental decoders, shared by hopmeter's tests and its users.

Every stateful parser in `hopmeter.core` must give the same frames however its input is chunked;
`split_every_way()` produces the chunkings worth trying and `feed_all()` runs one through a decoder.
`ManualClock` is a clock and timers (hopmeter.clock) that move only when a test advances them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from hopmeter.core.frames import Frame
from hopmeter.core.wire import Framer

# Inputs longer than this get evenly spaced cut positions instead of every one, so a 300 KB
# recording yields a few hundred chunkings rather than 300,000.
DEFAULT_MAX_SPLITS = 256
# Double cuts tried at each of a few positions: chunks of 1, 2 and 3 bytes in the middle, the
# sizes that cut a CRLF, a UTF-8 sequence or a BOM apart.
_DOUBLE_CUT_WIDTHS = (1, 2, 3)
_DOUBLE_CUT_POSITIONS = 8


def _cut_positions(size: int, max_splits: int) -> list[int]:
    if size - 1 <= max_splits:
        return list(range(1, size))
    step = (size - 1) / max_splits
    return sorted({1 + int(i * step) for i in range(max_splits)})


def split_every_way(data: bytes, max_splits: int = DEFAULT_MAX_SPLITS) -> Iterator[list[bytes]]:
    """Yield chunkings of `data`: whole, byte by byte, each single cut, and a few double cuts.

    Single cuts cover every position when `data` has at most `max_splits + 1` bytes, else
    `max_splits` evenly spaced ones. Every chunking joins back to `data`.
    """
    yield [data]
    if len(data) < 2:
        return
    yield [data[i : i + 1] for i in range(len(data))]
    cuts = _cut_positions(len(data), max_splits)
    for cut in cuts:
        yield [data[:cut], data[cut:]]
    stride = max(1, len(cuts) // _DOUBLE_CUT_POSITIONS)
    for first in cuts[::stride][:_DOUBLE_CUT_POSITIONS]:
        for width in _DOUBLE_CUT_WIDTHS:
            second = first + width
            if second < len(data):
                yield [data[:first], data[first:second], data[second:]]


def split_at(data: bytes, positions: Iterable[int]) -> list[bytes]:
    """Cut `data` at the given offsets (any order, duplicates and out-of-range ones ignored)."""
    bounds = [0, *sorted({p for p in positions if 0 < p < len(data)}), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


def feed_all(
    decoder: Framer, chunks: Sequence[bytes], times: Sequence[float] | None = None
) -> list[Frame]:
    """Feed every chunk, then close; return all frames.

    Chunk i is fed at `times[i]` (default: float(i)); `close()` gets `times[len(chunks)]` when
    given, else the last time (default: float(len(chunks))).
    """
    if times is None:
        times = [float(i) for i in range(len(chunks) + 1)]
    if len(times) not in (len(chunks), len(chunks) + 1):
        raise ValueError(f"need {len(chunks)} or {len(chunks) + 1} times, got {len(times)}")
    frames: list[Frame] = []
    for chunk, now in zip(chunks, times, strict=False):
        frames.extend(decoder.feed(chunk, now))
    close_time = times[-1] if times else 0.0
    frames.extend(decoder.close(close_time))
    return frames


class ManualTimer:
    """A call scheduled on a ManualClock (hopmeter.clock.TimerHandle)."""

    __slots__ = ("_cancelled", "args", "callback", "due_s")

    def __init__(self, due_s: float, callback: Callable[..., object], args: tuple[Any, ...]):
        self.due_s = due_s
        self.callback = callback
        self.args = args
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled

    def when(self) -> float:
        return self.due_s


class ManualClock:
    """A clock (hopmeter.clock.Clock) and timers (hopmeter.clock.Timers) that move only when
    `advance()` moves them: timers fire in order of due time (then of scheduling), each with the
    clock set to its due time; one scheduled by a callback fires in the same advance if it falls
    due within it."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self._due: list[tuple[float, int, ManualTimer]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now_s

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> ManualTimer:
        timer = ManualTimer(self.now_s + max(0.0, delay), callback, args)
        heapq.heappush(self._due, (timer.due_s, next(self._order), timer))
        return timer

    def pending(self) -> int:
        """Timers scheduled and neither fired nor cancelled."""
        return sum(1 for _, _, timer in self._due if not timer.cancelled())

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, firing every timer that falls due on the way."""
        if seconds < 0:
            raise ValueError(f"a clock moves forward, not by {seconds}")
        until_s = self.now_s + seconds
        while self._due and self._due[0][0] <= until_s:
            _, _, timer = heapq.heappop(self._due)
            if timer.cancelled():
                continue
            self.now_s = max(self.now_s, timer.due_s)
            timer.callback(*timer.args)
        self.now_s = until_s
