"""Tests for hopmeter.core.providers: API detection and per-event parsing, on the corpus."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.frames import Frame
from hopmeter.core.ndjson import NdjsonDecoder
from hopmeter.core.providers import (
    Delta,
    OpenAIChatParser,
    _plain_chat_chunk,
    content_delta,
    detect_api,
    make_parser,
    model_from_path,
    refine_api,
)
from hopmeter.core.sse import SseDecoder
from hopmeter.core.tokens import estimate_tokens, reconcile
from hopmeter.core.vocab import Api
from tests.harness.corpus import CORPUS

SSE = {"content-type": "text/event-stream"}
NDJSON = {"content-type": "application/x-ndjson"}
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Case:
    """One recording: where it plausibly came from, and what its stream says."""

    path: str  # request path (with query) it was recorded at, or a plausible one
    api: str
    output_total: int | None  # last usage total documented in SOURCES.md (None: no usage)
    model_path: str | None = None  # where the model is named when the payload does not name it
    error: bool = False
    request_headers: dict[str, str] = field(default_factory=dict)


ANTHROPIC = {"anthropic-version": "2023-06-01"}

# Output totals as SOURCES.md documents them: completion_tokens / output_tokens / eval_count /
# details.generated_tokens; Gemini: candidatesTokenCount + thoughtsTokenCount (see providers.py).
CASES: dict[str, Case] = {
    "anthropic/messages-basic-sdk.sse": Case("/v1/messages", "anthropic.messages", 6),
    "anthropic/messages-compaction-cache.sse": Case(
        "/v1/messages?beta=true", "anthropic.messages", 8
    ),
    "anthropic/messages-error-overloaded.sse": Case(
        "/v1/messages", "anthropic.messages", 2, error=True
    ),
    "anthropic/messages-redacted-thinking.sse": Case(
        "/v1/messages?beta=true", "anthropic.messages", 189
    ),
    "anthropic/messages-stop-sequence.sse": Case("/v1/messages", "anthropic.messages", 28),
    "anthropic/messages-structured-output-padded.sse": Case(
        "/v1/messages", "anthropic.messages", 10
    ),
    "anthropic/messages-text-basic.sse": Case("/v1/messages", "anthropic.messages", 10),
    "anthropic/messages-thinking.sse": Case("/v1/messages?beta=true", "anthropic.messages", 282),
    "anthropic/messages-tool-call-only.sse": Case("/v1/messages", "anthropic.messages", 40),
    # a gateway path: the anthropic-version request header tells
    "anthropic/messages-tool-use-padded.sse": Case(
        "/llm/claude", "anthropic.messages", 124, request_headers=ANTHROPIC
    ),
    "anthropic/messages-tool-use.sse": Case("/v1/messages", "anthropic.messages", 65),
    "anthropic/messages-web-search.sse": Case("/v1/messages?beta=true", "anthropic.messages", 644),
    "azure-openai/chat-async-content-filter.sse": Case(
        "/openai/deployments/gpt-4o/chat/completions?api-version=2024-08-01-preview",
        "openai.chat",
        None,
    ),
    "cerebras/chat-llama-3.3-no-done.sse": Case("/cerebras/v1/chat/completions", "openai.chat", 20),
    "deepseek/chat-reasoner.sse": Case("/chat/completions", "openai.chat", 212),
    "deepseek/responses-text.sse": Case("/responses", "openai.responses", 15),
    "fireworks/chat-llama-v3p3-70b.sse": Case(
        "/fireworks-ai/inference/v1/chat/completions", "openai.chat", 20
    ),
    "gemini/stream-basic-2.0-flash.sse": Case(
        "/v1beta/models/gemini-2.0-flash-exp:streamGenerateContent?alt=sse", "gemini", 8
    ),
    "gemini/stream-code-execution-gemini-3.sse": Case(
        "/v1beta/models/gemini-3-flash-preview:streamGenerateContent?alt=sse", "gemini", 108 + 168
    ),
    "gemini/stream-thinking-2.5-pro.sse": Case(
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "gemini", 469 + 787
    ),
    "gemini/stream-tool-call-thought-signature.sse": Case(
        "/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse", "gemini", 10 + 202
    ),
    "gemini/stream-usage-mid-stream-2.5-flash.sse": Case(
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "gemini", 80 + 35
    ),
    "gemini/stream-vertex-flex.sse": Case(
        "/v1beta1/projects/p/locations/global/publishers/google/models/"
        "gemini-3-flash-preview:streamGenerateContent?alt=sse",
        "gemini",
        1 + 100,
    ),
    "gemini/stream-web-search-grounding.sse": Case(
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "gemini", 241 + 412
    ),
    "groq/chat-error-event-tool-use-failed.sse": Case(
        "/openai/v1/chat/completions", "openai.chat", None, error=True
    ),
    "groq/chat-reasoning-x-groq-usage.sse": Case("/openai/v1/chat/completions", "openai.chat", 49),
    "groq/chat-web-search-llama-3.3.sse": Case("/openai/v1/chat/completions", "openai.chat", 359),
    "mistral/chat-after-tool-result.sse": Case(CHAT, "openai.chat", 64),
    "mistral/chat-magistral-thinking.sse": Case(CHAT, "openai.chat", 232),
    "mistral/chat-mistral-tiny-usage.sse": Case(CHAT, "openai.chat", 128),
    "mistral/chat-tool-call-no-final-newline.sse": Case(CHAT, "openai.chat", 31),
    "novita/chat-llama-3.1-8b-content-filter.sse": Case(
        "/novita/v3/openai/chat/completions", "openai.chat", 20
    ),
    "ollama/chat-phi3-no-final-newline.ndjson": Case("/api/chat", "ollama", 239),
    "ollama/generate-deepseek-r1.ndjson": Case("/api/generate", "ollama", 48),
    "ollama/generate-phi3-context.ndjson": Case("/api/generate", "ollama", 304),
    "openai/chat-finish-length.sse": Case(CHAT, "openai.chat", 1),
    "openai/chat-json-schema.sse": Case(CHAT, "openai.chat", 14),
    "openai/chat-logprobs.sse": Case(CHAT, "openai.chat", 2),
    "openai/chat-long-json-format.sse": Case(CHAT, "openai.chat", 177),
    "openai/chat-n3-multichoice.sse": Case(CHAT, "openai.chat", 42),
    "openai/chat-parallel-tool-calls.sse": Case(CHAT, "openai.chat", 60),
    "openai/chat-refusal-logprobs.sse": Case(CHAT, "openai.chat", 12),
    "openai/chat-refusal.sse": Case(CHAT, "openai.chat", 11),
    "openai/chat-text-include-usage.sse": Case(CHAT, "openai.chat", 30),
    "openai/chat-tool-call-strict.sse": Case(CHAT, "openai.chat", 24),
    "openai/chat-tool-call-weather.sse": Case(CHAT, "openai.chat", 19),
    "openai/chat-tool-nonstrict.sse": Case(CHAT, "openai.chat", 16),
    "openai/responses-background-resume.sse": Case(
        "/v1/responses/resp_0850765c843cca53?starting_after=0&stream=true", "openai.responses", 9
    ),
    "openai/responses-basic-llm.sse": Case("/v1/responses", "openai.responses", 5),
    "openai/responses-file-search.sse": Case("/v1/responses", "openai.responses", 37),
    "openai/responses-function-call-usage.sse": Case("/v1/responses", "openai.responses", 469),
    "openai/responses-logprobs.sse": Case("/v1/responses", "openai.responses", 10),
    "openai/responses-text-basic.sse": Case("/v1/responses", "openai.responses", 9),
    "openai/responses-tool-use-llm.sse": Case("/v1/responses", "openai.responses", 23),
    "openai/responses-web-search.sse": Case("/v1/responses", "openai.responses", 582),
    "openrouter/chat-reasoning-claude.sse": Case("/api/v1/chat/completions", "openai.chat", 36),
    "openrouter/chat-stream-error-comments.sse": Case(
        "/api/v1/chat/completions", "openai.chat", 10, error=True
    ),
    "openrouter/chat-web-search-usage.sse": Case("/api/v1/chat/completions", "openai.chat", 30),
    "openrouter/responses-gpt-oss.sse": Case("/api/v1/responses", "openai.responses", 37),
    "snowflake-cortex/chat-claude-sonnet-4-6.sse": Case(
        "/api/v2/cortex/v1/chat/completions", "openai.chat", 5
    ),
    "tgi/chat-messages-api-llama-3.1.sse": Case(
        "/hf-inference/models/meta-llama/Llama-3.1-8B-Instruct/v1/chat/completions",
        "openai.chat",
        None,
    ),
    "tgi/chat-messages-api-logprobs.sse": Case(CHAT, "openai.chat", None),
    "tgi/generate-stream-details.sse": Case(
        "/generate_stream", "tgi", 1, model_path="/hf-inference/models/openai-community/gpt2"
    ),
    "tgi/generate-stream-token-objects.sse": Case(
        "/generate_stream", "tgi", 150, model_path="/models/tiiuae/falcon-7b-instruct"
    ),
    "together/chat-deepseek-r1-token-ids.sse": Case(
        "/together/v1/chat/completions", "openai.chat", 955
    ),
    "together/chat-llama-3-8b-turbo.sse": Case("/together/v1/chat/completions", "openai.chat", 20),
    "vllm/chat-crusoe-llama-3.3-include-usage.sse": Case(CHAT, "openai.chat", 14),
    "zai/chat-glm-4.7-reasoning.sse": Case("/api/paas/v4/chat/completions", "openai.chat", 564),
}

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


def corpus_frames(name: str) -> list[Frame]:
    """All frames of one recording, fed whole, through the real SSE or NDJSON decoder."""
    data = (CORPUS / name).read_bytes()
    decoder = NdjsonDecoder() if name.endswith(".ndjson") else SseDecoder()
    return decoder.feed(data, 0.0) + decoder.close(1.0)


def refined(base: str, frames: list[Frame]) -> str:
    """refine_api over the first frames, as a caller retrying until the payload tells."""
    api = base
    for frame in frames:
        api = refine_api(base, frame.data)
        if api != base:
            break
    return api


def parse_all(api: str, frames: list[Frame]) -> list[Delta]:
    parser = make_parser(api)
    deltas = [parser.parse(f) for f in frames]
    assert parser.malformed == 0
    return deltas


needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")


@needs_corpus
def test_every_recording_has_a_case():
    """The table above names every file of the corpus, so a new recording cannot go untested."""
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.glob("*/*") if p.suffix != ".md"}
    assert files == set(CASES)


@needs_corpus
@pytest.mark.parametrize("name", sorted(CASES))
def test_detect_api_from_path_and_headers(name: str):
    """A recording's request path and headers name its API."""
    case = CASES[name]
    headers = NDJSON if name.endswith(".ndjson") else SSE
    method = "GET" if "starting_after" in case.path else "POST"
    api = detect_api(method, case.path, case.request_headers, headers, headers["content-type"])
    assert api == case.api


