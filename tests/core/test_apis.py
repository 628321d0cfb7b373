"""Tests for hopmeter.core.apis: every API's parser on the whole corpus, and the registry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.apis import Delta, make_parser
from hopmeter.core.tokens import estimate_tokens, reconcile
from hopmeter.core.vocab import Api
from hopmeter.core.wire import model_from_path
from tests.harness.corpus import CASES, CORPUS, corpus_frames, needs_corpus
from tests.harness.events import frame, parse, parse_all


@needs_corpus
def test_every_recording_has_a_case():
    """The CASES table names every file of the corpus, so a new recording cannot go untested."""
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.glob("*/*") if p.suffix != ".md"}
    assert files == set(CASES)


@needs_corpus
@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_model_usage_and_errors(name: str):
    """Each recording yields its model, its documented output total, and its errors (only those)."""
    case = CASES[name]
    deltas = parse_all(case.api, corpus_frames(name))
    model = next((d.model for d in deltas if d.model), None)
    if case.model_path is not None:
        assert model is None
        model = model_from_path(case.model_path)
    assert model
    totals = [d.output_tokens_total for d in deltas if d.output_tokens_total is not None]
    assert (totals[-1] if totals else None) == case.output_total
    errors = [d.error for d in deltas if d.error]
    assert bool(errors) == case.error, errors


@needs_corpus
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.output_total))
def test_corpus_counts_reconcile_to_usage(name: str):
    """Per-event counts (stream's own, else estimated) scale to sum exactly to the usage total."""
    case = CASES[name]
    deltas = parse_all(case.api, corpus_frames(name))
    counts = [
        d.stream_tokens
        if d.stream_tokens is not None
        else estimate_tokens(d.content + d.reasoning + d.tool_args)
        for d in deltas
    ]
    assert case.output_total is not None
    final = reconcile(counts, case.output_total)
    assert sum(final) == case.output_total
    if any(counts):
        assert all(f == 0 for c, f in zip(counts, final, strict=True) if c == 0)


# First event with visible content, checked by hand (role preludes, pings and block starts of
# empty text are not visible).
FIRST_VISIBLE = {
    "openai/chat-text-include-usage.sse": 1,  # 0 is the role prelude
    "openai/chat-tool-call-strict.sse": 0,  # the tool name arrives with the role
    "anthropic/messages-text-basic.sse": 3,  # message_start, content_block_start "", ping
    "anthropic/messages-tool-call-only.sse": 1,  # the tool_use block start names the tool
    "azure-openai/chat-async-content-filter.sse": 2,  # prompt filter results, then role
    "deepseek/chat-reasoner.sse": 1,  # reasoning_content "H"
    "mistral/chat-magistral-thinking.sse": 2,  # role, then content "", then a thinking part
    "novita/chat-llama-3.1-8b-content-filter.sse": 5,  # four empty deltas carry only usage
    "openai/responses-text-basic.sse": 4,  # created, in_progress, item added, part added
    "gemini/stream-basic-2.0-flash.sse": 0,
    "tgi/generate-stream-token-objects.sse": 0,
    "ollama/generate-deepseek-r1.ndjson": 0,
}


@needs_corpus
@pytest.mark.parametrize("name", sorted(FIRST_VISIBLE))
def test_first_visible_event(name: str):
    """The first visible event is the first with text, reasoning or a tool call, not a prelude."""
    deltas = parse_all(CASES[name].api, corpus_frames(name))
    assert next(i for i, d in enumerate(deltas) if d.visible) == FIRST_VISIBLE[name]


@needs_corpus
@pytest.mark.parametrize(
    ("name", "tokens"),
    [
        ("together/chat-deepseek-r1-token-ids.sse", 955),  # delta.token_id on every chunk
        ("together/chat-llama-3-8b-turbo.sse", 20),
        ("tgi/generate-stream-token-objects.sse", 150),  # one token object per event
        ("openai/chat-logprobs.sse", 2),  # one logprobs.content entry per token
        ("openai/chat-refusal-logprobs.sse", 11),  # logprobs.refusal (usage says 12)
        ("tgi/chat-messages-api-logprobs.sse", 100),
        ("openai/responses-logprobs.sse", 9),  # usage says 10
    ],
)
def test_stream_tokens_from_the_stream_itself(name: str, tokens: int):
    """Token ids, logprobs entries and TGI token objects count the tokens each event carries."""
    deltas = parse_all(CASES[name].api, corpus_frames(name))
    assert sum(d.stream_tokens or 0 for d in deltas) == tokens
    assert all(d.stream_tokens in (None, 0, 1) for d in deltas)


@needs_corpus
@pytest.mark.parametrize(
    ("name", "reasoning", "streamed"),
    [
        ("openai/responses-function-call-usage.sse", 448, False),  # gpt-5: encrypted reasoning
        ("gemini/stream-usage-mid-stream-2.5-flash.sse", 35, False),  # thoughts not included
        ("gemini/stream-thinking-2.5-pro.sse", 787, True),  # thought summaries streamed
        ("groq/chat-reasoning-x-groq-usage.sse", 23, True),
        ("deepseek/chat-reasoner.sse", 198, True),
        ("openai/chat-text-include-usage.sse", 0, False),
    ],
)
def test_reasoning_share_of_usage(name: str, reasoning: int, streamed: bool):
    """The reasoning part of the output total is reported, streamed as text or not."""
    deltas = parse_all(CASES[name].api, corpus_frames(name))
    totals = [d.reasoning_tokens_total for d in deltas if d.reasoning_tokens_total is not None]
    assert totals[-1] == reasoning
    assert any(d.reasoning for d in deltas) == streamed


def test_done_is_terminal_for_every_api():
    """`[DONE]` ends the stream whatever the API."""
    for api in Api:
        assert make_parser(api).parse(frame("[DONE]")).terminal


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "delta",
                    "content",
                    "type",
                    "usage",
                    "token",
                    "message",
                    "candidates",
                    "parts",
                    "text",
                    "error",
                    "done",
                    "response",
                    "ids",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(st.sampled_from(sorted(Api)), json_values, st.sampled_from(["message", "error"]))
def test_no_payload_makes_a_parser_raise(api: str, value: object, kind: str):
    """Whatever JSON arrives, parse() returns a Delta and never raises."""
    assert isinstance(parse(api, value, kind), Delta)


@given(st.sampled_from(sorted(Api)), st.text(max_size=40))
def test_no_text_makes_a_parser_raise(api: str, text: str):
    """Whatever text arrives, parse() returns a Delta and never raises."""
    assert isinstance(parse(api, text), Delta)
