"""Bytes out, per flow: when each chunk left the hop's process, when the kernel sent it, and how
long the flow waited on its client (docs/design.md §4, `delivery` and `chunks_out`).

hopmeter.core.ledger follows one connection's bytes; the proxy layer collects what it saw of one
flow (`DeliverySeen`) and `summarize` turns it into the record's numbers, with no clock of its own.
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from hopmeter.core.figures import weighted_quantiles
from hopmeter.core.ledger import FLAG_HELD, FLAG_OUT, FLAG_SENT, FlowChunks

# A chunk's read time comes back from the record rounded to the microsecond, so a hold computed
# from it may be below zero by up to half of that: such a hold is 0. One further below is not a
# hold (a write stamped before its read): counted, never observed.
ROUNDING_S = 1e-6

# why a chunk still on its way when the record is taken counts as not seen sent
STILL_QUEUED = "still queued when the record was written"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySeen:
    """What the proxy layer saw of one flow's bytes going out: the input of `summarize`."""

    reason: str | None  # why it was not measured (or not wholly), None when all went well
    measured: bool
    chunks: FlowChunks | None
    mono0: float  # the monotonic time of the request start (record offsets are t - mono0 + skew)
    skew_s: float
    http_version: str  # the client's side: "HTTP/1.1", "HTTP/2.0", ...
    queued_bytes_max: int | None = None  # user-space buffer + kernel unsent (+ HTTP/2 stream)
    queued_at_close_bytes: int | None = None  # not yet acknowledged when the connection closed
    rwnd_limited_s: float | None = None  # TCP_INFO: time the client's receive window was the limit
    steps: Sequence[tuple[float, float, float]] = ()  # hopmeter's own slow steps: start, wall, cpu
    loop_lags_s: Sequence[tuple[float, float]] = ()  # (when, how late) the loop ran a timer
    involuntary_switches: int | None = None  # times the OS took the CPU from the process


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """The `delivery` section of a record and what metrics and detectors read of it."""

    measured: bool
    reason: str | None
    http_version: str
    chunks_out: list[list[float | None]]  # [out_s, sent_s] per listed chunk, index-aligned
    client_wait_s: float | None
    client_wait_is_lower_bound: bool
    queued_bytes_max: int | None
    queued_at_close_bytes: int | None
    rwnd_limited_s: float | None
    holds: tuple[tuple[float, int], ...]  # (hold, tokens) per written chunk: the hop's own hold
    hold_p50_s: float | None
    hold_p99_s: float | None
    hold_max_s: float | None
    own_steps: int
    own_step_max_s: float | None
    own_step_max_cpu_s: float | None
    loop_lag_max_s: float | None
    involuntary_switches: int | None
    negative_holds: int = 0  # holds (token-weighted, as `holds`) below zero: counted, not kept

    def as_dict(self) -> dict[str, Any]:
        """The record's `delivery` section (docs/design.md §4)."""
        return {
            "measured": self.measured,
            "reason": self.reason,
            "http_version": self.http_version,
            "client_wait_s": _r(self.client_wait_s),
            "client_wait_is_lower_bound": self.client_wait_is_lower_bound,
            "queued_bytes_max": self.queued_bytes_max,
            "queued_at_close_bytes": self.queued_at_close_bytes,
            "rwnd_limited_s": _r(self.rwnd_limited_s),
            "hold_p50_s": _r(self.hold_p50_s),
            "hold_p99_s": _r(self.hold_p99_s),
            "hold_max_s": _r(self.hold_max_s),
            "negative_holds": self.negative_holds,
            "own_steps": self.own_steps,
            "own_step_max_s": _r(self.own_step_max_s),
            "own_step_max_cpu_s": _r(self.own_step_max_cpu_s),
            "loop_lag_max_s": _r(self.loop_lag_max_s),
            "involuntary_switches": self.involuntary_switches,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x * 1e6) / 1e6


