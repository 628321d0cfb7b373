"""Tests for hopmeter.core.apis.tgi: one token object per event."""

from __future__ import annotations

from tests.harness.events import parse


def test_tgi_special_token_is_counted_not_shown():
    """A TGI special token (e.g. </s>) is one stream token and no visible text."""
    d = parse(
        "tgi",
        {
            "token": {"id": 2, "text": "</s>", "special": True},
            "generated_text": "x",
            "details": {"generated_tokens": 3},
        },
    )
    assert (d.content, d.stream_tokens, d.token_ids, d.terminal) == ("", 1, (2,), True)
    assert not d.visible
