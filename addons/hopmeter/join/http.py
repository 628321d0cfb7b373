"""The OTLP/HTTP receiver of `hopmeter join --serve` (asyncio and h11).

What it answers (opentelemetry-proto docs/specification.md, "OTLP/HTTP"):
- `POST /v1/traces` only: 404 for another path, 405 for another method.
- `Content-Type` application/x-protobuf or application/json (parameters ignored), else 415.
- `Content-Encoding` gzip, deflate or none, else 415 (the Collector answers 400 here; 415 is
  the HTTP answer for an encoding the server does not take, RFC 9110 §15.5.16).
- A body over `max_body` bytes, on the wire or once decompressed: 413, and the client must not
  retry. A 413 answered before the body was read is followed by reading and discarding what the
  client still sends, for a while, before closing: a close under the client's upload resets it,
  and a client that sees a reset instead of the 413 retries.
- A body that does not decompress or decode: 400, with a google.rpc.Status in the request's
  encoding.
- 200 with an ExportTraceServiceResponse; spans refused as absurd are reported in
  partial_success (rejected_spans, error_message), which the client must not retry.
- More bodies in flight than the byte budget allows: 503 with Retry-After, which clients retry
  (followed, as an early 413 is, by reading and discarding the body a while before closing).
The answer goes out before any alignment: OTLP's 200 means accepted, not processed, and a slow
answer past the exporter's deadline would make it retry (duplicates) and then drop spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

import h11

from hopmeter.core import otlp_json
from hopmeter.core.spans import SpanView
from hopmeter.errors import OtlpError
from hopmeter.join import otlp

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TRACES_PATH = "/v1/traces"
MAX_BODY = 20 * 2**20  # the spec: "It is RECOMMENDED to use 20 MiB as the default limit"
# Bodies being read at once, in bytes; past it a new one gets 503 Retry-After. Bounds the
# receiver's buffers whatever the number of senders.
MAX_BUFFERED = 64 * 2**20
MAX_HEADER_BYTES = 64 * 1024  # h11's bound on a request head
READ_CHUNK = 256 * 1024
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection with nothing to say is closed after this
BODY_TIMEOUT_S = 30.0  # a body that trickles slower than this (one read) is dropped
LINGER_S = 2.0  # reading and discarding after an early 413, before closing
LINGER_MAX_BYTES = 64 * 2**20
RETRY_AFTER_S = "1"
# google.rpc.Code values carried in Status.code (clients log them; the HTTP status decides)
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE = 3, 8, 14


class Intake(Protocol):
    """Where received spans go (the join service)."""

    def accept(self, spans: list[SpanView]) -> tuple[int, str]:
        """File the spans; (spans rejected, why) for partial_success."""

    def settle(self) -> None:
        """Do the work the accepted spans made ready (after the answer is sent)."""

    def answered(self, transport: str, status: str) -> None:
        """Count one request answered with `status`."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