@needs_corpus
@pytest.mark.parametrize("name", sorted(CASES))
def test_refine_api_from_payload_alone(name: str):
    """Behind an unknown path, the first payloads alone name the API."""
    base = "ndjson" if name.endswith(".ndjson") else "sse"
    assert (
        detect_api(
            "POST", "/foo", {}, {}, "text/event-stream" if base == "sse" else "application/x-ndjson"
        )
        == base
    )
    assert refined(base, corpus_frames(name)) == CASES[name].api


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
def test_token_ids_of_together_stream():
    """Together's delta.token_id becomes the event's token_ids, one id per chunk."""
    deltas = parse_all("openai.chat", corpus_frames("together/chat-deepseek-r1-token-ids.sse"))
    assert deltas[0].token_ids == (128798,)
    assert deltas[0].content == "<think>"  # the legacy choices[].text copy is not added again
    assert deltas[-1].terminal  # [DONE]


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


@needs_corpus
def test_running_usage_is_cumulative():
    """Novita sends usage on every chunk as a running total; the parser reports it as sent."""
    deltas = parse_all("openai.chat", corpus_frames("novita/chat-llama-3.1-8b-content-filter.sse"))
    totals = [d.output_tokens_total for d in deltas if d.output_tokens_total is not None]
    assert totals == list(range(21))


