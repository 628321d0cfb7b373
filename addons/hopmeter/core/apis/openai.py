"""What one event says in OpenAI's two formats: Chat Completions and the Responses API.

"openai.chat" is a wire format, not a vendor: TGI's Messages API, vLLM, Groq, Mistral, DeepSeek and
OpenRouter chat all speak it; DeepSeek's and OpenRouter's Responses endpoints speak
"openai.responses". The chat chunk nearly every token arrives in also has a plain reader,
`plain_chat_payload`, which FlowMeter calls on the payload bytes (no Frame, no decoded copy).
"""

from __future__ import annotations

from typing import Any, Final

from orjson import JSONDecodeError
from orjson import loads as _loads

from hopmeter.core.apis._base import EMPTY, ApiParser, Delta, _text_delta, content_delta
from hopmeter.core.apis._json import (
    _dict,
    _error_text,
    _int,
    _int_list,
    _list,
    _model,
    _str,
)
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api

# Responses API deltas that carry model output, by the Delta field they feed.
_RESPONSES_DELTAS: Final = {
    "response.output_text.delta": "content",
    "response.refusal.delta": "content",
    "response.reasoning_text.delta": "reasoning",
    "response.reasoning_summary_text.delta": "reasoning",
    "response.function_call_arguments.delta": "tool_args",
    "response.custom_tool_call_input.delta": "tool_args",
    "response.mcp_call_arguments.delta": "tool_args",
    "response.code_interpreter_call_code.delta": "tool_args",
}
_RESPONSES_ENDS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _filtered(results: object) -> list[str]:
    """Azure content-filter categories that filtered a choice (`{"hate": {"filtered": true}}`)."""
    return [
        name for name, verdict in _dict(results).items() if _dict(verdict).get("filtered") is True
    ]


def _reasoning_tokens(usage: dict[str, object]) -> int | None:
    """Responses API: usage.output_tokens_details.reasoning_tokens."""
    return _int(_dict(usage.get("output_tokens_details")).get("reasoning_tokens"))


_PLAIN_CHOICE = frozenset({"index", "delta", "finish_reason", "logprobs"})
_PLAIN_DELTA = frozenset({"content", "role"})
_new_delta = tuple.__new__


def _plain_chat_chunk(doc: dict[str, object]) -> Delta | None:
    """The Delta of the chunk nearly every token arrives in, or None for any other shape.

    One choice whose delta holds only `content` (and perhaps `role`), with no finish reason,
    logprobs, usage, error or vendor fields: the full reader below gives the same Delta for it
    (a test holds the two to that over the corpus), at a fraction of the cost per event.
    """
    said = _plain_chat_said(doc)
    return None if said is None else _said_delta(said)


def _said_delta(said: tuple[str, str | None, bool]) -> Delta:
    """The Delta of a plain chunk's content, model and end (`_plain_chat_said`)."""
    content, model, terminal = said
    return _new_delta(
        Delta, (content, "", "", None, None, None, None, None, model, terminal, None, False)
    )


def _plain_chat_said(doc: dict[str, object]) -> tuple[str, str | None, bool] | None:
    """What a plain chunk says (`_plain_chat_chunk`): its content, model and end; else None.

    This runs once per token event, so the usual chunk is read by subscripts and `in` tests
    (a dict's `keys() <= set` costs eight of them): a choice of `index`, `delta` and a null
    `finish_reason` (and a null `logprobs`), a delta of one string `content`, `model` and
    `object` present. Anything else (a KeyError or TypeError on the way, or a test that fails)
    is read again step by step by `_plain_chat_general`, which gives the same answer for the
    usual chunk (a property test holds the two together).
    """
    try:
        choices: Any = doc["choices"]  # any JSON value: the subscripts and tests below tell
        (choice,) = choices  # ValueError: not one; TypeError: not a sequence
        part = choice["delta"]  # a str subscript that works: `choice` is a dict
        n = len(choice)
        if (
            type(choices) is list
            and len(part) == 1
            and type(content := part["content"]) is str  # `part` is a dict (str subscript)
            and choice["finish_reason"] is None
            and "index" in choice
            and (n == 3 or (n == 4 and choice["logprobs"] is None))
            and "error" not in doc
            and "x_groq" not in doc
            and doc.get("usage") is None
            and type(model := doc["model"]) is str
        ):
            return content, model or None, doc["object"] == "chat.completion"
    except (KeyError, TypeError, ValueError):
        pass
    plain = _plain_chat_general(doc)
    return None if plain is None else (plain.content, plain.model, plain.terminal)


