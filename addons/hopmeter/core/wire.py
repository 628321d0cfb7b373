"""What a body is: which API it speaks, which model it names, and how it is framed into events.

`detect_api` names the wire format from the request path and the headers of both sides;
`refine_api` sniffs the first payloads when they do not tell (a gateway at `/foo`); `make_framer`
picks the SSE, NDJSON or packed-id framer for the media type, and `is_document` whether a body
that is not an event stream is read as one JSON reply. `sniff_request` reads `model` and `stream`
from the head of a JSON request body. The API name is the *wire format*, not the vendor (see
core/apis/, which reads what each event says).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final, Protocol
from urllib.parse import unquote_plus

import orjson

from hopmeter.core.apis._json import _int_list, _is_int
from hopmeter.core.frames import Frame
from hopmeter.core.ndjson import NdjsonDecoder
from hopmeter.core.packed_ids import PackedIdDecoder, width_bits
from hopmeter.core.sse import SseDecoder
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
# Packed token-ID bodies (see packed_ids.py); octet-stream counts only with an X-Tokenizer header.
PACKED_ID_TYPES: Final = frozenset({"application/x-token-ids", "application/vnd.token-ids"})
# Media types whose body is measured as one document when it is not an event stream: a JSON reply
# (an LLM answer that was not streamed) or an untyped body. Anything else that is not an event
# stream (an image, a download, an HTML page) is timed and counted only: reading a PNG as UTF-8
# text would report U+FFFD and "not streamed" findings for traffic that is no LLM reply at all.
DOCUMENT_TYPES: Final = frozenset({"application/json", ""})

# Path rules, first match wins: (compiled pattern on the lower-cased path without query, api).
# Sources: each API's reference (OpenAI /v1/chat/completions, /v1/completions, /v1/responses and
# GET /v1/responses/{id}?stream=true; Anthropic /v1/messages; Gemini and Vertex
# models/{m}:streamGenerateContent; Ollama /api/chat and /api/generate; TGI /generate_stream).
_PATH_RULES: Final = (
    (re.compile(r"/api/(chat|generate)$"), Api.OLLAMA),
    (
        re.compile(r"/chat/completions$|/v1/completions$|/openai/deployments/[^/]+/completions$"),
        Api.OPENAI_CHAT,
    ),
    (re.compile(r"/responses(/[^/]+)?$"), Api.OPENAI_RESPONSES),
    (re.compile(r"/v1/messages$"), Api.ANTHROPIC_MESSAGES),
    (re.compile(r":(stream)?generatecontent$"), Api.GEMINI),
    (re.compile(r"/generate(_stream)?$"), Api.TGI),
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
# A request body's `model` and `stream` fields, read from a head cut short (not valid JSON).
_MODEL_FIELD: Final = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_STREAM_FIELD: Final = re.compile(rb'"stream"\s*:\s*(true|false)')


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Header names lower-cased (RFC 9110 §5.1: field names are case-insensitive) for lookups.

    When two names differ only in case, the first value wins, as the proxy layer reads them;
    core/ lower-cases a header map here and nowhere else.
    """
    out: dict[str, str] = {}
    for name, value in headers.items():
        out.setdefault(name.lower(), value)
    return out


def detect_api(
    method: str,
    path: str,
    request_headers: Mapping[str, str],
    response_headers: Mapping[str, str],
    content_type: str,
) -> Api:
    """The API a response speaks, from its request path and the headers of both sides.

    A known path wins; then the `anthropic-version` request header; then `X-Tokenizer` (a token-ID
    stream); then the media type ("sse", "ndjson" or "other", which `refine_api` may sharpen).
    """
    del method  # GET /v1/responses/{id} and POST /v1/responses speak the same events
    req = lower_headers(request_headers)
    resp = lower_headers(response_headers)
    media = content_type.split(";", 1)[0].strip().lower()
    route, _, query = path.partition("?")
    route = route.rstrip("/").lower()
    if media in PACKED_ID_TYPES or (media == "application/octet-stream" and "x-tokenizer" in resp):
        return Api.TOKEN_IDS
    for pattern, api in _PATH_RULES:
        if pattern.search(route):
            return api
    if "anthropic-version" in req:
        return Api.ANTHROPIC_MESSAGES
    if "alt=sse" in query.lower() and "/models/" in route:
        return Api.GEMINI
    if "x-tokenizer" in resp:
        return Api.TOKEN_IDS
    if media == EVENT_STREAM:
        return Api.SSE
    if media in NDJSON_TYPES:
        return Api.NDJSON
    return Api.OTHER


def model_from_path(path: str) -> str | None:
    """The model a path names (`/models/{model}:streamGenerateContent`, HF `/models/{org/name}`)."""
    route = path.split("?", 1)[0]
    match = _MODEL_IN_PATH.search(route)
    return match.group(1) if match else None