@needs_corpus
def test_anthropic_usage_split_across_events():
    """message_start carries input and the first output count; message_delta the final output."""
    deltas = parse_all("anthropic.messages", corpus_frames("anthropic/messages-thinking.sse"))
    assert deltas[0].input_tokens_total == 43
    assert deltas[0].output_tokens_total == 1
    assert deltas[-2].output_tokens_total == 282
    assert deltas[-1].terminal
    reasoning = "".join(d.reasoning for d in deltas)
    assert reasoning and not any(d.visible for d in deltas if "signature_delta" in str(d))


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


@needs_corpus
def test_ollama_thinking_split_and_final_counts():
    """Ollama's final done:true line carries eval_count and prompt_eval_count."""
    deltas = parse_all("ollama", corpus_frames("ollama/generate-deepseek-r1.ndjson"))
    assert deltas[0].content == "<think>"
    assert deltas[-1].terminal and deltas[-1].input_tokens_total == 8


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
    assert [d.error for d in router if d.error] == ["400: Token limit reached"]


# -- synthetic payloads -------------------------------------------------------------------------


def frame(data: str | object, kind: str = "message") -> Frame:
    text = data if isinstance(data, str) else json.dumps(data)
    return Frame(t_s=0.0, kind=kind, data=text, wire_bytes=len(text), data_bytes=len(text))


