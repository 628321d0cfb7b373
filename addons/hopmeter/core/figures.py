"""The figures users promise on, computed from a flow's event times and token counts.

Definitions follow DESIGN.md §6 and the seed article "Streaming responses and buffering":
inter-token latency is token-weighted (an event carrying k tokens after a gap g contributes k
observations of g/k), stalls are gaps at or above a threshold, and the first *visible* token is told
apart from the first byte and the first event.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

# A window of one second is what "tokens per second" means to a reader; shorter windows are noise
# at 20-100 tokens/s, longer ones hide a half-second stall.
RATE_WINDOW_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Gaps:
    """Token-weighted inter-token gaps: `values_s[i]` observed `weights[i]` times."""

    values_s: tuple[float, ...]
    weights: tuple[int, ...]
    event_gaps_s: tuple[float, ...]  # the raw gap before each token-carrying event after the first


def token_gaps(times_s: Sequence[float], tokens: Sequence[int]) -> Gaps:
    """Split the gap before each token-carrying event evenly over the tokens it carries.

    The first token-carrying event has no gap (its wait is the time to first token); events with
    no tokens are transparent: the next gap is measured from the last event that carried tokens.
    """
    pts = [(t, k) for t, k in zip(times_s, tokens, strict=True) if k > 0]
    raw = tuple(max(0.0, b[0] - a[0]) for a, b in pairwise(pts))
    weights = tuple(k for _, k in pts[1:])
    values = tuple(g / k for g, k in zip(raw, weights, strict=True))
    return Gaps(values_s=values, weights=weights, event_gaps_s=raw)


def weighted_quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float | None:
    """The smallest value whose cumulative weight reaches `q` of the total (nearest rank)."""
    return weighted_quantiles(values, weights, (q,))[0]


def weighted_quantiles(
    values: Sequence[float], weights: Sequence[int], qs: Sequence[float]
) -> list[float | None]:
    """`weighted_quantile` for each of `qs` (ascending), sorting once."""
    total = sum(weights)
    if total <= 0:
        return [None] * len(qs)
    ranks = [max(1, math.ceil(q * total)) for q in qs]
    if total == len(weights) and min(weights) == 1:  # all weights 1: a plain sort of floats
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
    pts = [(t, k) for t, k in zip(times_s, tokens, strict=True) if k > 0]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < window_s:
        return None
    times = [t for t, _ in pts]
    cumulative = [0, *accumulate(k for _, k in pts)]
    lowest: float | None = None
    for i, start in enumerate(times):
        if start + window_s > times[-1]:
            break
        end = bisect_left(times, start + window_s)
        # tokens that arrived after the window opened: those of events i+1 .. end-1
        rate = (cumulative[end] - cumulative[i + 1]) / window_s
        lowest = rate if lowest is None else min(lowest, rate)
    return lowest


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
    gaps = token_gaps(times_s, tokens)
    total = sum(k for k in tokens if k > 0)
    token_times = [t for t, k in zip(times_s, tokens, strict=True) if k > 0]
    itl_p50, itl_p99 = weighted_quantiles(gaps.values_s, gaps.weights, (0.50, 0.99))
    rate = None
    if len(token_times) >= 2 and token_times[-1] > token_times[0]:
        after_first = total - next(k for k in tokens if k > 0)
        rate = after_first / (token_times[-1] - token_times[0])
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
        stalls=sum(1 for g in gaps.event_gaps_s if g >= stall_threshold_s),
        tokens_per_s=rate,
        tokens_per_s_min_window=min_window_rate(times_s, tokens, RATE_WINDOW_S),
        gaps=gaps,
    )
