"""What each LLM API says in one event: visible text, token counts, usage, end and errors.

`detect_api` names the wire format from the request path and headers; `refine_api` sniffs the first
payloads when the path says nothing (a gateway at `/foo`); `make_parser(api).parse(frame)` turns one
frame into a `Delta`. The API name is the *wire format*, not the vendor: TGI's Messages API, vLLM,
Groq, Mistral, DeepSeek and OpenRouter chat all speak "openai.chat"; DeepSeek's and OpenRouter's
Responses endpoints speak "openai.responses".

Usage totals are reported as the API sends them (cumulative where it is cumulative), so the last
non-None value is the total. The output total includes reasoning wherever the API bills it as
output: OpenAI `completion_tokens` (which holds `reasoning_tokens`), Anthropic `output_tokens`
(thinking included), and Gemini `candidatesTokenCount + thoughtsTokenCount` (counted apart there).

This module is longer than the house ~300 lines: one table of paths and one parser per API is
easier to check side by side than eight small modules. Parsers never raise: malformed payloads are
counted in `parser.malformed` and yield an empty `Delta`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, NamedTuple

import orjson

from hopmeter.core.frames import Frame
from hopmeter.core.vocab import UNKNOWN_APIS, Api

EVENT_STREAM: Final = "text/event-stream"
NDJSON_TYPES: Final = frozenset(
    {
        "application/x-ndjson",
        "application/ndjson",
        "application/jsonl",
        "application/x-jsonlines",
        "application/json-seq",
    }
)
# Packed token-ID bodies (see tokenids.py); octet-stream counts only with an X-Tokenizer header.
PACKED_ID_TYPES: Final = frozenset({"application/x-token-ids", "application/vnd.token-ids"})

# Path rules, first match wins: (compiled pattern on the lower-cased path without query, api).
# Sources: each API's reference (OpenAI /v1/chat/completions, /v1/completions, /v1/responses and
# GET /v1/responses/{id}?stream=true; Anthropic /v1/messages; Gemini and Vertex
# models/{m}:streamGenerateContent; Ollama /api/chat and /api/generate; TGI /generate_stream).
_PATH_RULES: Final = (
    (re.compile(r"/api/(chat|generate)$"), "ollama"),
    (
        re.compile(r"/chat/completions$|/v1/completions$|/openai/deployments/[^/]+/completions$"),
        "openai.chat",
    ),
    (re.compile(r"/responses(/[^/]+)?$"), "openai.responses"),
    (re.compile(r"/v1/messages$"), "anthropic.messages"),
    (re.compile(r":(stream)?generatecontent$"), "gemini"),
    (re.compile(r"/generate(_stream)?$"), "tgi"),
)
_MODEL_IN_PATH: Final = re.compile(r"/models/(.+?)(?::[A-Za-z]+$|/v1/|$)")

# Anthropic Messages event types (https://docs.anthropic.com/en/docs/build-with-claude/streaming).
_ANTHROPIC_TYPES: Final = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
    }
)
# Anthropic content blocks and deltas that carry text: type -> (Delta field, key holding the text).
# signature_delta and citations_delta carry no text; compaction_delta is a summary of the context
# made for the next turn, not reply (its tokens are not in the usage); web_search_tool_result is
# tool output.
_ANTHROPIC_TEXT: Final = {
    "text_delta": ("content", "text"),
    "thinking_delta": ("reasoning", "thinking"),
    "input_json_delta": ("tool_args", "partial_json"),
    "text": ("content", "text"),
    "thinking": ("reasoning", "thinking"),
    "tool_use": ("tool_args", "name"),
    "server_tool_use": ("tool_args", "name"),
    "mcp_tool_use": ("tool_args", "name"),
}
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
# Keys the unknown-format heuristic reads text from, most specific first.
_TEXT_KEYS: Final = (
    "content",
    "text",
    "delta",
    "token",
    "response",
    "message",
    "output",
    "generated_text",
    "completion",
)
_HEURISTIC_DEPTH: Final = 4  # choices[0].delta.content is three levels down
MAX_ERROR_CHARS: Final = 500  # an error message is evidence, not a payload store


class Delta(NamedTuple):
    """What one event adds to the reply, and what it says about the stream.

    An immutable NamedTuple, not a frozen dataclass: one is built per event on the proxy's event
    loop, where a frozen dataclass costs 2.2 µs and this 0.8 µs (bench/micro_feed.py).
    """

    content: str = ""  # visible answer text (refusal text included)
    reasoning: str = ""  # reasoning / thinking text
    tool_args: str = ""  # tool-call names and argument fragments
    stream_tokens: int | None = None  # tokens the stream says this event carries
    token_ids: tuple[int, ...] | None = None
    output_tokens_total: int | None = None  # usage as reported (cumulative where cumulative)
    input_tokens_total: int | None = None
    # the part of the output total the API says was reasoning (OpenAI reasoning_tokens, Gemini
    # thoughtsTokenCount); when no reasoning text was streamed, those tokens were never on the wire
    reasoning_tokens_total: int | None = None
    model: str | None = None
    terminal: bool = False  # the API's own end-of-stream marker
    error: str | None = None  # an error event inside the stream
    ids_visible: bool = False  # a token-ID stream: its ids are the visible output (it has no text)

    @property
    def visible(self) -> bool:
        """True when the event adds something a user sees: text, reasoning or a tool call.

        In a token-ID stream (`ids_visible`), the ids are that output, though they carry no text
        here; elsewhere ids ride along with the text (Together, vLLM, TGI) and do not count, so a
        special token such as TGI's `</s>` is not visible.
        """
        return bool(
            self.content
            or self.reasoning
            or self.tool_args
            or (self.ids_visible and self.token_ids)
        )


_tuple_new = tuple.__new__


def content_delta(content: str, model: str | None, terminal: bool) -> Delta:
    """`Delta(content=..., model=..., terminal=...)` for the per-event paths: built directly,
    without the NamedTuple constructor's keyword and default handling (a third of the cost)."""
    return _tuple_new(
        Delta, (content, "", "", None, None, None, None, None, model, terminal, None, False)
    )