def parse(api: str, data: str | object, kind: str = "message") -> Delta:
    return make_parser(api).parse(frame(data, kind))


@pytest.mark.parametrize(
    ("path", "req", "resp", "ctype", "api"),
    [
        ("/v1/chat/completions", {}, {}, "application/json", "openai.chat"),
        ("/v1/completions", {}, {}, "text/event-stream", "openai.chat"),
        ("/v1/responses", {}, {}, "text/event-stream", "openai.responses"),
        ("/v1/messages/", {}, {}, "text/event-stream", "anthropic.messages"),
        ("/x", {"Anthropic-Version": "2023-06-01"}, {}, "text/event-stream", "anthropic.messages"),
        ("/v1/models/gemini-pro:generateContent", {}, {}, "application/json", "gemini"),
        ("/v1beta/models/gemini-pro:foo?alt=sse", {}, {}, "text/event-stream", "gemini"),
        ("/generate", {}, {}, "text/event-stream", "tgi"),
        ("/api/chat", {}, {}, "application/x-ndjson", "ollama"),
        ("/api/generate", {}, {}, "application/json", "ollama"),
        ("/stream", {}, {"X-Tokenizer": "r50k_base"}, "text/event-stream", "token_ids"),
        ("/packed", {}, {"X-Tokenizer": "r50k_base"}, "application/octet-stream", "token_ids"),
        ("/v1/chat/completions", {}, {}, "application/x-token-ids; width=16", "token_ids"),
        ("/foo", {}, {}, "text/event-stream; charset=utf-8", "sse"),
        ("/foo", {}, {}, "application/x-ndjson", "ndjson"),
        ("/foo", {}, {}, "application/octet-stream", "other"),
        ("/foo", {}, {}, "", "other"),
    ],
)
def test_detect_api_rules(path, req, resp, ctype, api):
    """Paths, then the anthropic-version and X-Tokenizer headers, then the media type decide."""
    assert detect_api("POST", path, req, resp, ctype) == api


