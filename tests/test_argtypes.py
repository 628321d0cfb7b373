"""Tests for hopmeter.argtypes: the value types the commands share."""

from __future__ import annotations

import argparse

import pytest

from hopmeter.argtypes import positive_int, positive_seconds, seconds


@pytest.mark.parametrize(("text", "n"), [("1", 1), ("32", 32), (" 7 ", 7)])
def test_positive_int_reads_whole_numbers(text: str, n: int) -> None:
    """Whole numbers of 1 or more pass, surrounding spaces allowed."""
    assert positive_int(text) == n


@pytest.mark.parametrize(
    ("text", "why"), [("0", "1 or more"), ("-3", "1 or more"), ("2.5", "whole")]
)
def test_positive_int_refuses_the_rest(text: str, why: str) -> None:
    """Zero, negatives and fractions are refused, saying which rule they broke."""
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        positive_int(text)


def test_seconds_allow_zero_and_positive_seconds_do_not() -> None:
    """`seconds` takes 0 (a switch off), `positive_seconds` needs more than 0."""
    assert seconds("0") == 0.0 and seconds("1.5") == 1.5
    assert positive_seconds("0.25") == 0.25
    with pytest.raises(argparse.ArgumentTypeError, match="above 0"):
        positive_seconds("0")


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "soon", "", "-1"])
def test_seconds_refuse_what_is_not_a_finite_duration(text: str) -> None:
    """Infinity, NaN, words and negative numbers are not durations."""
    for parse in (seconds, positive_seconds):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
