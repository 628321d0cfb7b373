"""The OTLP/gRPC receiver of `hopmeter join --serve`, on h2 (no grpcio).

The Collector's load-balancing exporter, the way to route every span of a trace to one join
instance, speaks OTLP/gRPC only (its `protocol` has `otlp` alone), so a join instance takes gRPC
itself rather than needing a Collector beside it. Unary calls of
`/opentelemetry.proto.collector.trace.v1.TraceService/Export` over h2c (what a client with
`tls: insecure: true` sends); each message is a 1-byte compressed flag, a 4-byte big-endian
length and the ExportTraceServiceRequest, with `grpc-encoding` gzip or deflate honoured.
Statuses (opentelemetry-proto docs/specification.md, "OTLP/gRPC Response"): INVALID_ARGUMENT
for data that does not decode, RESOURCE_EXHAUSTED past the size limit (not retried without
RetryInfo), UNAVAILABLE when the receiver's buffers are full (retried), UNIMPLEMENTED for another
method or encoding, DEADLINE_EXCEEDED for a call whose message stopped coming (its buffer is
freed: a connection kept alive by pings or other calls cannot hold it).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import zlib
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from hopmeter.errors import OtlpError
from hopmeter.join import otlp
from hopmeter.join.http import MAX_BUFFERED, Connections, Intake, TooLarge, decompress

EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# gRPC servers take 4 MiB by default; a Collector forwards batches as large as it took in, and
# 128 spans with 1,024-event timelines are ~1.7 MB, so 32 MiB leaves a wide margin.
MAX_MESSAGE = 32 * 2**20
MAX_STREAMS = 16  # concurrent calls per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
MAX_HEADER_LIST_BYTES = 64 * 1024  # h2's default; a call's headers are a few hundred bytes
# Larger DATA frames and windows than h2's 16 KiB and 64 KiB: a 2 MB export in 16 KiB frames is
# 128 frames and as many window updates, each a Python event; the buffer bound still holds.
MAX_FRAME_BYTES = 1 << 20
WINDOW_BYTES = 8 << 20
READ_CHUNK = 256 * 1024
IDLE_TIMEOUT_S = 300.0  # gRPC clients keep connections open between exports
# A call whose message has had no data this long is answered DEADLINE_EXCEEDED and dropped, as
# the HTTP receiver drops a body that trickles (BODY_TIMEOUT_S there).
CALL_TIMEOUT_S = 30.0
GRPC_PREFIX = struct.Struct(">BI")  # compressed flag, message length


class Code:
    """gRPC status codes (grpc/doc/statuscodes.md) the receiver answers with."""

    OK = 0
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    UNAVAILABLE = 14


CODE_NAMES = {
    Code.OK: "OK",
    Code.INVALID_ARGUMENT: "INVALID_ARGUMENT",
    Code.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    Code.RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    Code.UNIMPLEMENTED: "UNIMPLEMENTED",
    Code.UNAVAILABLE: "UNAVAILABLE",
}


@dataclass(slots=True)
class _Call:
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    refused: int | None = None  # a status already sent; the rest of its data is discarded
    moved_s: float = field(default_factory=time.monotonic)  # when its last data came


def export(
    intake: Intake, headers: dict[str, str], body: bytes, max_message: int
) -> tuple[int, str, bytes]:
    """(status, message, response message) for one call's whole request body."""
    if headers.get(":path") != EXPORT_PATH:
        return Code.UNIMPLEMENTED, f"unknown method {headers.get(':path')}", b""
    content_type = headers.get("content-type", "")
    if not content_type.startswith("application/grpc"):
        return Code.INVALID_ARGUMENT, "content-type is not application/grpc", b""
    kind = content_type.partition(";")[0].strip().lower()
    if kind not in ("application/grpc", "application/grpc+proto"):  # +json, +thrift, ...
        return Code.UNIMPLEMENTED, f"content-type {kind}: only protobuf messages are taken", b""
    if len(body) < GRPC_PREFIX.size:
        return Code.INVALID_ARGUMENT, "no gRPC message in the request", b""
    compressed, size = GRPC_PREFIX.unpack_from(body)
    message = body[GRPC_PREFIX.size :]
    if len(message) != size:
        return Code.INVALID_ARGUMENT, "one unary message expected", b""
    if compressed:
        encoding = headers.get("grpc-encoding", "")
        if encoding not in ("gzip", "deflate"):
            return Code.UNIMPLEMENTED, f"grpc-encoding {encoding!r} is not supported", b""
        try:
            message = decompress(message, encoding, max_message)
        except TooLarge:
            return Code.RESOURCE_EXHAUSTED, f"the message is over {max_message} bytes", b""
        except zlib.error as exc:
            return Code.INVALID_ARGUMENT, f"the message does not decompress ({exc})", b""
    try:
        spans = otlp.decode_request(message)
    except OtlpError as exc:
        return Code.INVALID_ARGUMENT, str(exc), b""
    rejected, why = intake.accept(spans)
    return Code.OK, "", otlp.export_response(rejected, why, json=False)