class TooLarge(Exception):
    """A body past the limit, on the wire or decompressed."""


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The decoded body, never more than `limit` bytes (TooLarge past it: a zip bomb stops here).

    LookupError for an encoding other than gzip, deflate (zlib-wrapped as RFC 9110 says, raw
    deflate as some clients send it) and identity; zlib.error for a broken or cut body.
    """
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS
    else:
        raise LookupError(encoding)
    decoder = zlib.decompressobj(wbits)
    out = decoder.decompress(body, limit + 1)
    if len(out) > limit or decoder.unconsumed_tail:
        raise TooLarge
    if not decoder.eof:
        raise zlib.error("the compressed body is cut short")
    return out


def _status(code: int, grpc_code: int, message: str, *, json: bool) -> Answer:
    kind = JSON if json else PROTOBUF
    body = otlp.status_body(grpc_code, message, json=json)
    return Answer(code, (("content-type", kind),), body)


def _text(code: int, message: str, *extra: tuple[str, str]) -> Answer:
    return Answer(code, (("content-type", "text/plain; charset=utf-8"), *extra), message.encode())


def answer(
    intake: Intake,
    method: str,
    path: str,
    *,
    headers: dict[str, str],
    body: bytes,
    max_body: int,
) -> Answer:
    """The answer to one whole request."""
    if path.split("?", 1)[0] != TRACES_PATH:
        return _text(404, f"not found: OTLP traces go to POST {TRACES_PATH}")
    if method != "POST":
        return _text(405, "method not allowed: POST only", ("allow", "POST"))
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        return _text(415, f"unsupported media type {kind!r}: send {PROTOBUF} or {JSON}")
    json = kind == JSON
    encoding = headers.get("content-encoding", "").strip().lower()
    try:
        raw = decompress(body, encoding, max_body)
    except LookupError:
        return _text(415, f"unsupported content-encoding {encoding!r}: send gzip, deflate or none")
    except TooLarge:
        message = f"the decompressed body is over {max_body} bytes; send smaller batches"
        return _status(413, RESOURCE_EXHAUSTED, message, json=json)
    except zlib.error as exc:
        return _status(400, INVALID_ARGUMENT, f"the body does not decompress ({exc})", json=json)
    try:
        spans = otlp_json.decode_body(raw) if json else otlp.decode_request(raw)
    except OtlpError as exc:
        return _status(400, INVALID_ARGUMENT, str(exc), json=json)
    rejected, why = intake.accept(spans)
    return Answer(200, (("content-type", kind),), otlp.export_response(rejected, why, json=json))


class HttpReceiver:
    """Serves OTLP/HTTP on connections asyncio hands it (`asyncio.start_server(receiver.serve)`)."""

    def __init__(self, intake: Intake, *, max_body: int = MAX_BODY) -> None:
        self.intake = intake
        self.max_body = max_body
        self.buffered = 0  # bytes of bodies being read now, bounded by MAX_BUFFERED
        self.connections = Connections()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests in turn until the client closes or a request ends it."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.connections.add(writer)
        try:
            while await self._one(conn, reader, writer):
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, ConnectionError, TimeoutError):
            if not self.connections.closing:
                self.intake.answered("http", "bad_http")
        finally:
            self.connections.remove()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Read, answer and settle one request; False when the connection should close."""
        request = await _next_event(conn, reader, IDLE_TIMEOUT_S)
        if not isinstance(request, h11.Request):
            return False
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        length = headers.get("content-length", "")
        declared = int(length) if length.isascii() and length.isdigit() else 0
        if declared > self.max_body:
            message = f"the body of {declared} bytes is over {self.max_body}; send smaller batches"
            json = headers.get("content-type", "").startswith(JSON)
            await self._send(conn, writer, _status(413, RESOURCE_EXHAUSTED, message, json=json))
            await _linger(reader, writer)
            return False
        if self.buffered + declared > MAX_BUFFERED:
            await self._send(
                conn, writer, _text(503, "busy: retry", ("retry-after", RETRY_AFTER_S))
            )
            await _linger(reader, writer)  # as after an early 413: the client reads the 503
            return False
        body = await self._body(conn, reader)
        if body is None:
            message = f"the body is over {self.max_body} bytes; send smaller batches"
            await self._send(conn, writer, _status(413, RESOURCE_EXHAUSTED, message, json=False))
            await _linger(reader, writer)
            return False
        method, path = request.method.decode("latin-1"), request.target.decode("latin-1")
        reply = answer(
            self.intake, method, path, headers=headers, body=body, max_body=self.max_body
        )
        await self._send(conn, writer, reply)
        self.intake.settle()
        return conn.our_state is h11.IDLE or conn.our_state is h11.DONE

    async def _body(self, conn: h11.Connection, reader: asyncio.StreamReader) -> bytes | None:
        """The request's body; None past max_body (a chunked body need not declare its size)."""
        body = bytearray()
        try:
            while True:
                event = await _next_event(conn, reader, BODY_TIMEOUT_S)
                if isinstance(event, h11.Data):
                    body += event.data
                    self.buffered += len(event.data)
                    if len(body) > self.max_body:
                        return None
                elif isinstance(event, h11.EndOfMessage):
                    return bytes(body)
                else:
                    raise ConnectionError("the connection ended inside a request body")
        finally:
            self.buffered -= len(body)

    async def _send(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, reply: Answer
    ) -> None:
        self.intake.answered("http", str(reply.status))
        headers = [*reply.headers, ("content-length", str(len(reply.body)))]
        if reply.status in (413, 503):
            headers.append(("connection", "close"))
        writer.write(conn.send(h11.Response(status_code=reply.status, headers=headers)))
        writer.write(conn.send(h11.Data(data=reply.body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


class Connections:
    """The connections a receiver serves, so that a stopping service can close them and let each
    handler end on its own: a handler cancelled by the loop's end leaves a CancelledError
    traceback on stderr (Python 3.12.1's asyncio reports it from the stream's callback)."""

    def __init__(self) -> None:
        self._open: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.closing = False

    def add(self, writer: asyncio.StreamWriter) -> None:
        """The running handler serves `writer`'s connection."""
        task = asyncio.current_task()
        if task is not None:
            self._open[task] = writer

    def remove(self) -> None:
        """The running handler is done with its connection."""
        task = asyncio.current_task()
        if task is not None:
            self._open.pop(task, None)

    async def close(self, timeout_s: float) -> None:
        """Close every connection (each handler reads its end) and wait for the handlers; one
        still running after `timeout_s` is cancelled."""
        self.closing = True
        for writer in list(self._open.values()):
            writer.close()
        tasks = list(self._open)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()


async def _next_event(
    conn: h11.Connection, reader: asyncio.StreamReader, timeout_s: float
) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await asyncio.wait_for(reader.read(READ_CHUNK), timeout_s)
        conn.receive_data(data)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read and discard what the client still sends, for LINGER_S at most, then let it close."""
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_S
    drained = 0
    with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
        while drained < LINGER_MAX_BYTES and (left := deadline - loop.time()) > 0:
            chunk = await asyncio.wait_for(reader.read(READ_CHUNK), left)
            if not chunk:
                return
            drained += len(chunk)
