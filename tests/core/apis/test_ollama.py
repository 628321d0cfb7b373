"""Tests for hopmeter.core.apis.ollama: chat and generate lines, thinking, tools, final counts."""

from __future__ import annotations

from tests.harness.corpus import corpus_frames, needs_corpus
from tests.harness.events import parse, parse_all


@needs_corpus
def test_ollama_thinking_split_and_final_counts():
    """Ollama's final done:true line carries eval_count and prompt_eval_count."""
    deltas = parse_all("ollama", corpus_frames("ollama/generate-deepseek-r1.ndjson"))
    assert deltas[0].content == "<think>"
    assert deltas[-1].terminal and deltas[-1].input_tokens_total == 8


def test_ollama_chat_thinking_tool_calls_and_error():
    """Ollama chat thinking is reasoning, tool calls are tool text, `error` lines are errors."""
    d = parse(
        "ollama",
        {
            "model": "qwen3",
            "message": {
                "role": "assistant",
                "thinking": "hm",
                "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
            },
            "done": False,
        },
    )
    assert (d.reasoning, d.tool_args, d.output_tokens_total) == ("hm", 'f{"x":1}', None)
    assert parse("ollama", {"error": "model runner has unexpectedly stopped"}).error == (
        "\nmodel runner has unexpectedly stopped"
    )
