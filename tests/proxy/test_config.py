"""Checks of `hopmeter run`'s values that need no mitmproxy: durations given as text."""

from __future__ import annotations

import pytest

from hopmeter.errors import UsageError
from hopmeter.proxy.config import parse_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.5", 0.5), ("2", 2.0), (" 1.5s ", 1.5), ("500ms", 0.5), ("750MS", 0.75)],
)
def test_durations_read_as_seconds(text: str, seconds: float) -> None:
    """A number of seconds, with or without `s`, or milliseconds with `ms`."""
    assert parse_seconds(text, "hopmeter_stall_threshold") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1", "", "soon", "nan", "inf", "1e999", "5 minutes"])
def test_bad_durations_name_the_option_and_an_example(text: str) -> None:
    """Zero, negative, non-finite or unreadable values are one error naming the option."""
    with pytest.raises(UsageError, match=r"^hopmeter_stall_threshold .*e\.g\. 0\.5 or 500ms$"):
        parse_seconds(text, "hopmeter_stall_threshold")


def test_zero_is_allowed_where_it_means_off() -> None:
    """A summary interval of 0 turns the summary off; negative is still refused."""
    assert parse_seconds("0", "hopmeter_summary_interval", zero_ok=True) == 0.0
    with pytest.raises(UsageError, match="0 or more seconds"):
        parse_seconds("-2", "hopmeter_summary_interval", zero_ok=True)
