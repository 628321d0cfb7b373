"""Tests for hopmeter.core.apis.heuristic: text from a stream of no known API."""

from __future__ import annotations

from tests.harness.events import parse


def test_plain_text_sse_is_its_own_text():
    """An unknown SSE stream whose data is not JSON carries that data as text."""
    assert parse("sse", "Hello there").content == "Hello there"
    assert parse("ndjson", "Hello").content == "Hello"


def test_unknown_json_text_found_under_common_keys():
    """The heuristic finds text under common keys, through choices and nested objects."""
    assert parse("sse", {"choices": [{"delta": {"content": "a"}}]}).content == "a"
    assert parse("sse", {"token": {"text": "b"}}).content == "b"
    assert parse("sse", {"response": "c", "done": True}).terminal
    assert parse("sse", {"error": {"message": "boom"}}).error == "boom"
    assert parse("sse", {"id": 3}).content == ""
