"""The inter-token gap histogram on hand-written records: token-weighted buckets, bars, colours."""

from __future__ import annotations

import re
from typing import Any

from hopmeter.report.histogram import (
    BOUNDS_S,
    HOP_COLOURS,
    STALL_COLOURS,
    bucket_label,
    counts,
    render,
)
from hopmeter.report.traces import Lane, build
from tests.report.literal import T0, flow

# Gaps of 0.5 s (one token), 1 s over four tokens (0.25 s each) and 100 s; a quiet event between.
EVENTS = [[0.0, 1, 1], [0.5, 1, 2], [0.5, 0, 2], [1.5, 4, 6], [101.5, 1, 7]]


def _lane(hop: str, events: list[list[float]], **kwargs: Any) -> Lane:
    return build([flow(hop, T0, events, **kwargs)], 0.5).lanes[0]


def _bars(svg: str) -> list[tuple[str, str]]:
    """(fill, tooltip) of every bar."""
    return re.findall(r'fill="(#[0-9a-f]{6})"><title>([^<]*)</title>', svg)


def _axis(svg: str) -> list[str]:
    return re.findall(r'transform="rotate\([^"]*\)">([^<]*)</text>', svg)


def test_bucket_labels_are_the_upper_bounds_for_people() -> None:
    """Bucket labels read as ms below a second, as seconds above, and the last as above 80 s."""
    labels = [bucket_label(i) for i in range(len(BOUNDS_S) + 1)]
    assert labels[:3] == ["1ms", "2.5ms", "5ms"]
    assert labels[13:16] == ["750ms", "1s", "2.5s"]
    assert labels[-2:] == ["80s", ">80s"]


def test_counts_are_token_weighted_with_each_bound_inclusive() -> None:
    """A gap before k tokens counts k gaps of a k-th of it; a gap on a bound counts in the bucket
    that bound closes (as Prometheus's `le` does); quiet events are not gaps."""
    got = counts(_lane("edge", EVENTS))
    assert len(got) == len(BOUNDS_S) + 1
    assert got[BOUNDS_S.index(0.5)] == 1  # exactly 0.5 s: the "500ms" bucket
    assert got[BOUNDS_S.index(0.3)] == 4  # 0.25 s, four times
    assert got[-1] == 1  # 100 s: past the last bound
    assert sum(got) == 6


def test_a_lane_without_two_token_events_draws_no_bars() -> None:
    """With fewer than two token-carrying events there is no gap: a note instead of a chart."""
    svg = render([_lane("edge", [[0.2, 0, 0], [0.4, 3, 9]])], 0.5)
    assert svg == '<p class="muted no-gaps">No gaps: fewer than two events carried tokens.</p>'


def test_bars_at_or_above_the_stall_threshold_are_orange() -> None:
    """A bar is drawn per non-empty bucket with its count; buckets starting at or above the
    threshold take the stall colour, the others the hop's colour."""
    svg = render([_lane("edge", EVENTS)], 0.5)
    assert _bars(svg) == [
        (HOP_COLOURS[0], "edge: 4 gaps up to 300ms"),
        (HOP_COLOURS[0], "edge: 1 gaps up to 500ms"),
        (STALL_COLOURS[0], "edge: 1 gaps up to &gt;80s"),
    ]
    assert '<text x="36" y="20" text-anchor="end">4</text>' in svg  # the peak, on the y axis
    assert _bars(render([_lane("edge", EVENTS)], 0.2))[:2] == [
        (STALL_COLOURS[0], "edge: 4 gaps up to 300ms"),
        (STALL_COLOURS[0], "edge: 1 gaps up to 500ms"),
    ]


def test_the_axis_always_reaches_one_second() -> None:
    """Short gaps are still drawn on an axis up to 1 s, so two histograms compare; a longer gap
    stretches the axis to its bucket."""
    short = _axis(render([_lane("edge", [[0.1, 1, 1], [0.102, 1, 2]])], 0.5))
    assert short[0] == "1ms" and short[-1] == "1s"
    longer = _axis(render([_lane("edge", [[0.1, 1, 1], [3.1, 1, 2]])], 0.5))
    assert longer[-1] == "5s"


def test_each_hop_has_its_colour_and_a_safe_name() -> None:
    """Two hops draw side by side in their own colours, and a hop name from traffic is escaped."""
    lanes = [_lane('<b>"edge"</b>', EVENTS), _lane("origin", EVENTS[:2])]
    svg = render(lanes, 0.5)
    assert "<b>" not in svg
    assert "&lt;b&gt;&quot;edge&quot;&lt;/b&gt;" in svg
    origin = [(fill, tip) for fill, tip in _bars(svg) if tip.startswith("origin")]
    assert origin == [(HOP_COLOURS[1], "origin: 1 gaps up to 500ms")]