EMPTY: Final = Delta()
DONE: Final = Delta(terminal=True)


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def detect_api(
    method: str,
    path: str,
    request_headers: Mapping[str, str],
    response_headers: Mapping[str, str],
    content_type: str,
) -> str:
    """The API a response speaks, from its request path and the headers of both sides.

    A known path wins; then the `anthropic-version` request header; then `X-Tokenizer` (a token-ID
    stream); then the media type ("sse", "ndjson" or "other", which `refine_api` may sharpen).
    """
    del method  # GET /v1/responses/{id} and POST /v1/responses speak the same events
    req = _lower(request_headers)
    resp = _lower(response_headers)
    media = content_type.split(";", 1)[0].strip().lower()
    route, _, query = path.partition("?")
    route = route.rstrip("/").lower()
    if media in PACKED_ID_TYPES or (media == "application/octet-stream" and "x-tokenizer" in resp):
        return "token_ids"
    for pattern, api in _PATH_RULES:
        if pattern.search(route):
            return api
    if "anthropic-version" in req:
        return "anthropic.messages"
    if "alt=sse" in query.lower() and "/models/" in route:
        return "gemini"
    if "x-tokenizer" in resp:
        return "token_ids"
    if media == EVENT_STREAM:
        return "sse"
    if media in NDJSON_TYPES:
        return "ndjson"
    return "other"


def model_from_path(path: str) -> str | None:
    """The model a path names (`/models/{model}:streamGenerateContent`, HF `/models/{org/name}`)."""
    route = path.split("?", 1)[0]
    match = _MODEL_IN_PATH.search(route)
    return match.group(1) if match else None


def refine_api(api: str, first_frame_data: str) -> str:
    """Sharpen an unknown API ("sse", "ndjson", "other") from one frame's payload.

    Returns `api` unchanged when the payload does not tell (`[DONE]`, an error, plain text): callers
    may try again with the next frame.
    """
    if api not in UNKNOWN_APIS:
        return api
    try:
        doc = orjson.loads(first_frame_data)
    except orjson.JSONDecodeError:
        return api
    if isinstance(doc, list):
        if doc and all(_is_int(x) for x in doc):
            return "token_ids"
        doc = doc[0] if doc and isinstance(doc[0], dict) else None
    if not isinstance(doc, dict):
        return api
    return _sniff(doc) or api


