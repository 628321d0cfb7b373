"""Tests for hopmeter.core.apis.heuristic: text from a stream of no known API."""

from __future__ import annotations

from hopmeter.core.apis import make_parser
from tests.harness.events import frame, parse


def test_plain_text_sse_is_its_own_text():
    """An unknown SSE stream whose data is not JSON carries that data as text."""
    assert parse("sse", "Hello there").content == "Hello there"
    assert parse("ndjson", "Hello").content == "Hello"


def test_unknown_json_text_found_under_common_keys():
    """The heuristic finds text under common keys, through choices and nested objects."""
    assert parse("sse", {"choices": [{"delta": {"content": "a"}}]}).content == "a"
    assert parse("sse", {"token": {"text": "b"}}).content == "b"
    assert parse("sse", {"response": "c", "done": True}).terminal
    assert parse("sse", {"error": {"message": "boom"}}).error == "\nboom"
    assert parse("sse", {"id": 3}).content == ""


def test_nothing_in_an_unknown_stream_is_malformed():
    """Text, JSON strings, arrays and numbers of an unknown stream are read or skipped, never
    counted as malformed."""
    parser = make_parser("ndjson")
    assert parser.parse(frame('"a string"')).content == "a string"
    for data in ("[1, 2]", "42", "null", "plain text", "{broken"):
        parser.parse(frame(data))
    assert parser.malformed == 0
