"""Tests for hopmeter.core.secrets: secrets found by their shape in text hopmeter did not write."""

from __future__ import annotations

import pytest

from hopmeter.core.secrets import has_key, scrub


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("Invalid key sk-proj-abcdEFGH1234", "Invalid key [redacted]"),
        ("got Bearer abc.def-123_xyz", "got Bearer [redacted]"),
        ("basic dXNlcjpwYXNz==", "basic [redacted]"),
        ("AIza" + "x" * 35 + " is bad", "[redacted] is bad"),
        ("gsk_0123456789 and hf_abcdefghij", "[redacted] and [redacted]"),
        (
            "retries exceeded with url: /v1/traces?token=S3cret&x=1 (Caused by ...)",
            "retries exceeded with url: /v1/traces?token=[redacted]&x=[redacted] (Caused by ...)",
        ),
        (
            "POST https://me:pw@host:443/v1?key=K1",
            "POST https://[redacted]@host:443/v1?key=[redacted]",
        ),
        (
            "reverse:http://127.0.0.1:8000@127.0.0.1:8081",
            "reverse:http://127.0.0.1:8000@127.0.0.1:8081",
        ),
        (
            "reverse:http://u:pw@h:80@127.0.0.1:8081",
            "reverse:http://[redacted]@h:80@127.0.0.1:8081",
        ),
        ("http://admin:12345@host/v1", "http://[redacted]@host/v1"),  # a numeric password
        ("upstream:https://h:8443@8080", "upstream:https://h:8443@8080"),
        ("overloaded_error: 529", "overloaded_error: 529"),  # no secret: as it was
        ("a task (skipped) ran", "a task (skipped) ran"),
        ("/v1/chat/completions", "/v1/chat/completions"),
    ],
)
def test_scrub_takes_out_keys_tokens_and_url_credentials(text: str, scrubbed: str) -> None:
    """Keys by their vendors' prefixes, credentials after an auth scheme, a URL's password and
    query values; ordinary words, numbers and paths stay."""
    assert scrub(text) == scrubbed


def test_has_key_tells_a_key_from_a_word() -> None:
    """An error's kind that holds a key is dropped by it; words and numbers are kept."""
    assert has_key("sk-proj-abcdEFGH1234") and has_key("Bearer abcdefgh12")
    assert not has_key("invalid_request_error") and not has_key("429: Too Many Requests")
