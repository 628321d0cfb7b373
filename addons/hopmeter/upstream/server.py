"""The demo upstream: a synthetic LLM server on a token clock (OpenAI, Anthropic, Ollama).

It is a small HTTP/1.1 server on asyncio so that it controls exactly what goes on the wire: one
chunk per event, flushed, at the time the token clock says, and every fault a real path produces
(coalescing, stalls, gzip, whole-body buffering, CRLF, split characters, errors, cut connections).
It keeps a log of when it sent each event, so tests can compare what hopmeter measured against
what was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import random
import socket
import ssl
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from importlib.resources import files
from urllib.parse import parse_qsl, urlsplit

import orjson

from hopmeter.errors import ScenarioError
from hopmeter.upstream import formats
from hopmeter.upstream.replay import Transcript
from hopmeter.upstream.scenario import Scenario, from_request

# Requests larger than this are refused: the demo upstream only needs chat requests.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
# The send log keeps the most recent requests only.
MAX_LOGGED_REQUESTS = 2048
_ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
# The demo chat page (hopmeter/data/browser/): a good client and each bad one, for `hopmeter demo
# --browser`; the page loads hopmeter's snippet, which a proxy running with --browser serves.
DEMO_PAGES = {
    "/demo": ("demo.html", "text/html; charset=utf-8"),
    "/demo/": ("demo.html", "text/html; charset=utf-8"),
    "/demo/demo.js": ("demo.js", "text/javascript; charset=utf-8"),
}


@dataclass(slots=True)
class SendLog:
    """When each event of one reply left the upstream (wall clock, epoch seconds)."""

    request_id: str
    api: str
    t_request: float
    events: list[tuple[float, int, int]] = field(default_factory=list)  # (t, tokens, bytes)
    tokens: int = 0

    def as_json(self) -> dict[str, object]:
        """The log as a JSON-ready dict."""
        first = next((t for t, k, _ in self.events if k), None)
        return {
            "request_id": self.request_id,
            "api": self.api,
            "t_request": self.t_request,
            "t_first_token": first,
            "tokens": self.tokens,
            "events": [list(e) for e in self.events],
        }


class Request:
    """A parsed HTTP/1.1 request."""

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        parts = urlsplit(target)
        self.path = parts.path
        self.query = dict(parse_qsl(parts.query))
        self.headers = headers
        self.body = body

    def json(self) -> dict[str, object]:
        """The body as a JSON object ({} when it is not one)."""
        try:
            doc = orjson.loads(self.body) if self.body else {}
        except orjson.JSONDecodeError:
            return {}
        return doc if isinstance(doc, dict) else {}


class UpstreamServer:
    """The server; `start()` binds, `serve_forever()` runs until cancelled."""

    def __init__(
        self, scenario: Scenario | None = None, transcripts: dict[str, Transcript] | None = None
    ) -> None:
        self.scenario = scenario or Scenario()
        self.transcripts = transcripts or {}
        self.logs: OrderedDict[str, SendLog] = OrderedDict()
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Bind and return the port (useful with port 0); HTTPS when given a TLS context."""
        self._server = await asyncio.start_server(self._handle, host, port, ssl=tls)
        return int(self._server.sockets[0].getsockname()[1])

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                keep = await self._respond(req, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _respond(self, req: Request, w: asyncio.StreamWriter) -> bool:
        if req.path.startswith("/_hopmeter/sends/"):
            log = self.logs.get(req.path.rsplit("/", 1)[1])
            if log is None:
                await _plain(w, 404, b"unknown request id\n")
            else:
                await _plain(w, 200, orjson.dumps(log.as_json()), "application/json")
            return True
        if req.method == "GET" and req.path in ("/", "/healthz"):
            await _plain(
                w,
                200,
                b"hopmeter demo upstream: POST /v1/chat/completions, "
                b"/v1/messages, /api/chat, /api/generate; a chat page at GET /demo/\n",
            )
            return True
        if req.method == "GET" and req.path in DEMO_PAGES:
            name, ctype = DEMO_PAGES[req.path]
            page = (files("hopmeter") / "data" / "browser" / name).read_bytes()
            await _plain(w, 200, page, ctype, {"cache-control": "no-store"})
            return True
        if req.method == "GET" and req.path.rstrip("/") == "/v1/models":
            body = {"object": "list", "data": [{"id": "demo-1", "object": "model"}]}
            await _plain(w, 200, orjson.dumps(body), "application/json")
            return True
        try:
            scenario = from_request(
                self.scenario, req.query, req.headers.get("x-hopmeter-scenario")
            )
        except ScenarioError as exc:
            await _plain(w, 400, f"{exc}\n".encode())
            return True
        api = "replay" if scenario.replay else _api_for(req.path)
        if api is None or req.method != "POST":
            await _plain(
                w,
                404,
                b"not found: POST to /v1/chat/completions, /v1/messages, "
                b"/api/chat or /api/generate (any path with ?replay=NAME)\n",
            )
            return True
        return await self._reply(req, w, api, scenario)

    async def _reply(self, req: Request, w: asyncio.StreamWriter, api: str, s: Scenario) -> bool:
        doc = req.json()
        model = str(doc.get("model") or "demo-1")
        streamed = s.stream if s.stream is not None else bool(doc.get("stream", api == "ollama"))
        rid = str(next(self._ids))
        log = SendLog(request_id=rid, api=api, t_request=time.time())
        self.logs[rid] = log
        while len(self.logs) > MAX_LOGGED_REQUESTS:
            self.logs.popitem(last=False)
        if s.replay:
            transcript = self.transcripts.get(s.replay)
            if transcript is None:
                await _plain(
                    w, 400, f"no transcript named {s.replay!r} was loaded with --replay\n".encode()
                )
                return True
            plan = transcript.plan()
            ctype = transcript.content_type
        elif not streamed:
            await asyncio.sleep(s.ttft_s + sum(s.intervals()))
            if api == "anthropic":
                body = formats.anthropic_document(s, model)
            elif api == "ollama":
                body = formats.ollama_document(s, model, generate=req.path.endswith("/generate"))
            else:
                body = formats.openai_document(s, model)
            log.tokens = s.total_tokens
            log.events.append((time.time(), s.total_tokens, len(body)))
            await _plain(w, 200, body, "application/json", _own_headers(req, rid))
            return True
        else:
            plan, ctype = _plan(api, s, model, doc, req.path)
        return await self._stream(w, s, plan, ctype, log, own=_own_headers(req, rid))

    async def _stream(
        self,
        w: asyncio.StreamWriter,
        s: Scenario,
        plan: list[formats.Planned],
        ctype: str,
        log: SendLog,
        *,
        own: dict[str, str],
    ) -> bool:
        headers = {"content-type": ctype, **own}
        if s.headers == "good":
            headers["cache-control"] = "no-cache, no-transform"
            headers["x-accel-buffering"] = "no"
        compressor = None
        if s.gzip or s.gzip_flush:
            headers["content-encoding"] = "gzip"
            compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        ending = _ENDINGS[s.line_ending]
        if s.buffered:
            # like a body-hashing middleware: nothing leaves before the whole body is hashed
            body = bytearray()
            async for event in _clock(s, plan):
                piece = event.body.replace(b"\n", ending) if ending != b"\n" else event.body
                body += piece
                log.tokens += event.tokens
            data = bytes(body)
            if compressor is not None:
                data = compressor.compress(data) + compressor.flush()
            headers["etag"] = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
            await _plain(w, 200, data, ctype, headers)
            log.events.append((time.time(), log.tokens, len(data)))
            return True
        head = (
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "\r\n"
        )
        w.write(head.encode())
        await w.drain()
        sent = 0
        index = 0
        async for event in _clock(s, plan):
            piece = event.body.replace(b"\n", ending) if ending != b"\n" else event.body
            if s.cut_at >= 0 and sent >= s.cut_at:
                w.transport.abort()
                return False
            if compressor is not None:
                piece = compressor.compress(piece)
                if s.gzip_flush:
                    piece += compressor.flush(zlib.Z_SYNC_FLUSH)
            parts = _split(piece, s.split_cuts, f"{s.seed}:{index}") if s.split_writes else [piece]
            index += 1
            t_sent = await _write_chunks(w, parts)
            sent += event.tokens
            log.tokens += event.tokens
            log.events.append((t_sent, event.tokens, len(piece)))
            if event.error:
                break
        if compressor is not None:
            tail = compressor.flush()
            if tail:
                w.write(b"%x\r\n%s\r\n" % (len(tail), tail))
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True


def _own_headers(req: Request, request_id: str) -> dict[str, str]:
    """The headers that name this upstream in a reply: the request id for its send log, and the
    scenario header it played, echoed, so a client can tell its scenario reached the upstream."""
    own = {"x-hopmeter-request-id": request_id}
    played = req.headers.get("x-hopmeter-scenario")
    if played is not None:
        own["x-hopmeter-scenario"] = played
    return own


async def _write_chunks(w: asyncio.StreamWriter, parts: list[bytes]) -> float:
    """Write an event's pieces as HTTP/1.1 chunks; when its last piece went to the socket.

    The time is read just before that write: no hop downstream can see the event earlier (a stamp
    after the write could come after the read). An empty piece is skipped: an empty chunk would
    end the body, and a compressor holding everything writes nothing.
    """
    t_sent = time.time()
    for i, part in enumerate(p for p in parts if p):
        if i:
            await asyncio.sleep(0.005)  # apart, so they arrive as separate reads
        t_sent = time.time()
        w.write(b"%x\r\n%s\r\n" % (len(part), part))
        await w.drain()
    return t_sent


async def _clock(s: Scenario, plan: list[formats.Planned]):  # type: ignore[no-untyped-def]
    """Yield each planned event when the token clock reaches its last token."""
    intervals = s.intervals()
    due = [0.0]
    for gap in intervals:
        due.append(due[-1] + gap)
    await asyncio.sleep(s.ttft_s)
    start: float | None = None
    for event in plan:
        if event.last_token is not None:
            if start is None:
                await asyncio.sleep(s.prelude_s)
                start = time.monotonic()
            i = event.last_token
            # replayed transcripts can be longer than the scenario's reply: the clock runs on
            at = due[i] if i < len(due) else due[-1] + (i - len(due) + 1) / s.rate
            wait = start + at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        yield event


def _plan(
    api: str, s: Scenario, model: str, doc: dict[str, object], path: str
) -> tuple[list[formats.Planned], str]:
    if api == "anthropic":
        plan, error = formats.anthropic_messages(s, model), formats.anthropic_error()
        ctype = "text/event-stream; charset=utf-8"
    elif api == "ollama":
        plan = formats.ollama_chat(s, model, generate=path.endswith("/generate"))
        error, ctype = formats.ollama_error(), "application/x-ndjson"
    else:
        opts = doc.get("stream_options")
        include = isinstance(opts, dict) and bool(opts.get("include_usage"))
        plan, error = formats.openai_chat(s, model, include or s.usage), formats.openai_error()
        ctype = "text/event-stream; charset=utf-8"
    if s.error_at >= 0:
        kept, seen = [], 0
        for event in plan:
            if event.last_token is not None and seen >= s.error_at:
                break
            kept.append(event)
            seen += event.tokens
        plan = [*kept, error]
    return plan, ctype


def _split(piece: bytes, cuts: int, seed: str) -> list[bytes]:
    """Cut an event in pieces: at `cuts` random offsets, else once inside a character if any."""
    if cuts > 0 and len(piece) > 1:
        rng = random.Random(seed)  # repeatable per event
        offsets = sorted(rng.sample(range(1, len(piece)), min(cuts, len(piece) - 1)))
        bounds = [0, *offsets, len(piece)]
        return [piece[a:b] for a, b in itertools.pairwise(bounds)]
    for i, b in enumerate(piece):
        if b >= 0xC0 and i + 1 < len(piece):
            return [piece[: i + 1], piece[i + 1 :]]
    mid = len(piece) // 2
    return [p for p in (piece[:mid], piece[mid:]) if p]


def _api_for(path: str) -> str | None:
    if path.endswith("/chat/completions"):
        return "openai"
    if path.endswith("/messages"):
        return "anthropic"
    if path in ("/api/chat", "/api/generate"):
        return "ollama"
    return None


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError as exc:
        raise ValueError("request head too large") from exc
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            total += size
            if total > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n > MAX_REQUEST_BYTES:
            raise ValueError("request too large")
        body = await reader.readexactly(n)
    return Request(method, target, headers, body)


async def _plain(
    w: asyncio.StreamWriter,
    status: int,
    body: bytes,
    ctype: str = "text/plain; charset=utf-8",
    extra: dict[str, str] | None = None,
) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
    headers = {"content-type": ctype, "content-length": str(len(body))}
    headers.update(extra or {})
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    )
    w.write(head.encode() + body)
    await w.drain()