def union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of [start, end] intervals (empty or reversed ones count 0)."""
    total = 0.0
    lo = hi = -math.inf
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if a > hi:
            if hi > lo:
                total += hi - lo
            lo, hi = a, b
        elif b > hi:
            hi = b
    if hi > lo:
        total += hi - lo
    return total


def tokens_per_chunk(
    chunk_t_s: Sequence[float], event_t_s: Sequence[float], event_tokens: Sequence[int]
) -> list[int]:
    """Tokens each chunk completed: an event's time is the read time of the chunk that ended it.

    In the usual stream every chunk completes one event, and the meter then gives the chunk times
    as the first events' times (`FlowMeter.chunk_t`): the i-th chunk's tokens are the i-th
    event's, with no search. The same as searching each event's chunk when the chunk times are
    the events' first times and strictly increasing; otherwise each event's chunk is searched.
    """
    n = len(chunk_t_s)
    out = [0] * n
    events: Iterator[tuple[float, int]] = zip(event_t_s, event_tokens, strict=False)
    if (
        n
        and min(len(event_t_s), len(event_tokens)) >= n
        and type(chunk_t_s) is type(event_t_s)
        and chunk_t_s == event_t_s[:n]
        and all(map(operator.lt, chunk_t_s, itertools.islice(chunk_t_s, 1, None)))
    ):
        out = list(itertools.islice(event_tokens, n))
        if min(out) < 0:  # (none is, from a TokenAccount: then no bytecode per chunk)
            out = [k if k > 0 else 0 for k in out]
        events = itertools.islice(events, n, None)  # events past the listed chunks: searched
    for t, k in events:
        i = bisect_right(chunk_t_s, t) - 1
        if 0 <= i < len(out) and k > 0:
            out[i] += k
    return out


def summarize(
    seen: DeliverySeen,
    chunk_t_s: Sequence[float],
    event_t_s: Sequence[float],
    event_tokens: Sequence[int],
) -> Delivery:
    """One flow's delivery from what the proxy saw; `chunk_t_s` are the record's chunk offsets.

    The hop's own hold of a chunk is read → handed to the client's transport (`T_WRITE - T_IN`):
    a chunk that then waited in the buffers waited on the client, and one held in mitmproxy's
    HTTP/2 stream buffer waited for the client's window; both count as client wait instead. Holds
    are weighted by the tokens each chunk completed (by chunk when the stream carries no tokens).
    Client wait is the union, over chunks, of [written (or read, for a held chunk), last seen
    waiting].
    """
    chunks = seen.chunks
    base = _evidence(seen)
    if not seen.measured or chunks is None:
        return Delivery(**base, measured=False, **_empty())
    chunks.settle(STILL_QUEUED)
    n = len(chunk_t_s)
    if len(chunks) != n:  # never a wrong number: unaligned lists are not measured
        why = f"followed {len(chunks)} chunks, the record lists {n}"
        return Delivery(**{**base, "reason": why}, measured=False, **_empty())
    tokens = tokens_per_chunk(chunk_t_s, event_t_s, event_tokens)
    by_tokens = any(tokens)
    mono0, skew = seen.mono0, seen.skew_s
    followed = _follow_plain(chunks, chunk_t_s, tokens, by_tokens=by_tokens, mono0=mono0, skew=skew)
    if followed is None:
        followed = _follow_each(
            chunks, chunk_t_s, tokens, by_tokens=by_tokens, mono0=mono0, skew=skew
        )
    rows, holds, waits, negative, unseen = followed
    values = [h for h, _ in holds]
    weights = [k for _, k in holds]
    p50, p99 = weighted_quantiles(values, weights, (0.5, 0.99))
    base["reason"] = seen.reason or chunks.why
    return Delivery(
        **base,
        measured=True,
        chunks_out=rows,
        client_wait_s=union_s(waits),
        client_wait_is_lower_bound=unseen,
        holds=tuple(holds),
        hold_p50_s=p50,
        hold_p99_s=p99,
        hold_max_s=max(values) if values else None,
        negative_holds=negative,
    )


_Followed = tuple[
    list[list[float | None]], list[tuple[float, int]], list[tuple[float, float]], int, bool
]  # rows [out_s, sent_s], holds (hold, weight), waits (from, to), negative holds, unseen


def _follow_each(
    chunks: FlowChunks,
    chunk_t_s: Sequence[float],
    tokens: list[int],
    *,
    by_tokens: bool,
    mono0: float,
    skew: float,
) -> _Followed:
    """Each chunk's out and sent offsets, hold and wait, one chunk at a time: any flow."""
    rows: list[list[float | None]] = []
    holds: list[tuple[float, int]] = []
    waits: list[tuple[float, float]] = []
    negative = 0
    unseen = False
    isnan = math.isnan
    # one pass over the columns side by side (a record's chunks: up to 4,096 per flow)
    for flags, t_write, out, w, t_in_s, k in zip(
        chunks.flags, chunks.t_write, chunks.out, chunks.waited, chunk_t_s, tokens, strict=True
    ):
        waited = None if isnan(w) else w
        out_s = None if not flags & FLAG_OUT else round((out - mono0 + skew) * 1e6) / 1e6
        sent_s = None
        if flags & FLAG_SENT:
            sent = out if waited is None or waited < out else waited
            sent_s = round((sent - mono0 + skew) * 1e6) / 1e6
        else:
            unseen = True
        rows.append([out_s, sent_s])
        if not isnan(t_write):
            held = flags & FLAG_HELD
            t_in = t_in_s + mono0 - skew
            if not held:
                weight = k if by_tokens else 1
                hold = t_write - t_in
                if weight and hold >= -ROUNDING_S:
                    holds.append((max(0.0, hold), weight))
                elif weight:
                    negative += weight
            if waited is not None:
                waits.append((t_in if held else t_write, waited))
    return rows, holds, waits, negative, unseen