@pytest.mark.parametrize(
    ("data", "api"),
    [
        ('{"object":"chat.completion.chunk","choices":[]}', "openai.chat"),
        ('{"choices":[{"text":"hi"}]}', "openai.chat"),
        ('{"type":"response.created","response":{}}', "openai.responses"),
        ('{"object":"response","output":[]}', "openai.responses"),
        ('{"type":"message_start","message":{}}', "anthropic.messages"),
        ('{"candidates":[]}', "gemini"),
        ('[{"candidates":[]}]', "gemini"),
        ('{"token":{"id":1,"text":"a","special":false}}', "tgi"),
        ('{"model":"m","message":{"content":"a"},"done":false}', "ollama"),
        ('{"model":"m","response":"a","done":false}', "ollama"),
        ("[15496, 11]", "token_ids"),
        ('{"ids":[1,2]}', "token_ids"),
    ],
)
def test_refine_api_sniffs_payloads(data: str, api: str):
    """A payload's own keys name the API behind an unknown path."""
    assert refine_api("sse", data) == api


@pytest.mark.parametrize("data", ["[DONE]", "plain text", '{"error":"x"}', "", "[]", "42"])
def test_refine_api_keeps_unknown_when_payload_is_silent(data: str):
    """A payload that names no API leaves the unknown API as it was, to try the next frame."""
    assert refine_api("sse", data) == "sse"
    assert refine_api("ndjson", data) == "ndjson"


def test_refine_api_leaves_known_apis_alone():
    """A path-detected API is never second-guessed by a payload."""
    assert refine_api("openai.chat", '{"candidates":[]}') == "openai.chat"


def test_model_from_path():
    """Gemini, Vertex and Hugging Face paths name the model."""
    assert model_from_path("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse") == (
        "gemini-2.5-pro"
    )
    assert model_from_path("/hf-inference/models/meta-llama/Llama-3.1-8B/v1/chat/completions") == (
        "meta-llama/Llama-3.1-8B"
    )
    assert model_from_path("/models/openai-community/gpt2") == "openai-community/gpt2"
    assert model_from_path("/v1/chat/completions") is None


def test_malformed_json_is_counted_not_raised():
    """Invalid JSON gives an empty Delta and one count in `malformed`."""
    parser = make_parser("openai.chat")
    assert parser.parse(frame('{"choices": [')) == Delta()
    assert parser.parse(frame("[1, 2]")) == Delta()
    assert parser.malformed == 2


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
    assert err.error == "server_error: m" and not err.terminal
    failed = parse(
        "openai.responses",
        {
            "type": "response.failed",
            "response": {"error": {"code": "rate_limit", "message": "slow down"}, "usage": None},
        },
    )
    assert failed.terminal and failed.error == "rate_limit: slow down"


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


def test_anthropic_error_event_and_signature():
    """`event: error` is an error; signature deltas and pings show nothing."""
    err = parse(
        "anthropic.messages",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        kind="error",
    )
    assert err.error == "overloaded_error: Overloaded"
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


def test_gemini_errors_and_json_array_form():
    """Gemini error objects and blocked prompts are errors; a JSON array is read chunk by chunk."""
    assert (
        parse(
            "gemini", {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota"}}
        ).error
        == "429: RESOURCE_EXHAUSTED: quota"
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
        "model runner has unexpectedly stopped"
    )


@pytest.mark.parametrize(
    ("data", "ids", "terminal"),
    [
        ("[15496, 11]", (15496, 11), False),
        ({"ids": [1, 2, 3]}, (1, 2, 3), False),
        ({"token_ids": [4], "text": "x"}, (4,), False),
        ({"token_id": 7, "finish_reason": "stop"}, (7,), True),
        ({"done": True}, None, True),
    ],
)
def test_token_id_events(data, ids, terminal):
    """Token-ID events carry ids (a JSON array, or ids/token_ids/token_id keys) as their tokens."""
    d = parse("token_ids", data)
    assert d.token_ids == ids
    assert d.stream_tokens == (len(ids) if ids else None)
    assert d.terminal == terminal
    assert d.visible == bool(ids)


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


def test_content_delta_is_the_keyword_delta():
    """The positional builder of the per-event path fills the fields the keywords name."""
    assert content_delta("hi", "m", True) == Delta(content="hi", model="m", terminal=True)
    assert content_delta("", None, False) == Delta()
    assert type(content_delta("x", None, False)) is Delta
    assert len(Delta._fields) == 12  # content_delta lists every field: update it with Delta
