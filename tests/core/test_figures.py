"""Figures from literal event times: token weighting, stalls, quantiles, windowed rates."""

from __future__ import annotations

import math
import statistics
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.figures import (
    _gaps,
    compute_figures,
    fmean,
    median,
    min_window_rate,
    token_gaps,
    weighted_quantile,
    weighted_quantiles,
)


def _figures(times: list[float], tokens: list[int], threshold: float = 0.5):  # type: ignore[no-untyped-def]
    return compute_figures(
        first_byte_s=times[0],
        last_byte_s=times[-1],
        times_s=times,
        tokens=tokens,
        first_event_s=times[0],
        first_visible_s=times[0],
        first_content_s=times[0],
        stall_threshold_s=threshold,
    )


def test_coalesced_events_give_the_token_clock() -> None:
    """Four tokens per event every 80 ms is a 20 ms inter-token latency, not 80 ms."""
    times = [0.1 + 0.08 * i for i in range(10)]
    f = _figures(times, [4] * 10)
    assert f.itl_p50_s == pytest.approx(0.02)
    assert f.itl_p99_s == pytest.approx(0.02)
    assert f.max_gap_s == pytest.approx(0.08)
    assert f.tokens == 40


def test_events_without_tokens_are_transparent() -> None:
    """A ping between two tokens does not split the gap between them."""
    g = token_gaps([0.0, 0.05, 0.1], [1, 0, 1])
    assert g.event_gaps_s == pytest.approx((0.1,))
    assert g.weights == (1,)


def test_one_stall_is_counted_and_is_the_max_gap() -> None:
    """A single 900 ms gap in a steady stream is one stall and the max gap, and hides in p50."""
    times = [0.02 * i for i in range(50)]
    times = times[:25] + [t + 0.9 for t in times[25:]]
    f = _figures(times, [1] * 50)
    assert f.stalls == 1
    assert f.max_gap_s == pytest.approx(0.92)
    assert f.itl_p50_s == pytest.approx(0.02)


def test_threshold_is_inclusive() -> None:
    """A gap exactly at the threshold is a stall."""
    assert _figures([0.0, 0.5], [1, 1], threshold=0.5).stalls == 1


def test_weighted_quantile_nearest_rank() -> None:
    """Weights count as repeated observations; nearest rank, no interpolation."""
    assert weighted_quantile([0.01, 1.0], [99, 1], 0.5) == 0.01
    assert weighted_quantile([0.01, 1.0], [99, 1], 0.99) == 0.01
    assert weighted_quantile([0.01, 1.0], [98, 2], 0.99) == 1.0
    assert weighted_quantile([], [], 0.5) is None


@given(
    st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5)), max_size=30),
    st.lists(st.floats(0, 1), min_size=1, max_size=4).map(sorted),
)
def test_weighted_quantiles_sort_once_and_agree(pairs: list[tuple[float, int]], qs: list[float]):
    """Several quantiles at once are each the nearest-rank quantile of the values repeated by
    their weights."""
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    repeated = sorted(v for v, w in pairs for _ in range(w))
    want = [repeated[max(1, math.ceil(q * len(repeated))) - 1] if repeated else None for q in qs]
    assert weighted_quantiles(values, weights, qs) == want
    assert [weighted_quantile(values, weights, q) for q in qs] == want


def test_window_rate_finds_the_slow_second() -> None:
    """The lowest one-second rate sees a slow patch that the average hides."""
    fast = [0.01 * i for i in range(200)]  # 100 tokens/s for 2 s
    slow = [2.0 + 0.2 * i for i in range(1, 11)]  # then 5 tokens/s for 2 s
    rate = min_window_rate(fast + slow, [1] * 210, 1.0)
    assert rate is not None
    assert rate <= 5.0


def test_short_stream_has_no_window_rate() -> None:
    """A stream shorter than one window has no windowed rate."""
    assert min_window_rate([0.0, 0.1, 0.2], [1, 1, 1], 1.0) is None


def test_rate_counts_tokens_after_the_first() -> None:
    """tokens/s divides the tokens after the first event by the time since it."""
    f = _figures([0.5, 1.0, 1.5], [1, 2, 2])
    assert f.tokens_per_s == pytest.approx(4.0)


# -- the figures against their definitions, written plainly ----------------------------------------


def _plain_gaps(
    times: list[float], tokens: list[int]
) -> tuple[list[float], list[int], list[float]]:
    pts = [(t, k) for t, k in zip(times, tokens, strict=True) if k > 0]
    raw = [max(0.0, b[0] - a[0]) for a, b in pairwise(pts)]
    weights = [k for _, k in pts[1:]]
    return [g / k for g, k in zip(raw, weights, strict=True)], weights, raw


def _plain_min_window_rate(times: list[float], tokens: list[int], window: float) -> float | None:
    pts = [(t, k) for t, k in zip(times, tokens, strict=True) if k > 0]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < window:
        return None
    lowest = None
    for i, (start, _) in enumerate(pts):
        if start + window > pts[-1][0]:
            break
        # the tokens of the events after the one that opened the window, before it closes
        count = sum(k for t, k in pts[i + 1 :] if t < start + window)
        lowest = count / window if lowest is None else min(lowest, count / window)
    return lowest


