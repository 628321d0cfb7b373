"""A plain OpenAI-compatible chat server that knows nothing of hopmeter, for probe tests.

    with PlainUpstream(words=40, rate=40, key="sk-test") as up:
        f"http://127.0.0.1:{up.port}/v1/chat/completions"

What an ordinary model server does: `GET /v1/models` lists its models, `POST /v1/chat/completions`
streams a reply (role prelude, one chunk per word on its own clock, finish, usage when asked,
`[DONE]`) whatever the prompt, and a wrong key gets a 401 whose message quotes it, as some
providers do. No scenario header is read and no hopmeter header is sent: to the probe it is any
origin. Real sockets on loopback, served from a thread (tests/harness/scripted.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Self

import orjson

from tests.harness.scripted import Exchange, ScriptedUpstream

WORDS = ("The", " cat", " 🐱", " naps", " in", " 東京", " while", " the", " sun", " 🌞")
MODEL = "plain-chat-1"
PREFILL_S = 0.05  # the wait before the first event, as a model's prefill


class PlainUpstream:
    """The server; `models` are what /v1/models lists, `key` what it insists on (if any)."""

    def __init__(
        self,
        *,
        words: int = 40,
        rate: float = 40.0,
        key: str = "",
        models: tuple[str, ...] = (MODEL,),
    ) -> None:
        self.words = words
        self.rate = rate
        self.key = key
        self.models = models
        self._server = ScriptedUpstream(self._handle)

    @property
    def port(self) -> int:
        """The port it listens on, on 127.0.0.1."""
        return self._server.port

    @property
    def requests(self) -> list[Exchange]:
        """Every request it got, in order."""
        return self._server.requests

    def __enter__(self) -> Self:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    async def _handle(self, ex: Exchange) -> None:
        given = ex.headers.get("authorization", "").removeprefix("Bearer ")
        if self.key and given != self.key:
            error = {"error": {"message": f"Incorrect API key provided: {given}"}}
            return await _document(ex, 401, error)
        if ex.method == "GET" and ex.path == "/v1/models":
            listed = [{"id": m, "object": "model", "owned_by": "plain"} for m in self.models]
            return await _document(ex, 200, {"object": "list", "data": listed})
        if ex.method != "POST" or ex.path != "/v1/chat/completions":
            return await _document(ex, 404, {"error": {"message": f"no route {ex.path}"}})
        request = orjson.loads(ex.body)
        await self._stream(ex, request)
        return None

    async def _stream(self, ex: Exchange, request: dict[str, object]) -> None:
        model = str(request.get("model"))
        await ex.head({"content-type": "text/event-stream", "cache-control": "no-cache"})
        await asyncio.sleep(PREFILL_S)
        await ex.chunk(_event(_chunk(model, {"role": "assistant", "content": ""})))
        start = time.monotonic()
        for i in range(self.words):
            await asyncio.sleep(max(0.0, start + i / self.rate - time.monotonic()))
            await ex.chunk(_event(_chunk(model, {"content": WORDS[i % len(WORDS)]})))
        await ex.chunk(_event(_chunk(model, {}, finish="stop")))
        options = request.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = {"prompt_tokens": 30, "completion_tokens": self.words, "total_tokens": 70}
            await ex.chunk(_event({**_chunk(model, {}), "choices": [], "usage": usage}))
        await ex.chunk(b"data: [DONE]\n\n")
        await ex.end()


def _chunk(model: str, delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-plain",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _event(doc: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def _document(ex: Exchange, status: int, doc: dict[str, object]) -> None:
    body = orjson.dumps(doc)
    head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    ex.writer.write(head.encode() + b"\r\n\r\n" + body)
    await ex.writer.drain()