def _plain_chat_general(doc: dict[str, object]) -> Delta | None:
    """`_plain_chat_chunk` step by step, for any value at any key."""
    choices = doc.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if (
        type(choice) is not dict
        or choice.get("finish_reason") is not None
        or choice.get("logprobs") is not None
        or not choice.keys() <= _PLAIN_CHOICE
    ):
        return None
    part = choice.get("delta")
    if type(part) is not dict or not part.keys() <= _PLAIN_DELTA:
        return None
    content = part.get("content")
    if content is not None and type(content) is not str:
        return None
    if doc.get("usage") is not None or "error" in doc or "x_groq" in doc:
        return None
    model = doc.get("model")
    return content_delta(
        content or "",
        model if type(model) is str and model else None,
        doc.get("object") == "chat.completion",
    )


def plain_chat_payload(raw: bytes) -> Delta | None:
    """The Delta of one event's payload bytes when they are the common chat chunk (see
    `_plain_chat_chunk`), else None: then the frame goes through `OpenAIChatParser.parse`."""
    said = plain_chat_said(raw)
    return None if said is None else _said_delta(said)


def plain_chat_said(raw: bytes) -> tuple[str, str | None, bool] | None:
    """What one event's payload bytes say (content, model, end) when they are the common chat
    chunk, else None: the plain path's one-event chunk (`FlowMeter._on_content`) needs no Delta.

    `_json_object` inlined (this runs once per token event): orjson reads the bytes and rejects
    invalid UTF-8, so a payload it accepts needs no decoded copy.
    """
    if raw[:1] != b"{":
        return None
    try:
        doc = _loads(raw)
    except JSONDecodeError:
        return None
    return _plain_chat_said(doc) if type(doc) is dict else None


class OpenAIChatParser(ApiParser):
    """Chat Completions chunks, their OpenAI-compatible variants, and whole chat.completion replies.

    Reads `delta.content`, `refusal`, `reasoning` / `reasoning_content` (DeepSeek, vLLM, Groq,
    OpenRouter, Z.ai), Mistral's content arrays of text and thinking parts, `tool_calls`, legacy
    `choices[].text`, `logprobs.content[]` / `logprobs.refusal[]` (one entry per token), Together's
    `delta.token_id` and vLLM's `choices[].token_ids`, `usage` (also per chunk, as vLLM's
    continuous_usage_stats and Novita send it) and Groq's `x_groq.usage`; `{"error": ...}` chunks
    and Azure content-filter verdicts are errors. A `finish_reason` counts as the end as well as
    `[DONE]`: Cerebras and TGI end there, and a usage chunk after it adds no text.
    """

    api = Api.OPENAI_CHAT

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        if frame.kind == "message":
            plain = _plain_chat_chunk(doc)
            if plain is not None:
                return plain
        return self.read_chunk(doc, frame)

    def read_chunk(self, doc: dict[str, object], frame: Frame) -> Delta:
        """The full reader, for every shape of chunk and whole reply listed above."""
        content: list[str] = []
        reasoning: list[str] = []
        tools: list[str] = []
        tokens: int | None = None
        ids: list[int] = []
        saw_ids = False
        finished = False
        filtered: list[str] = []
        for raw in _list(doc.get("choices")):
            choice = _dict(raw)
            reason = choice.get("finish_reason")
            finished = finished or bool(reason)
            if reason == "content_filter":
                filtered.append("finish_reason")
            filtered.extend(_filtered(choice.get("content_filter_results")))
            part = choice.get("delta") if "delta" in choice else choice.get("message")
            choice_ids = _int_list(choice.get("token_ids"))  # vLLM return_token_ids
            if isinstance(part, dict):
                self._read_message(part, content, reasoning, tools)
                token_id = part.get("token_id")  # Together
                if isinstance(token_id, int) and not isinstance(token_id, bool):
                    choice_ids = (token_id,)
            elif isinstance(choice.get("text"), str):
                content.append(_str(choice.get("text")))
            if choice_ids is not None:
                ids.extend(choice_ids)
                saw_ids = True
            logprobs = _dict(choice.get("logprobs"))
            for key in ("content", "refusal"):
                entries = logprobs.get(key)
                if isinstance(entries, list):
                    tokens = (tokens or 0) + len(entries)
        if saw_ids:
            tokens = len(ids)
        usage = _dict(doc.get("usage")) or _dict(_dict(doc.get("x_groq")).get("usage"))
        error = _error_text(doc.get("error"))
        if error is None and frame.kind == "error":
            error = _error_text(doc) or "error"
        if error is None and filtered:
            error = "content_filter: " + ", ".join(sorted(set(filtered)))
        return Delta(
            content="".join(content),
            reasoning="".join(reasoning),
            tool_args="".join(tools),
            stream_tokens=tokens,
            token_ids=tuple(ids) if saw_ids else None,
            output_tokens_total=_int(usage.get("completion_tokens")),
            input_tokens_total=_int(usage.get("prompt_tokens")),
            reasoning_tokens_total=_int(
                _dict(usage.get("completion_tokens_details")).get("reasoning_tokens")
            ),
            model=_model(doc.get("model")),
            terminal=finished or doc.get("object") == "chat.completion",
            error=error,
        )

    @staticmethod
    def _read_message(
        msg: dict[str, object], content: list[str], reasoning: list[str], tools: list[str]
    ) -> None:
        body = msg.get("content")
        if isinstance(body, str):
            content.append(body)
        else:
            for raw in _list(body):  # Mistral: [{"type": "text"|"thinking", ...}]
                item = _dict(raw)
                if item.get("type") == "thinking":
                    for sub in _list(item.get("thinking")):
                        reasoning.append(_str(_dict(sub).get("text")))
                else:
                    content.append(_str(item.get("text")))
        content.append(_str(msg.get("refusal")))
        said = _str(msg.get("reasoning_content")) or _str(msg.get("reasoning"))
        if not said:
            said = "".join(_str(_dict(d).get("text")) for d in _list(msg.get("reasoning_details")))
        reasoning.append(said)
        for raw in _list(msg.get("tool_calls")):
            fn = _dict(_dict(raw).get("function"))
            tools.append(_str(fn.get("name")))
            tools.append(_str(fn.get("arguments")))


