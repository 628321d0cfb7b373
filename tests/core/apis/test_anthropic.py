"""Tests for hopmeter.core.apis.anthropic: Messages events, their usage, errors and documents."""

from __future__ import annotations

from hopmeter.core.apis import Delta
from tests.harness.corpus import corpus_frames, needs_corpus
from tests.harness.events import parse, parse_all


@needs_corpus
def test_anthropic_usage_split_across_events():
    """message_start carries the input count (its output count is the count so far, 1: no total
    for the reply, which a stream cut before message_delta must not take as one);
    message_delta the final output."""
    deltas = parse_all("anthropic.messages", corpus_frames("anthropic/messages-thinking.sse"))
    assert deltas[0].input_tokens_total == 43
    assert deltas[0].output_tokens_total is None
    assert deltas[-2].output_tokens_total == 282
    assert deltas[-1].terminal
    reasoning = "".join(d.reasoning for d in deltas)
    assert reasoning and not any(d.visible for d in deltas if "signature_delta" in str(d))


def test_anthropic_error_event_and_signature():
    """`event: error` is an error; signature deltas and pings show nothing."""
    err = parse(
        "anthropic.messages",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        kind="error",
    )
    assert err.error == "overloaded_error\nOverloaded"
    sig = {"type": "content_block_delta", "delta": {"type": "signature_delta", "signature": "x"}}
    assert not parse("anthropic.messages", sig).visible
    assert parse("anthropic.messages", {"type": "ping"}) == Delta()


def test_anthropic_document_reply():
    """A non-streamed Anthropic message is one terminal event with text, tool input and usage."""
    doc = {
        "type": "message",
        "model": "claude",
        "content": [
            {"type": "text", "text": "Hi"},
            {"type": "tool_use", "name": "f", "input": {"a": 1}},
        ],
        "usage": {"input_tokens": 4, "output_tokens": 7},
    }
    d = parse("anthropic.messages", doc, kind="document")
    assert (d.content, d.tool_args, d.output_tokens_total, d.terminal) == (
        "Hi",
        'f{"a":1}',
        7,
        True,
    )