# Steps that are exact in binary, so that an event lands exactly on a window's end or on the stall
# threshold (where < and <= part ways); a negative step only where times may go back.
STEPS = [0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 1.5]


@st.composite
def streams(draw: st.DrawFn, back: bool = False) -> tuple[list[float], list[int]]:
    """Event times (non-decreasing, as a FlowMeter stamps them, unless `back`; ties and long gaps
    included) and tokens per event (zeros included)."""
    steps = draw(st.lists(st.sampled_from([*STEPS, -0.125] if back else STEPS), max_size=60))
    times = [0.5]
    for step in steps:
        times.append(times[-1] + step)
    tokens = draw(st.lists(st.integers(0, 3), min_size=len(times), max_size=len(times)))
    return times, tokens


@given(streams(back=True))
def test_token_gaps_follow_their_plain_definition(stream: tuple[list[float], list[int]]):
    """The token gaps are what their definition, written as a plain loop, gives; a time that goes
    back makes a gap of zero."""
    values, weights, raw = _plain_gaps(*stream)
    g = token_gaps(*stream)
    assert (list(g.values_s), list(g.weights), list(g.event_gaps_s)) == (values, weights, raw)


@given(streams(), st.sampled_from([0.25, 0.5, 1.0]))
def test_figures_follow_their_plain_definitions(stream: tuple[list[float], list[int]], w: float):
    """The windowed rate, tokens/s, stalls and the largest gap are exactly what their
    definitions, written as plain loops, give."""
    times, tokens = stream
    _, _, raw = _plain_gaps(times, tokens)
    assert min_window_rate(times, tokens, w) == _plain_min_window_rate(times, tokens, w)
    f = _figures(times, tokens, threshold=w)
    carrying = [(t, k) for t, k in zip(times, tokens, strict=True) if k > 0]
    assert f.tokens == sum(k for _, k in carrying)
    assert f.stalls == sum(1 for gap in raw if gap >= w)
    assert f.max_gap_s == (max(raw) if raw else None)
    span = carrying[-1][0] - carrying[0][0] if len(carrying) >= 2 else 0.0
    want = (f.tokens - carrying[0][1]) / span if span > 0 else None
    assert f.tokens_per_s == want
    assert f.tokens_per_s_min_window == _plain_min_window_rate(times, tokens, 1.0)


@given(st.lists(st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1.0, 1.0 + 1e-16])), max_size=8))
def test_gaps_are_each_the_clamped_gap(times: list[float]):
    """Every raw gap `_gaps` makes is its two times' gap clamped, to the sign of a zero and a
    NaN's: later - earlier when above 0.0, else 0.0."""
    raw = _gaps(times, [1] * len(times)).event_gaps_s
    gaps = [later - earlier for earlier, later in pairwise(times)]
    want = [gap if gap > 0.0 else 0.0 for gap in gaps]
    assert [repr(g) for g in raw] == [repr(g) for g in want]


@given(
    st.lists(st.floats(0.0, 10.0), min_size=1, max_size=40),
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
)
def test_the_figures_sort_their_gaps_once_for_quantiles_and_metrics(
    steps: list[float], tokens: list[int]
) -> None:
    """compute_figures keeps the gaps sorted when every weight is 1 (for the metrics), and its
    quantiles are those of the gaps sorted anew."""
    times = [sum(steps[: i + 1]) for i in range(len(steps))]
    tokens = (tokens * len(times))[: len(times)]
    f = compute_figures(
        first_byte_s=None,
        last_byte_s=None,
        times_s=times,
        tokens=tokens,
        first_event_s=None,
        first_visible_s=None,
        first_content_s=None,
        stall_threshold_s=0.5,
    )
    gaps = f.gaps
    assert gaps is not None
    if gaps.weights.count(1) == len(gaps.weights):
        assert gaps.ordered_s == sorted(gaps.values_s)
    else:
        assert gaps.ordered_s is None
    want = weighted_quantiles(gaps.values_s, gaps.weights, (0.5, 0.99))
    assert [f.itl_p50_s, f.itl_p99_s] == want


@given(st.lists(st.floats(-1e9, 1e9) | st.integers(-(10**6), 10**6), min_size=1, max_size=50))
def test_median_and_mean_are_the_standard_librarys(values: list[float]) -> None:
    """figures.median and fmean answer as statistics.median and fmean, from a list or a
    generator; no values is an error."""
    assert median(values) == statistics.median(values)
    assert median(v for v in values) == statistics.median(values)
    assert fmean(values) == statistics.fmean(values)
    assert fmean(v for v in values) == statistics.fmean(values)
    with pytest.raises(ValueError, match="no values"):
        median([])
    with pytest.raises(ValueError, match="no values"):
        fmean(iter(()))
