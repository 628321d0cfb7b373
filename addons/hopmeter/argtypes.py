"""argparse value types every command shares: whole numbers and seconds, checked once.

A bad value raises `argparse.ArgumentTypeError`, which the command line turns into one line
naming the flag and the value (hopmeter.cli); environment variables go through the same types
(hopmeter.env), so their errors read the same.
"""

from __future__ import annotations

import argparse
import math


def positive_int(value: str) -> int:
    """A whole number, 1 or more."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be 1 or more")
    return n


def positive_seconds(value: str) -> float:
    """A finite number of seconds above 0."""
    f = _seconds(value)
    if not f > 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be above 0")
    return f


def seconds(value: str) -> float:
    """A finite number of seconds, 0 or more."""
    f = _seconds(value)
    if not f >= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be 0 or more seconds")
    return f


def _seconds(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if math.isinf(f):  # NaN is refused by the comparisons that follow
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds")
    return f
