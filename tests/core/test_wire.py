"""Tests for hopmeter.core.wire: which API a body speaks, its model, its framer, its request."""

from __future__ import annotations

import pytest

from hopmeter.core.ndjson import NdjsonDecoder
from hopmeter.core.packed_ids import PackedIdDecoder
from hopmeter.core.sse import SseDecoder
from hopmeter.core.wire import (
    credential_values,
    detect_api,
    is_document,
    lower_headers,
    make_framer,
    model_from_path,
    refine_api,
    sniff_request,
)
from tests.harness.corpus import CASES, corpus_frames, needs_corpus, refined

SSE = {"content-type": "text/event-stream"}
NDJSON = {"content-type": "application/x-ndjson"}


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


def test_lower_headers_first_value_wins():
    """Names are lower-cased, and of two names that differ only in case the first value wins."""
    headers = {"Content-Type": "text/event-stream", "X-Tokenizer": "r50k_base", "x-tokenizer": "o"}
    assert lower_headers(headers) == {
        "content-type": "text/event-stream",
        "x-tokenizer": "r50k_base",
    }
    assert lower_headers({}) == {}


@pytest.mark.parametrize(
    ("content_type", "api", "headers", "framer"),
    [
        ("text/event-stream; charset=utf-8", "openai.chat", {}, SseDecoder),
        ("Text/Event-Stream", "sse", {}, SseDecoder),
        ("application/x-ndjson", "ndjson", {}, NdjsonDecoder),
        ("application/json", "ollama", {}, NdjsonDecoder),
        ("", "ollama", {}, NdjsonDecoder),
        # Ollama's whole reply ("stream": false) has a length: one document, no stream
        ("application/json; charset=utf-8", "ollama", {"Content-Length": "437"}, type(None)),
        ("application/octet-stream", "token_ids", {"X-Token-Id-Width": "16"}, PackedIdDecoder),
        ("application/json", "openai.chat", {}, type(None)),
        ("application/json", "token_ids", {}, type(None)),
        ("image/png", "other", {}, type(None)),
    ],
)
def test_make_framer_by_media_type(content_type, api, headers, framer):
    """Event streams get the SSE or NDJSON framer, packed ids theirs, anything else none."""
    assert type(make_framer(content_type, api, headers)) is framer


def test_an_ollama_reply_asked_whole_is_a_document_whatever_its_framing():
    """`"stream": false` asks Ollama for one document, sent chunked when it is long: no stream."""
    assert make_framer("application/json", "ollama", {}, stream_requested=False) is None
    assert type(make_framer("application/json", "ollama", {}, True)) is NdjsonDecoder
    assert type(make_framer("application/x-ndjson", "ollama", {}, False)) is NdjsonDecoder


def test_packed_framer_reads_its_width_from_any_case_of_header():
    """A packed body's width header counts whatever the case of its name."""
    framer = make_framer("application/octet-stream", "token_ids", {"X-Token-Id-Width": "16"})
    assert isinstance(framer, PackedIdDecoder) and framer.width == 16


@pytest.mark.parametrize(
    ("content_type", "document"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("application/problem+json", True),
        ("", True),
        ("text/html", False),
        ("image/png", False),
    ],
)
def test_is_document(content_type: str, document: bool):
    """JSON replies and untyped bodies are read as one document; other media are only timed."""
    assert is_document(content_type) is document


@pytest.mark.parametrize(
    ("head", "model", "stream"),
    [
        (b'{"model": "gpt-4o", "stream": true, "messages": []}', "gpt-4o", True),
        (b'  {"stream": false, "model": "m"}', "m", False),
        (b'{"messages": []}', None, None),
        (b'{"model": 4, "stream": "yes"}', None, None),
        (b'{"model": "", "stream": null}', "", None),
        (b"[1, 2]", None, None),
        (b"model=gpt-4o&stream=true", None, None),
        (b"", None, None),
    ],
)
def test_sniff_request_reads_a_whole_body(head: bytes, model: str | None, stream: bool | None):
    """A JSON object body gives its string `model` and boolean `stream`; anything else, None."""
    assert sniff_request(head) == (model, stream)


@pytest.mark.parametrize(
    ("head", "model", "stream"),
    [
        (b'{"model": "llama-3", "stream": true, "messages": [{"role": "us', "llama-3", True),
        (b'{"stream":false,"model":"m","messages":[', "m", False),
        (b'{"messages": [{"content": "a very long prompt', None, None),
        (b'{"model": "caf\xc3', None, None),
        (b'{"model": "caf\xff\xfe", "mess', "caf\ufffd\ufffd", None),
    ],
)
def test_sniff_request_reads_a_head_cut_short(head: bytes, model: str | None, stream: bool | None):
    """A body cut at the sniffing bound still gives the fields that arrived whole."""
    assert sniff_request(head) == (model, stream)


def test_a_requests_credentials_are_its_keys_tokens_cookies_and_query_values() -> None:
    """What an upstream could echo of a request's secrets: each credential header whole and
    after its scheme, each cookie's value, each query value (decoded and as sent); short values
    and other headers are not secrets."""
    headers = [
        ("Authorization", "Bearer tok-123456"),
        ("X-Api-Key", "xkey-abcdef"),
        ("Cookie", "sid=cookie-9876; theme=dark"),
        ("User-Agent", "openai-python/1.0"),
        ("api-key", "1"),
    ]
    hidden = set(credential_values(headers, "/v1/x?key=AIza%2Bq1234&stream=true"))
    assert hidden == {
        "Bearer tok-123456",
        "tok-123456",
        "xkey-abcdef",
        "sid=cookie-9876; theme=dark",
        "cookie-9876",
        "AIza+q1234",
        "AIza%2Bq1234",
    }
    assert credential_values([], "/v1/chat/completions") == ()