class ResponsesParser(ApiParser):
    """OpenAI Responses API events: text, refusal, reasoning and tool-call deltas, usage, errors."""

    api = Api.OPENAI_RESPONSES

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        kind = _str(doc.get("type")) or frame.kind
        field = _RESPONSES_DELTAS.get(kind)
        if field is not None:
            text = _str(doc.get("delta"))
            logprobs = doc.get("logprobs")
            tokens = len(logprobs) if isinstance(logprobs, list) and logprobs else None
            return _text_delta(field, text, tokens)
        if kind == "response.output_item.added":
            item = _dict(doc.get("item"))
            if item.get("type") in ("function_call", "custom_tool_call", "mcp_call"):
                return Delta(tool_args=_str(item.get("name")))
            return EMPTY
        if kind == "error":
            return Delta(error=_error_text(doc.get("error") or doc) or "error")
        response = _dict(doc.get("response"))
        if not response and doc.get("object") == "response":
            return self._document(doc)
        usage = _dict(response.get("usage"))
        error = _error_text(response.get("error"))
        if kind == "response.failed" and error is None:
            error = "response.failed"
        return Delta(
            output_tokens_total=_int(usage.get("output_tokens")),
            input_tokens_total=_int(usage.get("input_tokens")),
            reasoning_tokens_total=_reasoning_tokens(usage),
            model=_model(response.get("model")),
            terminal=kind in _RESPONSES_ENDS,
            error=error,
        )

    @staticmethod
    def _document(doc: dict[str, object]) -> Delta:
        """A whole (non-streamed) response object."""
        content: list[str] = []
        reasoning: list[str] = []
        tools: list[str] = []
        for raw in _list(doc.get("output")):
            item = _dict(raw)
            parts = [_str(_dict(p).get("text")) for p in _list(item.get("content"))]
            if item.get("type") == "message":
                content.extend(parts)
            elif item.get("type") == "reasoning":
                reasoning.extend(parts)
            elif "arguments" in item:
                tools.extend((_str(item.get("name")), _str(item.get("arguments"))))
        usage = _dict(doc.get("usage"))
        return Delta(
            content="".join(content),
            reasoning="".join(reasoning),
            tool_args="".join(tools),
            output_tokens_total=_int(usage.get("output_tokens")),
            input_tokens_total=_int(usage.get("input_tokens")),
            reasoning_tokens_total=_reasoning_tokens(usage),
            model=_model(doc.get("model")),
            terminal=True,
            error=_error_text(doc.get("error")),
        )
