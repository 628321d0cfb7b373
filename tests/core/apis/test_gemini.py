"""Tests for hopmeter.core.apis.gemini: thought parts, tool calls, errors and the array form."""

from __future__ import annotations

from hopmeter.core.apis import make_parser
from tests.harness.corpus import corpus_frames, needs_corpus
from tests.harness.events import frame, parse, parse_all


@needs_corpus
def test_gemini_thought_parts_are_reasoning():
    """Gemini parts with thought:true are reasoning; the rest is content."""
    deltas = parse_all("gemini", corpus_frames("gemini/stream-thinking-2.5-pro.sse"))
    assert deltas[0].reasoning.startswith("**Clarifying") and not deltas[0].content
    assert deltas[-1].content and not deltas[-1].reasoning
    assert deltas[-1].input_tokens_total == 34


@needs_corpus
def test_gemini_function_call_is_a_tool_call():
    """A Gemini functionCall part is tool-call text: its name and JSON arguments."""
    deltas = parse_all("gemini", corpus_frames("gemini/stream-tool-call-thought-signature.sse"))
    assert deltas[0].tool_args == "get_country{}"


def test_gemini_errors_and_json_array_form():
    """Gemini error objects and blocked prompts are errors; a JSON array is read chunk by chunk."""
    assert (
        parse(
            "gemini", {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota"}}
        ).error
        == "429: RESOURCE_EXHAUSTED\nquota"
    )
    assert parse("gemini", {"promptFeedback": {"blockReason": "SAFETY"}}).error == (
        "prompt blocked: SAFETY"
    )
    chunk = {"candidates": [{"content": {"parts": [{"text": "a"}]}}]}
    last = {
        "candidates": [{"content": {"parts": [{"text": "b"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"candidatesTokenCount": 2},
    }
    d = parse("gemini", [chunk, last])
    assert (d.content, d.output_tokens_total, d.terminal) == ("ab", 2, True)


def test_array_item_that_is_no_chunk_makes_the_event_malformed():
    """In the JSON-array form an item that is not a chunk object counts the event as malformed
    once, and the chunks beside it are still read."""
    parser = make_parser("gemini")
    chunk = {"candidates": [{"content": {"parts": [{"text": "a"}]}}]}
    assert parser.parse(frame([chunk, 1, "x"])).content == "a"
    assert parser.malformed == 1
    assert parser.parse(frame([chunk, chunk])).content == "aa"
    assert parser.parse(frame([])).content == ""
    assert parser.malformed == 1
