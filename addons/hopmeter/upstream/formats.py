"""How the demo upstream spells a reply in each API's streaming format.

Each encoder turns a reply (reasoning and answer tokens) into planned events: the bytes of one
event and the index of the last token it carries, so the server can send it when the token clock
reaches that token. Events carrying no token (preludes, usage, terminators) have `last_token=None`
and go out with their neighbours.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from hopmeter.upstream.scenario import Scenario

_WORDS = [
    "Streaming",
    "puts",
    "the",
    "first",
    "words",
    "on",
    "screen",
    "long",
    "before",
    "the",
    "last",
    "ones",
    ",",
    "because",
    "every",
    "hop",
    "forwards",
    "each",
    "token",
    "as",
    "it",
    "arrives",
    "instead",
    "of",
    "waiting",
    "for",
    "the",
    "whole",
    "reply",
    ".",
]
_EMOJI = ("🦙", " 👩\u200d💻", "。", "猫", " 🚀")


@dataclass(frozen=True, slots=True)
class Planned:
    """One event to send: its bytes, the last token index it carries and how many tokens."""

    body: bytes
    last_token: int | None
    tokens: int = 0
    error: bool = False


def reply_tokens(s: Scenario) -> tuple[list[str], list[str]]:
    """The reasoning and answer tokens of a reply, deterministic for a scenario."""
    reasoning = [f" step{i}" if i else "Thinking" for i in range(s.reasoning)]
    answer = []
    for i in range(s.tokens):
        if s.emoji and i % 5 == 4:
            tok = _EMOJI[(i // 5) % len(_EMOJI)]
            answer.append("\ufffd" if s.fffd else tok)
        else:
            word = _WORDS[i % len(_WORDS)]
            answer.append(word if i == 0 else " " + word)
    return reasoning, answer


def _groups(n: int, k: int, offset: int) -> list[tuple[int, int]]:
    """(first, last) token indexes of each event when k tokens are coalesced per event."""
    return [(offset + i, offset + min(i + k, n) - 1) for i in range(0, n, k)]


def _sse(data: Mapping[str, object] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def openai_chat(s: Scenario, model: str, include_usage: bool) -> list[Planned]:
    """OpenAI chat-completions chunks: role prelude, reasoning, content, finish, usage, [DONE]."""
    rid, created = "chatcmpl-hopmeter", int(time.time())
    reasoning, answer = reply_tokens(s)

    def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    out = [Planned(_sse(chunk({"role": "assistant", "content": ""})), None)]
    for kind, toks, offset in (
        ("reasoning_content", reasoning, 0),
        ("content", answer, len(reasoning)),
    ):
        for first, last in _groups(len(toks), s.coalesce, offset):
            text = "".join(toks[first - offset : last - offset + 1])
            out.append(Planned(_sse(chunk({kind: text})), last, last - first + 1))
    out.append(Planned(_sse(chunk({}, "stop")), None))
    if include_usage and s.usage:
        usage = {
            "prompt_tokens": 12,
            "completion_tokens": s.total_tokens,
            "total_tokens": 12 + s.total_tokens,
        }
        out.append(
            Planned(
                _sse(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                ),
                None,
            )
        )
    out.append(Planned(_sse("[DONE]"), None))
    return out


def openai_error() -> Planned:
    """The error object OpenAI-compatible servers send inside a 200 stream."""
    body = {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "code": "internal_error",
        }
    }
    return Planned(_sse(body), None, error=True)


def anthropic_messages(s: Scenario, model: str) -> list[Planned]:
    """Anthropic Messages events: message_start, thinking and text blocks, message_delta, stop."""
    reasoning, answer = reply_tokens(s)
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_hopmeter",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        },
    }
    out = [Planned(_sse(start, "message_start"), None)]
    index = 0
    for kind, toks, offset in (("thinking", reasoning, 0), ("text", answer, len(reasoning))):
        if not toks:
            continue
        block = (
            {"type": kind, kind: ""}
            if kind == "text"
            else {"type": "thinking", "thinking": "", "signature": ""}
        )
        out.append(
            Planned(
                _sse(
                    {"type": "content_block_start", "index": index, "content_block": block},
                    "content_block_start",
                ),
                None,
            )
        )
        if index == 0:
            out.append(Planned(_sse({"type": "ping"}, "ping"), None))
        for first, last in _groups(len(toks), s.coalesce, offset):
            text = "".join(toks[first - offset : last - offset + 1])
            delta = {"type": f"{kind}_delta", kind: text}
            out.append(
                Planned(
                    _sse(
                        {"type": "content_block_delta", "index": index, "delta": delta},
                        "content_block_delta",
                    ),
                    last,
                    last - first + 1,
                )
            )
        out.append(
            Planned(
                _sse({"type": "content_block_stop", "index": index}, "content_block_stop"), None
            )
        )
        index += 1
    usage = {"output_tokens": s.total_tokens if s.usage else 0}
    out.append(
        Planned(
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": usage,
                },
                "message_delta",
            ),
            None,
        )
    )
    out.append(Planned(_sse({"type": "message_stop"}, "message_stop"), None))
    return out


def anthropic_error() -> Planned:
    """Anthropic's error event inside a 200 stream."""
    body: dict[str, object] = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    return Planned(_sse(body, "error"), None, error=True)


