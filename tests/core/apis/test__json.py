"""Tests for hopmeter.core.apis._json: the typed readers every parser reads fields with."""

from __future__ import annotations

import pytest

from hopmeter.core.apis._json import (
    MAX_ERROR_CHARS,
    _error_text,
    _int,
    _int_list,
    _json_object,
)


@pytest.mark.parametrize(("value", "read"), [(3, 3), (0, 0), (-1, None), (True, None), (2.0, None)])
def test_int_reads_counts_only(value: object, read: int | None):
    """A count is a non-negative integer: booleans, negatives and floats read as absent."""
    assert _int(value) == read


def test_int_list_reads_arrays_of_integers_only():
    """An array of integers is ids; one boolean or float in it, or no array at all, is not."""
    assert _int_list([1, 2]) == (1, 2)
    assert _int_list([]) == ()
    assert _int_list([1, True]) is None
    assert _int_list({"ids": [1]}) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        (False, None),
        ("", None),
        ({}, None),
        ("overloaded", "overloaded"),
        ({"type": "error", "message": "boom"}, "boom"),
        (
            {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota"},
            "429: RESOURCE_EXHAUSTED: quota",
        ),
        ({"detail": "x"}, '{"detail":"x"}'),
        ("e" * 600, "e" * MAX_ERROR_CHARS),
    ],
)
def test_error_text_is_one_bounded_line(value: object, text: str | None):
    """An error object or string becomes one line of its type, code, status and message."""
    assert _error_text(value) == text


@pytest.mark.parametrize(
    ("raw", "doc"),
    [
        (b'{"a": 1}', {"a": 1}),
        (b"[1]", None),
        (b" {}", None),  # the plain paths read payloads that start with the object
        (b'{"a": "\xff"}', None),  # invalid UTF-8: the general path decodes it with U+FFFD
        (b"{not json}", None),
    ],
)
def test_json_object_reads_objects_only(raw: bytes, doc: dict[str, object] | None):
    """The plain paths' reader accepts a payload that is one valid UTF-8 JSON object, else None."""
    assert _json_object(raw) == doc