def refine_api(api: Api, first_frame_data: str) -> Api:
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
            return Api.TOKEN_IDS
        doc = doc[0] if doc and isinstance(doc[0], dict) else None
    if not isinstance(doc, dict):
        return api
    return _sniff(doc) or api


def _sniff(doc: dict[str, object]) -> Api | None:
    kind = doc.get("type")
    if isinstance(kind, str):
        if kind.startswith("response."):
            return Api.OPENAI_RESPONSES
        if kind in _ANTHROPIC_TYPES:
            return Api.ANTHROPIC_MESSAGES
    obj = doc.get("object")
    if obj in ("chat.completion.chunk", "chat.completion", "text_completion") or (
        isinstance(doc.get("choices"), list)
    ):
        return Api.OPENAI_CHAT
    if obj == "response":
        return Api.OPENAI_RESPONSES
    if "candidates" in doc or "usageMetadata" in doc or "promptFeedback" in doc:
        return Api.GEMINI
    token = doc.get("token")
    if isinstance(token, dict) and "id" in token:
        return Api.TGI
    if "done" in doc and ("message" in doc or "response" in doc or "created_at" in doc):
        return Api.OLLAMA
    if _int_list(doc.get("token_ids")) is not None or _int_list(doc.get("ids")) is not None:
        return Api.TOKEN_IDS
    return None


class Framer(Protocol):
    """The shape shared by the SSE, NDJSON and packed-id decoders."""

    def feed(self, data: bytes, now: float) -> list[Frame]: ...

    def close(self, now: float) -> list[Frame]: ...


def make_framer(
    content_type: str,
    api: str,
    headers: Mapping[str, str] | None = None,
    stream_requested: bool | None = None,
) -> Framer | None:
    """The framer for a response's media type, or None when the body is not an event stream
    (`stream_requested`: the request's own `stream` field, when it had one)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == EVENT_STREAM:
        return SseDecoder()
    if media in NDJSON_TYPES or (
        # Ollama's stream may say application/json; its whole reply says so too: asked for
        # (`"stream": false`), or with a length a stream never has
        api == Api.OLLAMA
        and media in ("application/json", "")
        and stream_requested is not False
        and "content-length" not in lower_headers(headers or {})
    ):
        return NdjsonDecoder()
    if api == Api.TOKEN_IDS and media != "application/json":
        return PackedIdDecoder(width_bits(lower_headers(headers or {}), content_type))
    return None


def is_document(content_type: str) -> bool:
    """Whether a body that is not an event stream is read as a JSON document (a whole reply)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media in DOCUMENT_TYPES or media.endswith("+json")


def sniff_request(head: bytes) -> tuple[str | None, bool | None]:
    """The `model` and `stream` fields of a JSON request body, if they are in its head."""
    if not head.lstrip().startswith(b"{"):
        return None, None
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError:
        return _sniff_partial(head)
    if not isinstance(doc, dict):
        return None, None
    model = doc.get("model")
    stream = doc.get("stream")
    return (model if isinstance(model, str) else None, stream if isinstance(stream, bool) else None)


def _sniff_partial(head: bytes) -> tuple[str | None, bool | None]:
    """The fields of a head cut short (not valid JSON), by pattern: the first occurrence of each."""
    model = _MODEL_FIELD.search(head)
    stream = _STREAM_FIELD.search(head)
    return (
        model.group(1).decode("utf-8", "replace") if model else None,
        (stream.group(1) == b"true") if stream else None,
    )


# Request headers that carry a credential, whole or after an auth scheme's name.
CREDENTIAL_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "anthropic-api-key",
        "cookie",
    }
)
MIN_HIDDEN_CHARS: Final = 6  # shorter values ("1", "true") are no secret and would hide words


def credential_values(headers: Iterable[tuple[str, str]], path: str) -> tuple[str, ...]:
    """A request's own secrets, as an upstream may echo them: each credential header's value
    (and what follows its auth scheme, and each cookie's value) and each query value."""
    found: set[str] = set()
    for given, value in headers:
        name = given.lower()
        if name not in CREDENTIAL_HEADERS:
            continue
        found.add(value.strip())
        if name == "cookie":
            found.update(part.partition("=")[2].strip() for part in value.split(";"))
        else:
            found.add(value.strip().partition(" ")[2].strip())  # "Bearer KEY": KEY
    query = path.partition("?")[2]
    found.update(unquote_plus(pair.partition("=")[2]) for pair in query.split("&"))
    found.update(pair.partition("=")[2] for pair in query.split("&"))  # and as sent
    return tuple(v for v in found if len(v) >= MIN_HIDDEN_CHARS)