def ollama_chat(s: Scenario, model: str, generate: bool) -> list[Planned]:
    """Ollama NDJSON lines for /api/chat or /api/generate, ending with done:true and eval_count."""
    reasoning, answer = reply_tokens(s)
    stamp = "2026-01-01T00:00:00Z"
    out = []

    def line(doc: dict[str, object]) -> bytes:
        return orjson.dumps(doc) + b"\n"

    for kind, toks, offset in (("thinking", reasoning, 0), ("content", answer, len(reasoning))):
        for first, last in _groups(len(toks), s.coalesce, offset):
            text = "".join(toks[first - offset : last - offset + 1])
            if generate:
                body: dict[str, object] = {
                    "model": model,
                    "created_at": stamp,
                    ("response" if kind == "content" else "thinking"): text,
                    "done": False,
                }
            else:
                body = {
                    "model": model,
                    "created_at": stamp,
                    "message": {"role": "assistant", kind: text},
                    "done": False,
                }
            out.append(Planned(line(body), last, last - first + 1))
    final: dict[str, object] = {
        "model": model,
        "created_at": stamp,
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 12,
    }
    if s.usage:
        final["eval_count"] = s.total_tokens
    if not generate:
        final["message"] = {"role": "assistant", "content": ""}
    else:
        final["response"] = ""
    out.append(Planned(line(final), None))
    return out


def ollama_document(s: Scenario, model: str, generate: bool) -> bytes:
    """A non-streamed Ollama reply (`"stream": false`): one JSON object, done:true, the whole
    text and the counts."""
    reasoning, answer = reply_tokens(s)
    doc: dict[str, object] = {
        "model": model,
        "created_at": "2026-01-01T00:00:00Z",
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 12,
    }
    if s.usage:
        doc["eval_count"] = s.total_tokens
    if generate:
        doc["response"] = "".join(answer)
        if reasoning:
            doc["thinking"] = "".join(reasoning)
    else:
        message: dict[str, object] = {"role": "assistant", "content": "".join(answer)}
        if reasoning:
            message["thinking"] = "".join(reasoning)
        doc["message"] = message
    return orjson.dumps(doc)


def ollama_error() -> Planned:
    """Ollama's error line."""
    return Planned(
        orjson.dumps({"error": "model runner has unexpectedly stopped"}) + b"\n", None, error=True
    )


def openai_document(s: Scenario, model: str) -> bytes:
    """A non-streamed chat completion: the whole reply as one JSON document."""
    _reasoning, answer = reply_tokens(s)
    doc = {
        "id": "chatcmpl-hopmeter",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "".join(answer)},
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": s.total_tokens,
            "total_tokens": 12 + s.total_tokens,
        },
    }
    return orjson.dumps(doc)


def anthropic_document(s: Scenario, model: str) -> bytes:
    """A non-streamed Anthropic message."""
    _, answer = reply_tokens(s)
    doc = {
        "id": "msg_hopmeter",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "".join(answer)}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 12, "output_tokens": s.total_tokens},
    }
    return orjson.dumps(doc)


Encoder = Callable[[Scenario, str], list[Planned]]
