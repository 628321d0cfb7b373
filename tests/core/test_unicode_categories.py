"""Tests for hopmeter.core.unicode_categories: Unicode 16.0's classes, the version tiktoken's are.

How the version was chosen: tiktoken's pre-tokenizer runs on its Rust `regex` crate's tables, a
Unicode version of their own; Python's `unicodedata` has another (15.0.0 on 3.12) and so has the
`regex` module (18.0.0 in 2026.11). Counting text with code points assigned in between, in
contexts where a letter splits differently from an unassigned code point, tiktoken 0.14 counts
those of 15.1 and 16.0 as letters and those of 17.0 and 18.0 as unassigned
(`test_counts_equal_tiktoken_where_unicode_versions_disagree`): its tables are 16.0's.
"""

from __future__ import annotations

import re
import sys
from functools import cache

import pytest
import regex

from hopmeter.core import bpe
from hopmeter.core.bpe import PRE_TOKENIZERS, BpeCounter
from tests.core import make_unicode_categories
from tests.core.test_bpe import shipped_table
from tests.core.unicode_tables import (
    EVERY_CODE,
    module_categories,
    python_category,
    regex_categories,
    white_space,
)
from tests.harness import tiktoken_ref

CATEGORIES = make_unicode_categories.CATEGORIES


@cache
def disputed() -> list[int]:
    """The code points whose category the running Python and `regex` disagree on."""
    theirs = regex_categories()
    return [c for c in EVERY_CODE if python_category(c) != theirs.get(c)]


def test_categories_are_pythons_and_regexs_where_they_agree() -> None:
    """On every code point, the module's category is `unicodedata`'s and `regex`'s when they
    agree, and one of theirs when they do not (the module's version lies between theirs)."""
    ours, theirs = module_categories(), regex_categories()
    assert set(ours.values()) == set(CATEGORIES)
    wrong = [
        hex(c)
        for c in EVERY_CODE
        if ours.get(c) not in {python_category(c), theirs.get(c)}
        or (python_category(c) == theirs.get(c) != ours.get(c))
    ]
    assert wrong == []
    assert len(disputed()) > 1000  # the versions do differ: the next test has something to tell


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_counts_equal_tiktoken_where_unicode_versions_disagree(name: str) -> None:
    """On every code point `unicodedata` and `regex` class differently, in contexts where the
    class changes the pieces (a letter takes the `'s` after it, a digit joins the digits
    around it ...), hopmeter counts as tiktoken does; `regex`'s pattern, with its 18.0 tables,
    would not (the old splitter)."""
    reference = tiktoken_ref.encoding(name)
    count = BpeCounter(shipped_table(name), PRE_TOKENIZERS[name])
    contexts = ("{}'s", "a{}'re", "1{}234", "{}A{}b", " {}")
    texts = [context.format(chr(c), chr(c)) for c in disputed() for context in contexts]
    expected = [len(reference.encode_ordinary(text)) for text in texts]
    assert [t for t, n in zip(texts, expected, strict=True) if count(t) != n] == []
    table, full = shipped_table(name), regex.compile(PRE_TOKENIZERS[name].pattern).findall

    def counted_by_regex(text: str) -> int:
        return sum(table.merged_parts(piece.encode()) for piece in full(text))

    by_regex = [counted_by_regex(t) for t in texts]
    assert sum(n != m for n, m in zip(expected, by_regex, strict=True)) > 1000


def test_white_space_is_regexs_not_res() -> None:
    """White_Space is `regex`'s \\s on every code point, which is the standard library's less
    U+001C..U+001F."""
    ours = white_space()
    everything = "".join(map(chr, EVERY_CODE))
    assert ours == {ord(c) for c in regex.findall(r"\s", everything)}
    assert ours | set(range(0x1C, 0x20)) == {ord(c) for c in re.findall(r"\s", everything)}


def test_astral_stand_ins_class_like_what_they_stand_for() -> None:
    """Each stand-in is of the category it stands for (OTHER_STAND_IN of none), within the
    Basic Multilingual Plane, not ASCII, not White_Space, and no ASCII letter ignoring case,
    like every code point beyond the plane."""
    ours = module_categories()
    stand_ins = {**bpe.ASTRAL_STAND_INS, None: bpe.OTHER_STAND_IN}
    assert {category: ours.get(ord(c)) for category, c in stand_ins.items()} == {
        category: category for category in stand_ins
    }
    beyond = "".join(map(chr, range(bpe.BMP_END, sys.maxunicode + 1)))
    assert re.findall(r"(?i)[\x00-\x7f]", "".join(stand_ins.values()) + beyond) == []
    assert all(ord(c) < bpe.BMP_END for c in stand_ins.values())
    assert white_space().isdisjoint(map(ord, stand_ins.values()))
    assert max(white_space()) < bpe.BMP_END


@pytest.mark.skipif(
    make_unicode_categories.database() is None,
    reason="no Unicode 16.0.0 database (Python 3.14, or pip install unicodedata2==16.0.0)",
)
def test_the_module_is_what_its_generator_writes() -> None:
    """The shipped module is make_unicode_categories' output from a 16.0.0 database."""
    ucd = make_unicode_categories.database()
    assert ucd is not None
    expected = make_unicode_categories.module_text(ucd.category, ucd.unidata_version)
    assert make_unicode_categories.MODULE.read_text() == expected