class GrpcReceiver:
    """Serves OTLP/gRPC on connections asyncio hands it (`asyncio.start_server(receiver.serve)`)."""

    def __init__(self, intake: Intake, *, max_message: int = MAX_MESSAGE) -> None:
        self.intake = intake
        self.max_message = max_message
        self.buffered = 0  # bytes of messages being read now, bounded by MAX_BUFFERED
        self.connections = Connections()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One h2c connection, until the client goes away."""
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        conn.update_settings(
            {
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_BYTES,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
            }
        )
        conn.increment_flow_control_window(WINDOW_BYTES)  # the connection's, past the 64 KiB start
        calls: dict[int, _Call] = {}
        self.connections.add(writer)
        try:
            writer.write(conn.data_to_send())
            while True:
                try:
                    data = await asyncio.wait_for(reader.read(READ_CHUNK), _wait_s(calls))
                except TimeoutError:
                    if not calls:
                        return  # idle
                    data = None  # a call may have stalled: looked at below
                if data == b"":
                    return
                answered = False
                for event in conn.receive_data(data) if data else ():
                    answered |= self._on(conn, calls, event)
                self._expire(conn, calls, time.monotonic())
                writer.write(conn.data_to_send())
                await writer.drain()
                if answered:
                    self.intake.settle()
        except (TimeoutError, ConnectionError, h2.exceptions.ProtocolError):
            return
        finally:
            self.connections.remove()
            for call in calls.values():
                self.buffered -= len(call.body)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _on(
        self, conn: h2.connection.H2Connection, calls: dict[int, _Call], event: h2.events.Event
    ) -> bool:
        """Handle one h2 event; True when a call was answered with spans accepted."""
        if isinstance(event, h2.events.RequestReceived):
            calls[event.stream_id] = _Call(headers=dict(event.headers or ()))  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = calls.get(event.stream_id)
            if call is not None and call.refused is None:
                self._grow(conn, event.stream_id, call, event.data or b"")
        elif isinstance(event, h2.events.StreamEnded):
            call = calls.pop(event.stream_id, None)
            if call is None:
                return False
            self.buffered -= len(call.body)
            if call.refused is not None:
                return False
            code, message, response = export(
                self.intake, call.headers, bytes(call.body), self.max_message
            )
            self._reply(conn, event.stream_id, code, message, response)
            return code == Code.OK
        elif isinstance(event, h2.events.StreamReset):
            call = calls.pop(event.stream_id, None)
            if call is not None:
                self.buffered -= len(call.body)
        return False

    def _expire(
        self, conn: h2.connection.H2Connection, calls: dict[int, _Call], now_s: float
    ) -> None:
        """Answer and drop the calls whose message has had no data for CALL_TIMEOUT_S, and tell
        each client to stop sending it (RST_STREAM NO_ERROR after the answer, RFC 9113 8.1)."""
        for stream_id, call in list(calls.items()):
            if now_s - call.moved_s < CALL_TIMEOUT_S:
                continue
            del calls[stream_id]
            self.buffered -= len(call.body)
            if call.refused is None:
                message = f"the request's message stopped coming: no data for {CALL_TIMEOUT_S:g}s"
                self._reply(conn, stream_id, Code.DEADLINE_EXCEEDED, message, b"")
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                conn.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)

    def _grow(
        self, conn: h2.connection.H2Connection, stream_id: int, call: _Call, data: bytes
    ) -> None:
        """Add a DATA frame to a call, refusing it past the message or the buffer bound."""
        call.moved_s = time.monotonic()
        call.body += data
        self.buffered += len(data)
        refused = None
        if len(call.body) > self.max_message + GRPC_PREFIX.size:
            refused = Code.RESOURCE_EXHAUSTED, f"the message is over {self.max_message} bytes"
        elif self.buffered > MAX_BUFFERED:
            refused = Code.UNAVAILABLE, "busy: retry"
        if refused is not None:
            self.buffered -= len(call.body)
            call.body = bytearray()
            call.refused = refused[0]
            self._reply(conn, stream_id, refused[0], refused[1], b"")

    def _reply(
        self,
        conn: h2.connection.H2Connection,
        stream_id: int,
        code: int,
        message: str,
        response: bytes,
    ) -> None:
        self.intake.answered("grpc", CODE_NAMES[code])
        head = [(":status", "200"), ("content-type", "application/grpc")]
        trailers = [("grpc-status", str(code))]
        if message:
            trailers.append(("grpc-message", _percent(message)))
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            if code != Code.OK:  # a trailers-only answer
                conn.send_headers(stream_id, head + trailers, end_stream=True)
                return
            conn.send_headers(stream_id, head)
            conn.send_data(stream_id, GRPC_PREFIX.pack(0, len(response)) + response)
            conn.send_headers(stream_id, trailers, end_stream=True)


def _wait_s(calls: dict[int, _Call]) -> float:
    """How long the next read may wait: until the oldest quiet call is due, else the idle
    timeout."""
    if not calls:
        return IDLE_TIMEOUT_S
    due = min(call.moved_s for call in calls.values()) + CALL_TIMEOUT_S
    return max(due - time.monotonic(), 0.001)


def _percent(message: str) -> str:
    """grpc-message's percent-encoding (gRPC over HTTP2: printable ASCII but %, else %XX)."""
    out = []
    for byte in message[:400].encode():
        out.append(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}")
    return "".join(out)
