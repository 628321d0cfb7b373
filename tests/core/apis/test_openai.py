"""Tests for hopmeter.core.apis.openai: chat chunks, Responses events and the plain chat chunk."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.apis.openai import (
    OpenAIChatParser,
    _plain_chat_chunk,
    _plain_chat_general,
    plain_chat_payload,
    plain_chat_said,
)
from hopmeter.core.frames import Frame
from tests.harness.corpus import CORPUS, corpus_frames, needs_corpus, refined
from tests.harness.events import parse, parse_all


@needs_corpus
def test_token_ids_of_together_stream():
    """Together's delta.token_id becomes the event's token_ids, one id per chunk."""
    deltas = parse_all("openai.chat", corpus_frames("together/chat-deepseek-r1-token-ids.sse"))
    assert deltas[0].token_ids == (128798,)
    assert deltas[0].content == "<think>"  # the legacy choices[].text copy is not added again
    assert deltas[-1].terminal  # [DONE]


@needs_corpus
def test_running_usage_is_cumulative():
    """Novita sends usage on every chunk as a running total; the parser reports it as sent."""
    deltas = parse_all("openai.chat", corpus_frames("novita/chat-llama-3.1-8b-content-filter.sse"))
    totals = [d.output_tokens_total for d in deltas if d.output_tokens_total is not None]
    assert totals == list(range(21))


@needs_corpus
def test_multiple_choices_join_in_one_event():
    """With n=3 every chunk's deltas count, whichever choice they belong to."""
    deltas = parse_all("openai.chat", corpus_frames("openai/chat-n3-multichoice.sse"))
    text = "".join(d.content for d in deltas)
    assert text.count("city") == 3  # choices interleave chunk by chunk


@needs_corpus
def test_groq_error_event_and_openrouter_error_chunk():
    """An `event: error` payload and an error object inside a chunk are both errors."""
    groq = parse_all("openai.chat", corpus_frames("groq/chat-error-event-tool-use-failed.sse"))
    assert groq[-1].error is not None and "tool_use_failed" in groq[-1].error
    router = parse_all("openai.chat", corpus_frames("openrouter/chat-stream-error-comments.sse"))
    assert [d.error for d in router if d.error] == ["400\nToken limit reached"]


def test_openai_document_reply():
    """A non-streamed chat.completion is one terminal event with its message and usage."""
    doc = {
        "object": "chat.completion",
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5},
    }
    d = parse("openai.chat", doc, kind="document")
    assert (d.content, d.tool_args, d.output_tokens_total, d.terminal) == ("Hi", "f{}", 5, True)


def test_openai_vllm_token_ids_and_x_groq_usage():
    """vLLM's choices[].token_ids count the event's tokens; x_groq.usage is usage."""
    d = parse(
        "openai.chat",
        {
            "choices": [{"delta": {"content": "ab"}, "token_ids": [5, 6]}],
            "x_groq": {"usage": {"completion_tokens": 9}},
        },
    )
    assert (d.token_ids, d.stream_tokens, d.output_tokens_total) == ((5, 6), 2, 9)


def test_azure_content_filter_is_an_error():
    """A choice filtered by Azure's content filter makes the event an error."""
    d = parse(
        "openai.chat",
        {
            "choices": [
                {
                    "finish_reason": "content_filter",
                    "delta": {},
                    "content_filter_results": {
                        "hate": {"filtered": True},
                        "sexual": {"filtered": False},
                    },
                }
            ]
        },
    )
    assert d.error == "content_filter: finish_reason, hate"


def test_role_prelude_is_not_visible():
    """A role-only chunk with empty content and an empty logprobs list shows nothing."""
    d = parse(
        "openai.chat",
        {"choices": [{"delta": {"role": "assistant", "content": ""}, "logprobs": {"content": []}}]},
    )
    assert not d.visible and d.stream_tokens == 0


def test_responses_error_and_failed():
    """The Responses `error` event and `response.failed` are errors; failed ends the stream."""
    err = parse("openai.responses", {"type": "error", "code": "server_error", "message": "m"})
    assert err.error == "server_error\nm" and not err.terminal
    failed = parse(
        "openai.responses",
        {
            "type": "response.failed",
            "response": {"error": {"code": "rate_limit", "message": "slow down"}, "usage": None},
        },
    )
    assert failed.terminal and failed.error == "rate_limit\nslow down"


def test_responses_reasoning_and_tool_name():
    """Reasoning summary deltas are reasoning; a function_call item's name is tool-call text."""
    assert (
        parse(
            "openai.responses", {"type": "response.reasoning_summary_text.delta", "delta": "hm"}
        ).reasoning
        == "hm"
    )
    added = {
        "type": "response.output_item.added",
        "item": {"type": "function_call", "name": "lookup"},
    }
    assert parse("openai.responses", added).tool_args == "lookup"


def _chat_recordings() -> list[str]:
    return sorted(
        str(p.relative_to(CORPUS))
        for p in CORPUS.rglob("*.sse")
        if refined("sse", corpus_frames(str(p.relative_to(CORPUS)))) == "openai.chat"
    )


