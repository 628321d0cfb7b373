"""Scenario parsing: per-request overrides, clear errors, a deterministic token clock."""

from __future__ import annotations

import pytest

from hopmeter.errors import ScenarioError
from hopmeter.upstream.scenario import Scenario, apply, from_request, parse_pairs


def test_header_then_query_override_defaults() -> None:
    """The query string wins over the header, which wins over the server's defaults."""
    base = Scenario(rate=10)
    s = from_request(base, {"coalesce": "3", "unrelated": "x"}, "coalesce=2;stall_at=5;gzip")
    assert (s.rate, s.coalesce, s.stall_at, s.gzip) == (10, 3, 5, True)


def test_unknown_key_names_the_known_ones() -> None:
    """A typo is an error that lists the keys the upstream knows."""
    with pytest.raises(ScenarioError, match=r"unknown scenario key 'colaesce'.*coalesce"):
        apply(Scenario(), parse_pairs("colaesce=2"))


def test_bad_values_are_errors() -> None:
    """Values are parsed strictly: numbers, booleans and line endings."""
    for text in ("rate=fast", "gzip=maybe", "line_ending=crcr", "coalesce=0"):
        with pytest.raises(ScenarioError):
            apply(Scenario(), parse_pairs(text))


def test_intervals_follow_the_clock_with_one_stall() -> None:
    """Intervals are 1/rate, with the stall added before the stall token."""
    s = Scenario(tokens=5, rate=20, stall_at=3, stall_s=0.9)
    assert s.intervals() == pytest.approx([0.05, 0.05, 0.95, 0.05])


def test_jitter_is_bounded_and_repeatable() -> None:
    """Jittered intervals stay within ±jitter of the clock and repeat for a seed."""
    s = Scenario(tokens=200, rate=50, jitter=0.3, seed=7)
    gaps = s.intervals()
    assert all(0.7 * 0.02 <= g <= 1.3 * 0.02 for g in gaps)
    assert gaps == s.intervals()
    assert len(set(gaps)) > 100
