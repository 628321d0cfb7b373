"""The classes of every code point by hopmeter.core.unicode_categories (Unicode 16.0), by the
`regex` module's tables (18.0.0 in 2026.11) and by the running Python's `unicodedata`, for the
tests that hold the splitter to `regex` and to tiktoken."""

from __future__ import annotations

import sys
import unicodedata
from functools import cache

import regex

from hopmeter.core import unicode_categories
from tests.core.make_unicode_categories import CATEGORIES

EVERY_CODE = range(sys.maxunicode + 1)


def _codes(span: str) -> range:
    first, _, last = span.partition("..")
    return range(int(first, 16), int(last or first, 16) + 1)


@cache
def module_categories() -> dict[int, str]:
    """The module's category of each code point it lists."""
    return {
        code: category
        for span, category in map(str.split, unicode_categories.CATEGORIES.splitlines())
        for code in _codes(span)
    }


def white_space() -> set[int]:
    """The module's White_Space code points."""
    return {code for span in unicode_categories.WHITE_SPACE.split() for code in _codes(span)}


@cache
def regex_categories() -> dict[int, str]:
    """The `regex` module's category of each code point in one of the eleven."""
    everything = "".join(map(chr, EVERY_CODE))
    return {
        ord(c): name for name in CATEGORIES for c in regex.findall(rf"\p{{{name}}}", everything)
    }


def python_category(code: int) -> str | None:
    """The running Python's category of `code` when it is one of the eleven."""
    category = unicodedata.category(chr(code))
    return category if category in CATEGORIES else None


@cache
def same_in_both() -> str:
    """Every code point the module and `regex` class alike (the surrogates too): all but the
    ~17,600 assigned or changed after 16.0."""
    ours, theirs = module_categories(), regex_categories()
    return "".join(chr(c) for c in EVERY_CODE if ours.get(c) == theirs.get(c))
