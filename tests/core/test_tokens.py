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


def _reconcile_by_scans(counts: list[int], total: int) -> list[int]:
    """The rule `reconcile` keeps, written the plain way: each token taken back after the
    minimum of one overshot comes from the event most over its quota, picked anew each time."""
    n = len(counts)
    if n == 0 or total <= 0:
        return [0] * n
    weights = counts if any(c > 0 for c in counts) else [1] * n
    weights = [max(0, c) for c in weights]
    quota = [total * w / sum(weights) for w in weights]
    alloc = [int(q // 1) for q in quota]
    live = [i for i in range(n) if weights[i] > 0]
    if total >= len(live):
        for i in live:
            alloc[i] = max(1, alloc[i])
    left = total - sum(alloc)
    for i in sorted(live, key=lambda i: (alloc[i] - quota[i], i))[: max(0, left)]:
        alloc[i] += 1
    while left < 0:
        i = max((j for j in live if alloc[j] > 1), key=lambda j: (alloc[j] - quota[j], -j))
        alloc[i] -= 1
        left += 1
    return alloc


@given(
    # many one-token events and a few big ones, a total near the number of events: the minimum
    # of one overshoots and tokens are taken back (ties in the excess are common)
    st.lists(st.sampled_from([0, 1, 1, 1, 2, 7, 40, 1000]), min_size=1, max_size=300),
    st.integers(min_value=-5, max_value=40),
)
def test_reconcile_takes_back_as_the_plain_rule_does(counts: list[int], slack: int):
    """Taking back over-quota tokens gives exactly what picking the most-over event each time
    gives, ties to the earlier event."""
    total = max(0, sum(1 for c in counts if c > 0) + slack)
    assert reconcile(counts, total) == _reconcile_by_scans(counts, total)


def test_reconcile_of_a_long_flow_that_overshoots():
    """An 8,192-event flow whose usage total is its number of events, a quarter of them counted
    at 1,000 tokens: 6,144 tokens are taken back, and the rule still holds."""
    counts = [1] * 6144 + [1000] * 2048
    final = reconcile(counts, 8192)
    assert sum(final) == 8192
    assert final[:6144] == [1] * 6144  # each counted event keeps its one
    assert final[6144:] == [1] * 2048
