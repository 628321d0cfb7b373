"""An in-test HTTP/2 upstream in TLS (ALPN h2) whose responses are scripted frame by frame, run
on its own thread.

Real sockets on loopback; the h2 library frames what the test asks for (DATA with or without
padding or the stream's end, trailers, resets), and the test decides which frames go out in
one write and when: several streams' frames interleaved in one write, a frame cut across
writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from tests.harness.scripted import ScriptedUpstream

H2Handler = Callable[["H2Exchange"], Awaitable[None]]


@dataclass
class H2Connection:
    """One connection from the proxy: its h2 state and its writer."""

    h2: h2.connection.H2Connection
    writer: asyncio.StreamWriter
    exchanges: dict[int, H2Exchange] = field(default_factory=dict)  # by stream id
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set at each new request

    async def flush(self, cut_at: int | None = None) -> None:
        """Write what h2 framed so far as one write (the first `cut_at` bytes only, the rest
        kept for the next flush), and drain."""
        out = self.h2.data_to_send()
        if cut_at is not None:
            out, rest = out[:cut_at], out[cut_at:]
            self.h2._data_to_send += rest  # the library's send buffer: sent by the next flush
        self.writer.write(out)
        await self.writer.drain()


@dataclass
class H2Exchange:
    """One request (a stream) and the means to answer it frame by frame."""

    stream_id: int
    path: str
    headers: dict[str, str]
    conn: H2Connection

    def head(self, headers: dict[str, str] | None = None, status: int = 200) -> None:
        """Frame the response's HEADERS (text/event-stream unless `headers` say otherwise)."""
        fields = {"content-type": "text/event-stream", **(headers or {})}
        self.conn.h2.send_headers(
            self.stream_id, [(":status", str(status)), *fields.items()], end_stream=False
        )

    def data(self, payload: bytes, *, end: bool = False, pad: int | None = None) -> None:
        """Frame one DATA frame (`pad`: that many bytes of padding; `end`: the stream's end)."""
        self.conn.h2.send_data(self.stream_id, payload, end_stream=end, pad_length=pad)

    def trailers(self, fields: dict[str, str]) -> None:
        """Frame trailers: HEADERS that end the stream."""
        self.conn.h2.send_headers(self.stream_id, list(fields.items()), end_stream=True)

    def reset(self, code: int = 2) -> None:
        """Frame a RST_STREAM (INTERNAL_ERROR by default)."""
        self.conn.h2.reset_stream(self.stream_id, code)

    async def flush(self, cut_at: int | None = None) -> None:
        await self.conn.flush(cut_at)


class H2ScriptedUpstream(ScriptedUpstream):
    """Serve `handler` over HTTP/2 in TLS (`tls`, a server context offering h2) on 127.0.0.1
    from a background thread, once per request; use as a context manager."""

    def __init__(self, handler: H2Handler, tls: ssl.SSLContext) -> None:
        super().__init__(handler, tls)  # type: ignore[arg-type]
        self.h2_handler = handler
        self._tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        conn = H2Connection(h2.connection.H2Connection(config), writer)
        conn.h2.initiate_connection()
        writer.write(conn.h2.data_to_send())
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                for event in conn.h2.receive_data(data):
                    self._on(conn, event)
                if out := conn.h2.data_to_send():
                    writer.write(out)
        with contextlib.suppress(Exception):
            writer.close()

    def _on(self, conn: H2Connection, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = dict(event.headers or [])  # type: ignore[arg-type]
            sid = event.stream_id
            conn.exchanges[sid] = H2Exchange(sid, str(headers.get(":path")), headers, conn)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            conn.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id in conn.exchanges:
            task = asyncio.ensure_future(self._answer(conn.exchanges[event.stream_id]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            conn.arrived.set()

    async def _answer(self, ex: H2Exchange) -> None:
        with contextlib.suppress(ConnectionError, h2.exceptions.ProtocolError):
            await self.h2_handler(ex)
