"""Tests for hopmeter.core.apis._json: the typed readers every parser reads fields with."""

from __future__ import annotations

import pytest

from hopmeter.core.apis._json import (
    MAX_ERROR_CHARS,
    MAX_SHOWN_ERROR_CHARS,
    _error_text,
    _int,
    _int_list,
    _json_object,
    shown_error,
)


@pytest.mark.parametrize(
    ("value", "read"),
    [(3, 3), (0, 0), (-1, None), (True, None), (2.0, None), (2**31 - 1, 2**31 - 1), (2**62, None)],
)
def test_int_reads_counts_only(value: object, read: int | None):
    """A count is a non-negative integer up to 2**31 - 1: booleans, negatives, floats and
    numbers no reply has (2**62 made a record orjson cannot write) read as absent."""
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
        ("overloaded", "\noverloaded"),  # a string is all message
        ({"type": "error", "message": "boom"}, "error\nboom"),
        ({"type": "error", "code": "overloaded"}, "overloaded"),  # a whole event's type: dropped
        (
            {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota"},
            "429: RESOURCE_EXHAUSTED\nquota",
        ),
        ({"detail": "x"}, '\n{"detail":"x"}'),  # no kind, no message: its JSON, as message
        ({"type": "auth", "param": "sk-x"}, "auth"),  # a kind and no message: the kind
        ("e" * 600, "\n" + "e" * MAX_ERROR_CHARS),
        # a kind part that is no short word, number or phrase is left out of the kind
        ({"type": "a\nb", "code": "x" * 65, "status": 401, "message": "m"}, "401\nm"),
        ({"type": "sk-proj-abcdefghijkl", "message": "m"}, "\nm"),
        ({"code": "user prompt was rude", "status": 400, "message": "m"}, "400\nm"),  # a phrase
    ],
)
def test_error_text_keeps_the_kind_apart_from_the_message(value: object, text: str | None):
    """An error object or string is kept as its kind (type, code, status: short words and
    numbers) and, after a newline, its message (the upstream's text), bounded."""
    assert _error_text(value) == text


@pytest.mark.parametrize(
    ("kept", "bare", "whole"),
    [
        ("overloaded_error\nOverloaded", "overloaded_error", "overloaded_error: Overloaded"),
        ("\nmodel not found", "error", "model not found"),
        ("content_filter: finish_reason, hate", "content_filter: finish_reason, hate", None),
        (
            "401\nInvalid key sk-proj-SECRET1234567890, Bearer abcdefgh.ijk and AIza" + "B" * 30,
            "401",
            "401: Invalid key [redacted], Bearer [redacted] and [redacted]",
        ),
        ("\n" + "m" * 600, "error", "m" * MAX_SHOWN_ERROR_CHARS),
    ],
)
def test_an_error_is_shown_by_its_kind_and_with_log_content_its_message(
    kept: str, bare: str, whole: str | None
) -> None:
    """A record shows an error's kind ("error" when it has none): its message is the upstream's
    text (which may quote the prompt or a key), shown only with --log-content, keys and bearer
    tokens taken out, bounded after that."""
    assert shown_error(kept, with_message=False) == bare
    assert shown_error(kept, with_message=True) == (whole if whole is not None else bare)


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


def test_the_requests_own_credentials_are_kept_out_of_a_shown_message() -> None:
    """An error that echoes the request's key in a shape no pattern knows: with its message
    shown, the request's own credentials (longest first) are taken out."""
    kept = "auth_error\nInvalid proxy token CUSTOMkey42xyz (prefix CUSTOMkey)"
    shown = shown_error(kept, with_message=True, hidden=("CUSTOMkey", "CUSTOMkey42xyz"))
    assert shown == "auth_error: Invalid proxy token [redacted] (prefix [redacted])"
    assert shown_error(kept, with_message=False, hidden=("CUSTOMkey",)) == "auth_error"


def test_a_model_name_is_clipped_and_says_by_how_much() -> None:
    """A model id goes into every record: a 3 MB one (an NDJSON line's worth) is clipped, and
    how much was clipped is said (the record's model_clipped_chars)."""
    from hopmeter.core.apis._json import MAX_MODEL_CHARS, _model, clip_model

    assert _model("gpt-4o") == "gpt-4o" and _model("") is None and _model(7) is None
    assert clip_model("gpt-4o") == ("gpt-4o", 0)
    assert clip_model("m" * MAX_MODEL_CHARS) == ("m" * MAX_MODEL_CHARS, 0)
    assert clip_model("m" * 3_000_000) == ("m" * MAX_MODEL_CHARS, 3_000_000 - MAX_MODEL_CHARS)