def _sniff(doc: dict[str, object]) -> str | None:
    kind = doc.get("type")
    if isinstance(kind, str):
        if kind.startswith("response."):
            return "openai.responses"
        if kind in _ANTHROPIC_TYPES:
            return "anthropic.messages"
    obj = doc.get("object")
    if obj in ("chat.completion.chunk", "chat.completion", "text_completion") or (
        isinstance(doc.get("choices"), list)
    ):
        return "openai.chat"
    if obj == "response":
        return "openai.responses"
    if "candidates" in doc or "usageMetadata" in doc or "promptFeedback" in doc:
        return "gemini"
    token = doc.get("token")
    if isinstance(token, dict) and "id" in token:
        return "tgi"
    if "done" in doc and ("message" in doc or "response" in doc or "created_at" in doc):
        return "ollama"
    if _int_list(doc.get("token_ids")) is not None or _int_list(doc.get("ids")) is not None:
        return "token_ids"
    return None


# -- small typed readers for JSON values --------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _int_list(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(_is_int(x) for x in value):
        return tuple(value)
    return None


def _model(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _dumps(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return ""


def _error_text(value: object) -> str | None:
    """A one-line description of an error object or string, or None when there is none."""
    if value is None or value is False or value in ("", {}):
        return None
    if isinstance(value, str):
        return value[:MAX_ERROR_CHARS]
    err = _dict(value)
    parts = [str(err[k]) for k in ("type", "code", "status", "message") if err.get(k) is not None]
    if parts[:1] == ["error"] and len(parts) > 1:
        parts = parts[1:]  # a whole event {"type": "error", ...}: its type says nothing more
    text = ": ".join(parts) if parts else _dumps(value)
    return text[:MAX_ERROR_CHARS]


def _filtered(results: object) -> list[str]:
    """Azure content-filter categories that filtered a choice (`{"hate": {"filtered": true}}`)."""
    return [
        name for name, verdict in _dict(results).items() if _dict(verdict).get("filtered") is True
    ]


def _reasoning_tokens(usage: dict[str, object]) -> int | None:
    """Responses API: usage.output_tokens_details.reasoning_tokens."""
    return _int(_dict(usage.get("output_tokens_details")).get("reasoning_tokens"))


def _text_delta(field: str, text: str, tokens: int | None = None) -> Delta:
    """A Delta with `text` in the named field ("content", "reasoning" or "tool_args")."""
    if field == "reasoning":
        return Delta(reasoning=text, stream_tokens=tokens)
    if field == "tool_args":
        return Delta(tool_args=text, stream_tokens=tokens)
    if tokens is None:
        return content_delta(text, None, False)
    return Delta(content=text, stream_tokens=tokens)


def _is_done(data: str) -> bool:
    return data.strip() == "[DONE]"


# -- parsers ------------------------------------------------------------------------------------


class ApiParser:
    """Turns frames into Deltas for one API; never raises, counts what it could not read."""

    api = "other"

    def __init__(self) -> None:
        self.malformed = 0  # frames whose payload was not what this API sends

    def parse(self, frame: Frame) -> Delta:
        """The Delta of one frame (an empty one when the frame says nothing this parser reads)."""
        data = frame.data
        if data[:1] != "{":  # not the usual JSON object: blank, [DONE], or something else
            if not data.strip():
                return EMPTY
            if _is_done(data):
                return DONE
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self.parse_text(frame)
        try:
            return self.parse_json(doc, frame)
        except Exception:  # a reader bug must cost one event, never the flow
            self.malformed += 1
            return EMPTY

    def parse_text(self, frame: Frame) -> Delta:
        """A payload that is not JSON: malformed for a JSON API."""
        del frame
        self.malformed += 1
        return EMPTY

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        """One decoded JSON payload."""
        raise NotImplementedError


_PLAIN_CHOICE = frozenset({"index", "delta", "finish_reason", "logprobs"})
_PLAIN_DELTA = frozenset({"content", "role"})


def _plain_chat_chunk(doc: dict[str, object]) -> Delta | None:
    """The Delta of the chunk nearly every token arrives in, or None for any other shape.

    One choice whose delta holds only `content` (and perhaps `role`), with no finish reason,
    logprobs, usage, error or vendor fields: the full reader below gives the same Delta for it
    (a test holds the two to that over the corpus), at a third of the cost per event.
    """
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


def _json_object(raw: bytes) -> dict[str, object] | None:
    """An event payload's bytes read as a JSON object, else None (the plain paths below).

    orjson reads the bytes and rejects invalid UTF-8, so a payload this accepts decodes without
    a replacement character or an unfinished sequence, and needs no decoded copy.
    """
    if raw[:1] != b"{":
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return doc if type(doc) is dict else None


def plain_chat_payload(raw: bytes) -> Delta | None:
    """The Delta of one event's payload bytes when they are the common chat chunk (see
    `_plain_chat_chunk`), else None: then the frame goes through `OpenAIChatParser.parse`."""
    doc = _json_object(raw)
    return None if doc is None else _plain_chat_chunk(doc)


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

    api = "openai.chat"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
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

    api = "openai.responses"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
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


def _anthropic_block(doc: dict[str, object], kind: str) -> Delta:
    """The text a content_block_delta or content_block_start event adds (answer, thinking or
    tool input), by its block type."""
    inner = _dict(doc.get("delta") if kind == "content_block_delta" else doc.get("content_block"))
    read = _ANTHROPIC_TEXT.get(_str(inner.get("type")))
    return _text_delta(read[0], _str(inner.get(read[1]))) if read else EMPTY


def plain_anthropic_delta(raw: bytes) -> Delta | None:
    """The Delta of the payload of an event the stream typed `content_block_delta` (Anthropic's
    token event), as `AnthropicParser.parse` gives it; None when the payload is not a JSON object
    of that type: then the frame goes through the full reader."""
    doc = _json_object(raw)
    if doc is None or (_str(doc.get("type")) or "content_block_delta") != "content_block_delta":
        return None
    return _anthropic_block(doc, "content_block_delta")


class AnthropicParser(ApiParser):
    """Anthropic Messages events; usage comes in message_start and (cumulative) message_delta."""

    api = "anthropic.messages"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
        kind = _str(doc.get("type")) or frame.kind
        if kind in ("content_block_delta", "content_block_start"):
            return _anthropic_block(doc, kind)
        if kind in ("message_start", "message"):
            msg = _dict(doc.get("message")) if kind == "message_start" else doc
            return self._usage(
                _dict(msg.get("usage")),
                model=_model(msg.get("model")),
                document=msg if kind == "message" else None,
            )
        if kind == "message_delta":
            return self._usage(_dict(doc.get("usage")))
        if kind == "message_stop":
            return DONE
        if kind == "error" or "error" in doc:
            return Delta(error=_error_text(doc.get("error") or doc) or "error")
        return EMPTY

    @staticmethod
    def _usage(
        usage: dict[str, object],
        *,
        model: str | None = None,
        document: dict[str, object] | None = None,
    ) -> Delta:
        content = reasoning = tools = ""
        if document is not None:  # a whole (non-streamed) message
            for raw in _list(document.get("content")):
                block = _dict(raw)
                content += _str(block.get("text"))
                reasoning += _str(block.get("thinking"))
                if "input" in block:
                    tools += _str(block.get("name")) + _dumps(block.get("input"))
        return Delta(
            content=content,
            reasoning=reasoning,
            tool_args=tools,
            output_tokens_total=_int(usage.get("output_tokens")),
            input_tokens_total=_int(usage.get("input_tokens")),
            model=model,
            terminal=document is not None,
        )


class GeminiParser(ApiParser):
    """Gemini / Vertex `streamGenerateContent?alt=sse` chunks (and the JSON-array form).

    Parts: `text` (`thought: true` is reasoning), `functionCall` and `executableCode` are tool
    calls; `codeExecutionResult` is tool output, not model text. `usageMetadata` is cumulative:
    output = candidatesTokenCount + thoughtsTokenCount. `finishReason` marks the last chunk.
    """

    api = "gemini"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if isinstance(doc, list):  # without alt=sse: one JSON array of chunks
            parts = [self.parse_json(d, frame) for d in doc if isinstance(d, dict)]
            return _merge(parts)
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
        content: list[str] = []
        reasoning: list[str] = []
        tools: list[str] = []
        terminal = False
        for raw in _list(doc.get("candidates")):
            cand = _dict(raw)
            terminal = terminal or bool(cand.get("finishReason"))
            for praw in _list(_dict(cand.get("content")).get("parts")):
                part = _dict(praw)
                text = _str(part.get("text"))
                (reasoning if part.get("thought") is True else content).append(text)
                call = part.get("functionCall")
                if isinstance(call, dict):
                    tools.append(_str(call.get("name")) + _dumps(call.get("args") or {}))
                tools.append(_str(_dict(part.get("executableCode")).get("code")))
        usage = _dict(doc.get("usageMetadata"))
        out_parts = [_int(usage.get("candidatesTokenCount")), _int(usage.get("thoughtsTokenCount"))]
        given = [n for n in out_parts if n is not None]
        error = _error_text(doc.get("error"))
        blocked = _dict(doc.get("promptFeedback")).get("blockReason")
        if error is None and blocked:
            error = f"prompt blocked: {blocked}"
        return Delta(
            content="".join(content),
            reasoning="".join(reasoning),
            tool_args="".join(tools),
            output_tokens_total=sum(given) if given else None,
            input_tokens_total=_int(usage.get("promptTokenCount")),
            reasoning_tokens_total=out_parts[1],
            model=_model(doc.get("modelVersion")),
            terminal=terminal,
            error=error,
        )


class TgiParser(ApiParser):
    """TGI `/generate_stream`: one `token` object per event; special tokens are not visible."""

    api = "tgi"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
        token = _dict(doc.get("token"))
        token_id = token.get("id")
        ids = (token_id,) if isinstance(token_id, int) and not isinstance(token_id, bool) else None
        text = "" if token.get("special") is True else _str(token.get("text"))
        details = _dict(doc.get("details"))
        return Delta(
            content=text,
            stream_tokens=1 if token else None,
            token_ids=ids,
            output_tokens_total=_int(details.get("generated_tokens")),
            terminal=doc.get("generated_text") is not None,
            error=_error_text(doc.get("error")),
        )


class OllamaParser(ApiParser):
    """Ollama `/api/chat` and `/api/generate` NDJSON lines; `done: true` carries eval counts."""

    api = "ollama"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
        msg = _dict(doc.get("message"))
        tools = "".join(
            _str(_dict(_dict(t).get("function")).get("name"))
            + _dumps(_dict(_dict(t).get("function")).get("arguments") or {})
            for t in _list(msg.get("tool_calls"))
        )
        done = doc.get("done") is True
        return Delta(
            content=_str(msg.get("content")) + _str(doc.get("response")),
            reasoning=_str(msg.get("thinking")) + _str(doc.get("thinking")),
            tool_args=tools,
            output_tokens_total=_int(doc.get("eval_count")) if done else None,
            input_tokens_total=_int(doc.get("prompt_eval_count")) if done else None,
            model=_model(doc.get("model")),
            terminal=done,
            error=_error_text(doc.get("error")),
        )


class TokenIdsParser(ApiParser):
    """Token-ID streams (seed "Stream tokens, not text"): ids instead of text.

    A payload is a JSON array of ids (`[15496, 11]`, also what tokenids.PackedIdDecoder emits), or
    an object with `ids` / `token_ids` (array) or `token_id` / `id` (one id), optionally `text`,
    `done: true` or a non-null `finish_reason`. The ids are the event's tokens.
    """

    api = "token_ids"

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        ids = _int_list(doc)
        if ids is not None:
            return Delta(token_ids=ids, stream_tokens=len(ids), ids_visible=True)
        if not isinstance(doc, dict):
            self.malformed += 1
            return EMPTY
        ids = _int_list(doc.get("ids"))
        if ids is None:
            ids = _int_list(doc.get("token_ids"))
        one = doc.get("token_id", doc.get("id"))
        if ids is None and isinstance(one, int) and not isinstance(one, bool):
            ids = (one,)
        usage = _dict(doc.get("usage"))
        return Delta(
            content=_str(doc.get("text")),
            token_ids=ids,
            stream_tokens=len(ids) if ids is not None else None,
            output_tokens_total=_int(usage.get("completion_tokens", usage.get("output_tokens"))),
            model=_model(doc.get("model")),
            terminal=doc.get("done") is True or doc.get("finish_reason") not in (None, ""),
            error=_error_text(doc.get("error")),
            ids_visible=True,
        )


class HeuristicParser(ApiParser):
    """Unknown SSE or NDJSON: text from common keys; a non-JSON payload is itself the text."""

    def __init__(self, api: str = "sse") -> None:
        super().__init__()
        self.api = api

    def parse_text(self, frame: Frame) -> Delta:
        return Delta(content=frame.data)

    def parse_json(self, doc: object, frame: Frame) -> Delta:
        if isinstance(doc, str):
            return Delta(content=doc)
        if not isinstance(doc, dict):
            return EMPTY
        usage = _dict(doc.get("usage"))
        out = usage.get("completion_tokens", usage.get("output_tokens", doc.get("eval_count")))
        return Delta(
            content=_find_text(doc, _HEURISTIC_DEPTH),
            output_tokens_total=_int(out),
            model=_model(doc.get("model")),
            terminal=doc.get("done") is True,
            error=_error_text(doc.get("error")),
        )


def _find_text(value: object, depth: int) -> str:
    """The first string under a common text key, searching dicts and first list items."""
    if depth <= 0:
        return ""
    if isinstance(value, list):
        return _find_text(value[0], depth - 1) if value else ""
    if not isinstance(value, dict):
        return ""
    for key in _TEXT_KEYS:
        found = value.get(key)
        if isinstance(found, str):
            return found
    for key in ("choices", *_TEXT_KEYS):
        found = value.get(key)
        if isinstance(found, dict | list):
            text = _find_text(found, depth - 1)
            if text:
                return text
    return ""


def _merge(parts: list[Delta]) -> Delta:
    """One Delta for several payloads in one frame (last usage and model win)."""
    out_total = [p.output_tokens_total for p in parts if p.output_tokens_total is not None]
    in_total = [p.input_tokens_total for p in parts if p.input_tokens_total is not None]
    models = [p.model for p in parts if p.model]
    errors = [p.error for p in parts if p.error]
    return Delta(
        content="".join(p.content for p in parts),
        reasoning="".join(p.reasoning for p in parts),
        tool_args="".join(p.tool_args for p in parts),
        output_tokens_total=out_total[-1] if out_total else None,
        input_tokens_total=in_total[-1] if in_total else None,
        reasoning_tokens_total=next(
            (p.reasoning_tokens_total for p in reversed(parts) if p.reasoning_tokens_total), None
        ),
        model=models[-1] if models else None,
        terminal=any(p.terminal for p in parts),
        error=errors[0] if errors else None,
    )


_PARSERS: Final[dict[str, type[ApiParser]]] = {
    "openai.chat": OpenAIChatParser,
    "openai.responses": ResponsesParser,
    "anthropic.messages": AnthropicParser,
    "gemini": GeminiParser,
    "tgi": TgiParser,
    "ollama": OllamaParser,
    "token_ids": TokenIdsParser,
}


def make_parser(api: str) -> ApiParser:
    """A fresh parser for one flow speaking `api` (unknown names get the heuristic one)."""
    cls = _PARSERS.get(api)
    return cls() if cls is not None else HeuristicParser(api if api in UNKNOWN_APIS else Api.OTHER)
