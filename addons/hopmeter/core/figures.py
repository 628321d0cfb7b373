"""The figures users promise on, computed from a flow's event times and token counts.

Definitions follow docs/design.md §6 and the seed article "Streaming responses and buffering":
inter-token latency is token-weighted (an event carrying k tokens after a gap g contributes k
observations of g/k), stalls are gaps at or above a threshold, and the first *visible* token is told
apart from the first byte and the first event.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, compress
from operator import sub, truediv

# A window of one second is what "tokens per second" means to a reader; shorter windows are noise
# at 20-100 tokens/s, longer ones hide a half-second stall.
RATE_WINDOW_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Gaps:
    """Token-weighted inter-token gaps: `values_s[i]` observed `weights[i]` times."""

    values_s: tuple[float, ...]
    weights: tuple[int, ...]
    event_gaps_s: tuple[float, ...]  # the raw gap before each token-carrying event after the first
    # `values_s` sorted, when every weight is 1 and they were sorted for the figures' quantiles:
    # the metrics count them into buckets from it rather than sort them again (in memory only)
    ordered_s: list[float] | None = field(default=None, compare=False, repr=False)


def token_gaps(times_s: Sequence[float], tokens: Sequence[int]) -> Gaps:
    """Split the gap before each token-carrying event evenly over the tokens it carries.

    The first token-carrying event has no gap (its wait is the time to first token); events with
    no tokens are transparent: the next gap is measured from the last event that carried tokens.
    """
    return _gaps(*_carrying(times_s, tokens))


# The helpers below run at each flow's end on the proxy's event loop: they map over whole lists
# (the loops run in C) instead of building a tuple per event; `compute_figures` of a 400-event
# flow 362 -> ~165 µs.


def _carrying(times_s: Sequence[float], tokens: Sequence[int]) -> tuple[list[float], list[int]]:
    """The times and token counts of the events that carry tokens."""
    if len(times_s) != len(tokens):
        raise ValueError("times_s and tokens differ in length")
    if min(tokens, default=1) > 0:  # every event carries tokens (the usual stream)
        return list(times_s), list(tokens)
    keep = [k > 0 for k in tokens]
    return list(compress(times_s, keep)), list(compress(tokens, keep))


def _gaps(times: list[float], counts: list[int], *, ordered: bool = False) -> Gaps:
    # each gap later - earlier, 0.0 unless above it (a -0.0 or NaN gap too), with no Python
    # call per gap (not max(): max(-0.0, 0.0) is -0.0)
    raw = tuple([gap if gap > 0.0 else 0.0 for gap in map(sub, times[1:], times)])
    weights = tuple(counts[1:])
    if weights.count(1) == len(weights):  # one token per event: the gaps are the values
        return Gaps(
            values_s=raw,
            weights=weights,
            event_gaps_s=raw,
            ordered_s=sorted(raw) if ordered else None,
        )
    return Gaps(values_s=tuple(map(truediv, raw, weights)), weights=weights, event_gaps_s=raw)


def median(values: Iterable[float]) -> float:
    """The middle value, or the mean of the two middle ones (statistics.median's answer, without
    importing statistics and fractions into every proxy: ~0.2 MiB of idle memory). No values:
    ValueError.

    A nearest-rank p50 picks the lower middle of an even count, which on a hold distribution of
    two clusters (tokens released in two bursts) is one cluster's value, not the middle.
    """
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("median of no values")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fmean(values: Iterable[float]) -> float:
    """The mean, its sum taken exactly (math.fsum: statistics.fmean's answer). No values:
    ValueError."""
    xs = values if isinstance(values, list | tuple) else list(values)
    if not xs:
        raise ValueError("mean of no values")
    return math.fsum(xs) / len(xs)


def weighted_quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float | None:
    """The smallest value whose cumulative weight reaches `q` of the total (nearest rank)."""
    return weighted_quantiles(values, weights, (q,))[0]


def weighted_quantiles(
    values: Sequence[float],
    weights: Sequence[int],
    qs: Sequence[float],
    *,
    ordered: Sequence[float] | None = None,
) -> list[float | None]:
    """`weighted_quantile` for each of `qs` (ascending), sorting once; `ordered` is `values`
    sorted, when every weight is 1 and the caller has them so (not sorted again)."""
    total = sum(weights)
    if total <= 0:
        return [None] * len(qs)
    ranks = [max(1, math.ceil(q * total)) for q in qs]
    if total == len(weights) and min(weights) == 1:  # all weights 1: a plain sort of floats
        if ordered is None:
            ordered = sorted(values)
        return [ordered[rank - 1] for rank in ranks]
    out: list[float | None] = []
    acc = 0
    for value, weight in sorted(zip(values, weights, strict=True)):
        acc += weight
        while len(out) < len(ranks) and acc >= ranks[len(out)]:
            out.append(value)
        if len(out) == len(ranks):
            return out
    return out + [max(values)] * (len(ranks) - len(out))


def min_window_rate(
    times_s: Sequence[float], tokens: Sequence[int], window_s: float
) -> float | None:
    """The lowest tokens-per-second over any window of `window_s` inside the token-carrying span.

    Windows start at each token-carrying event (where a rate can first drop) and must fit inside
    the span; a stream shorter than one window has no windowed rate.
    """
    return _min_window_rate(*_carrying(times_s, tokens), window_s)


def _min_window_rate(times: list[float], counts: list[int], window_s: float) -> float | None:
    if len(times) < 2 or times[-1] - times[0] < window_s:
        return None
    cumulative = [0, *accumulate(counts)]
    # a window opens at each token-carrying event whose window fits inside the span
    ends_at = [start + window_s for start in times]
    opened = bisect_right(ends_at, times[-1])
    if not opened:
        return None
    # the window opened at event i holds the tokens of events i+1 .. end-1, where `end` is the
    # first event at or past its end; the lowest count over the window is the lowest rate
    ends = map(partial(bisect_left, times), ends_at[:opened])
    fewest: int = min(map(sub, map(cumulative.__getitem__, ends), cumulative[1 : opened + 1]))
    return fewest / window_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """Per-flow figures (seconds are offsets from the request start)."""

    ttfb_s: float | None
    ttfe_s: float | None
    ttft_s: float | None
    ttft_content_s: float | None
    duration_s: float | None
    tokens: int
    itl_p50_s: float | None
    itl_p99_s: float | None
    max_gap_s: float | None
    stalls: int
    tokens_per_s: float | None
    tokens_per_s_min_window: float | None
    gaps: Gaps | None = None  # what the ITL figures come from (for metrics; not in the record)


def compute_figures(
    *,
    first_byte_s: float | None,
    last_byte_s: float | None,
    times_s: Sequence[float],
    tokens: Sequence[int],
    first_event_s: float | None,
    first_visible_s: float | None,
    first_content_s: float | None,
    stall_threshold_s: float,
) -> Figures:
    """Every per-flow figure from the event list; nothing here reads a clock."""
    times, counts = _carrying(times_s, tokens)
    gaps = _gaps(times, counts, ordered=True)  # sorted once, for the quantiles and the metrics
    total = sum(counts)
    itl_p50, itl_p99 = weighted_quantiles(
        gaps.values_s, gaps.weights, (0.50, 0.99), ordered=gaps.ordered_s
    )
    rate = None
    if len(times) >= 2 and times[-1] > times[0]:
        rate = (total - counts[0]) / (times[-1] - times[0])
    return Figures(
        ttfb_s=first_byte_s,
        ttfe_s=first_event_s,
        ttft_s=first_visible_s,
        ttft_content_s=first_content_s,
        duration_s=last_byte_s,
        tokens=total,
        itl_p50_s=itl_p50,
        itl_p99_s=itl_p99,
        max_gap_s=max(gaps.event_gaps_s) if gaps.event_gaps_s else None,
        stalls=sum(map(stall_threshold_s.__le__, gaps.event_gaps_s)),
        tokens_per_s=rate,
        tokens_per_s_min_window=_min_window_rate(times, counts, RATE_WINDOW_S),
        gaps=gaps,
    )
