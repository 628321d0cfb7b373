"""Tests for hopmeter.core.tokens: the estimate, reconciliation and per-event accounting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.tokens import estimate_tokens, reconcile


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        (" ", 1),
        ("Hello", 1),
        (" world", 1),
        ("internationalization", 3),  # 20 letters: one token per started 9
        ("1234567", 3),  # digits in groups of three
        ('{"', 1),
        ("\n\n", 1),
        ("猫猫猫猫猫猫猫猫猫猫", 7),  # 0.7 per CJK character
        ("🚀", 2),  # 4 UTF-8 bytes, 3 per token
    ],
)
def test_estimate_examples(text: str, tokens: int):
    """The estimate splits like a BPE pre-tokenizer and prices each piece by its kind."""
    assert estimate_tokens(text) == tokens


@pytest.mark.parametrize(
    ("counts", "total", "expected"),
    [
        ([0, 1, 3, 0, 2], 6, [0, 1, 3, 0, 2]),  # already right: unchanged
        ([0, 1, 3, 0, 2], 12, [0, 2, 6, 0, 4]),  # scaled, zeros stay zero
        ([1, 1, 1], 2, [1, 1, 0]),  # fewer tokens than events: ties go to the earlier
        ([1, 9], 20, [2, 18]),
        ([1, 1, 10], 4, [1, 1, 2]),  # every counted event keeps one
        ([0, 0, 0], 5, [2, 2, 1]),  # nothing counted: spread evenly
        ([3, 4], 0, [0, 0]),
        ([], 5, []),
    ],
)
def test_reconcile_examples(counts: list[int], total: int, expected: list[int]):
    """Largest remainder: sum is the total, zeros stay zero, counted events keep at least one."""
    assert reconcile(counts, total) == expected


@given(
    st.lists(st.integers(min_value=0, max_value=50), max_size=60),
    st.integers(min_value=0, max_value=3000),
)
def test_reconcile_properties(counts: list[int], total: int):
    """Any counts and total: exact sum, zeros stay zero, each counted event >= 1 when it can."""
    final = reconcile(counts, total)
    assert len(final) == len(counts)
    assert all(f >= 0 for f in final)
    if not counts or total == 0:
        assert sum(final) == 0
        return
    assert sum(final) == total
    live = [i for i, c in enumerate(counts) if c > 0]
    if live:
        assert all(final[i] == 0 for i, c in enumerate(counts) if c == 0)
        if total >= len(live):
            assert all(final[i] >= 1 for i in live)
    if sum(counts) == total:
        assert final == counts
