"""The recorded provider streams under tests/corpus/ (see tests/corpus/SOURCES.md), and what each
one is: the path it was recorded at, its API and its documented usage total."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hopmeter.core.frames import Frame
from hopmeter.core.ndjson import NdjsonDecoder
from hopmeter.core.sse import SseDecoder
from hopmeter.core.wire import refine_api

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CHAT = "/v1/chat/completions"

needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")


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
# details.generated_tokens; Gemini: candidatesTokenCount + thoughtsTokenCount (see apis/gemini.py).
CASES: dict[str, Case] = {
    "anthropic/messages-basic-sdk.sse": Case("/v1/messages", "anthropic.messages", 6),
    "anthropic/messages-compaction-cache.sse": Case(
        "/v1/messages?beta=true", "anthropic.messages", 8
    ),
    # its only usage is message_start's (output_tokens 2, the count as it started, 7 deltas
    # before the error): no total for the reply
    "anthropic/messages-error-overloaded.sse": Case(
        "/v1/messages", "anthropic.messages", None, error=True
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