@needs_corpus
def test_plain_chunk_shortcut_gives_what_the_full_reader_gives():
    """The common-chunk shortcut of the chat parser agrees with the full reader on every chat
    event of the corpus it accepts, and takes the token events of a plain OpenAI stream (else it
    saves nothing; the corpus is mostly the unusual shapes, which it declines)."""
    parser = OpenAIChatParser()
    plain_stream = corpus_frames("openai/chat-long-json-format.sse")[:-1]  # [DONE] is not JSON
    shortcut = [_plain_chat_chunk(json.loads(f.data)) is not None for f in plain_stream]
    # all but the role chunk (it carries "refusal": null), the finish chunk and the usage chunk
    assert shortcut == [False] + [True] * (len(plain_stream) - 3) + [False, False]
    taken = declined = 0
    for name in _chat_recordings():
        for frame in corpus_frames(name):
            try:
                doc = json.loads(frame.data)
            except json.JSONDecodeError:
                continue  # [DONE]
            if not isinstance(doc, dict):
                continue
            plain = _plain_chat_chunk(doc)
            if plain is None:
                declined += 1
                continue
            taken += 1
            assert plain == parser.read_chunk(doc, frame), (name, frame.data)
    assert taken > 500, (taken, declined)


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
        {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "content_filter"}]},
        {"choices": [{"delta": {"content": "hi"}, "logprobs": {"content": [{}, {}]}}]},
        {"choices": [{"delta": {"content": "hi", "reasoning_content": "r"}}]},
        {"choices": [{"delta": {"content": "hi", "token_id": 7}}]},
        {"choices": [{"delta": {"content": "hi"}, "token_ids": [1, 2]}]},
        {"choices": [{"delta": {"content": "hi"}, "content_filter_results": {"hate": {}}}]},
        {"choices": [{"delta": {"content": "hi"}}], "usage": {"completion_tokens": 3}},
        {"choices": [{"delta": {"content": "hi"}}], "usage": None, "model": "m"},
        {"choices": [{"delta": {"content": "hi"}}], "x_groq": {"usage": {}}},
        {"choices": [{"delta": {"content": "hi"}}], "error": {"message": "boom"}},
        {"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]},
        {"choices": [{"delta": {"content": ["x"]}}]},
        {"choices": [{"text": "legacy"}]},
        {"object": "chat.completion", "choices": [{"delta": {"content": "x"}}]},
    ],
)
def test_plain_chunk_shortcut_on_edge_shapes(chunk: dict[str, object]):
    """Every shape near the common one either is declined or reads exactly as the full reader."""
    frame = Frame(t_s=0.0, kind="message", data=json.dumps(chunk), wire_bytes=0, data_bytes=0)
    parser = OpenAIChatParser()
    full = parser.read_chunk(chunk, frame)
    assert parser.parse(frame) == full
    plain = _plain_chat_chunk(chunk)
    assert plain is None or plain == full


# Values near the usual chunk's, for the property test below: what each key holds in the common
# shape, what it holds in the shapes next to it, and values of every other JSON type.
_VALUES = st.sampled_from(
    [None, "", "x", " tok", "stop", "chat.completion", 0, 1, 1.5, True, [], {}]
)
_DELTAS = st.one_of(
    _VALUES,
    st.dictionaries(st.sampled_from(["content", "role", "refusal", "token_id"]), _VALUES),
    st.just({"content": " tok"}),
)
_CHOICES = st.one_of(
    _VALUES,
    st.builds(
        lambda base, extra: {**base, **extra},
        st.sampled_from(
            [
                {"index": 0, "delta": {"content": " tok"}, "finish_reason": None},
                {"index": 0, "delta": {"content": "a"}, "logprobs": None, "finish_reason": None},
                {"delta": {"content": "a"}},
                {},
            ]
        ),
        st.one_of(
            st.just({}),
            st.dictionaries(
                st.sampled_from(
                    ["index", "delta", "finish_reason", "logprobs", "text", "token_ids"]
                ),
                st.one_of(_VALUES, _DELTAS),
                max_size=2,
            ),
        ),
    ),
)
_DOCS = st.builds(
    lambda base, choices, extra: {**base, "choices": choices, **extra},
    st.sampled_from(
        [
            {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"},
            {"object": "chat.completion", "model": ""},
            {"model": None},
            {},
        ]
    ),
    st.one_of(st.lists(_CHOICES, min_size=1, max_size=1), st.lists(_CHOICES, max_size=2), _VALUES),
    st.one_of(
        st.just({}),
        st.dictionaries(
            st.sampled_from(["model", "object", "usage", "error", "x_groq", "service_tier"]),
            _VALUES,
            max_size=2,
        ),
    ),
)


@given(_DOCS)
def test_plain_chunk_fast_reading_is_the_step_by_step_one(doc: dict[str, object]):
    """The plain chunk's subscript reading of the usual shape gives what its step-by-step
    reading gives, for every chunk near that shape (and what plain_chat_payload and
    plain_chat_said read)."""
    plain = _plain_chat_chunk(doc)
    assert plain == _plain_chat_general(doc)
    assert plain is None or type(plain) is type(_plain_chat_general(doc))
    assert plain_chat_payload(json.dumps(doc).encode()) == plain
    said = None if plain is None else (plain.content, plain.model, plain.terminal)
    assert plain_chat_said(json.dumps(doc).encode()) == said