_PLAIN_FLAGS = FLAG_OUT | FLAG_SENT  # seen out and sent, not held
_NAN_BYTES = array("d", [math.nan]).tobytes()  # FlowChunks' nan, as its `waited` column holds it


def _follow_plain(
    chunks: FlowChunks,
    chunk_t_s: Sequence[float],
    tokens: list[int],
    *,
    by_tokens: bool,
    mono0: float,
    skew: float,
) -> _Followed | None:
    """`_follow_each`'s result for a client that kept up (the usual flow), mapped over whole
    columns with no bytecode per chunk; None for any other flow. Kept up: every chunk written,
    seen out and sent, never held nor seen waiting. Then a chunk's sent time is its out time,
    there are no waits, and each hold is its write less its read: the same floats as
    `_follow_each`, computed in the same order (tests/core/test_delivery.py holds the two
    together)."""
    n = len(chunks.flags)
    if chunks.flags.count(_PLAIN_FLAGS) != n:
        return None
    t_write = chunks.t_write
    if any(map(math.isnan, t_write)):
        return None
    waited = chunks.waited
    if waited.tobytes() != _NAN_BYTES * n:  # not every one nan (never seen waiting)
        return None
    out = chunks.out
    # (out - mono0 + skew), to the microsecond: round(x * 1e6) / 1e6 (float.__round__: round()
    # itself for a float, without its method lookup)
    offsets = map(operator.add, map(operator.sub, out, repeat(mono0)), repeat(skew))
    micro = map(float.__round__, map(operator.mul, offsets, repeat(1e6)))
    out_s = list(map(operator.truediv, micro, repeat(1e6)))
    # [out_s, sent_s], the same float twice: a comprehension's BUILD_LIST (~790 instructions a
    # row) costs less than list() of each zip tuple (~980)
    rows: list[list[float | None]] = [[x, x] for x in out_s]
    # hold = t_write - (t_in_s + mono0 - skew)
    t_in = map(operator.sub, map(operator.add, chunk_t_s, repeat(mono0)), repeat(skew))
    raw = list(map(operator.sub, t_write, t_in))
    weights: Sequence[int] = tokens if by_tokens else [1] * n
    negative = 0
    if raw and not math.isnan(sum(raw)) and min(raw) >= -ROUNDING_S:
        # every hold at or above -ROUNDING_S (none NaN: a NaN makes the sum NaN, and min() is
        # only sure without one), as in the usual flow: none is negative, and a chunk is kept
        # when it has a weight, with no test per chunk
        keep: Sequence[object] = weights
    else:
        ok = list(map(operator.ge, raw, repeat(-ROUNDING_S)))
        keep = list(map(operator.and_, map(bool, weights), ok)) if by_tokens else ok
        negative = sum(itertools.compress(weights, map(operator.not_, ok)))
    kept = list(itertools.compress(raw, keep))
    if not kept or min(kept) <= 0.0:  # max(0.0, hold): only a hold at or below 0 changes
        kept = list(map(max, repeat(0.0), kept))
    holds = list(zip(kept, itertools.compress(weights, keep), strict=True))
    return rows, holds, [], negative, False


def _empty() -> dict[str, Any]:
    return {
        "chunks_out": [],
        "client_wait_s": None,
        "client_wait_is_lower_bound": False,
        "holds": (),
        "hold_p50_s": None,
        "hold_p99_s": None,
        "hold_max_s": None,
        "negative_holds": 0,
    }


def _evidence(seen: DeliverySeen) -> dict[str, Any]:
    """The per-flow facts that need no chunk: queues, TCP_INFO, hopmeter's own steps."""
    walls = [wall for _, wall, _ in seen.steps]
    cpus = [cpu for _, _, cpu in seen.steps]
    lags = [lag for _, lag in seen.loop_lags_s]
    return {
        "reason": seen.reason,
        "http_version": seen.http_version,
        "queued_bytes_max": seen.queued_bytes_max,
        "queued_at_close_bytes": seen.queued_at_close_bytes,
        "rwnd_limited_s": seen.rwnd_limited_s,
        "own_steps": len(seen.steps),
        "own_step_max_s": max(walls, default=None),
        "own_step_max_cpu_s": max(cpus, default=None),
        "loop_lag_max_s": max(lags, default=None),
        "involuntary_switches": seen.involuntary_switches,
    }
