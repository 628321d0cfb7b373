"""`hopmeter run`'s direct relay of a streamed response body from an HTTP/1 upstream (or an
HTTP/2 upstream in TLS: hopmeter.proxy.fastpath.h2_upstream), past mitmproxy's layers.

Every read mitmproxy takes from an upstream travels its whole layer stack: the connection
handler's lock, the mode layer, the HTTP layer, the connection's HTTP/1 client (h11's chunked
reader on a receive buffer), one `ResponseData` event per piece to the flow's `HttpStream`, which
calls the response's stream callable and sends the piece back down through the HTTP layer to the
client's HTTP/1 server (its chunk framing) and up again as a `SendData` command to the client's
writer. For a streamed body that is nearly half of the proxy's CPU per event (perf, 20 streams:
`Layer.handle_event`, `HttpLayer.event_to_child`, `server_event` and its lock, h11's reader),
and none of it does anything but move the piece.

`install()` puts a method in front of `ConnectionHandler.server_event`. For a read from an
upstream connection that carries a relay (armed by `Relay` when a response starts streaming),
the relay checks that mitmproxy is in the state where the read could only be moved, and if so
does what the layers would do, in the same order, with the same bytes:

- splits the read into the pieces h11's reader would give mitmproxy (`split_chunked`: the same
  header pattern, the same CRLF check after each chunk; a content-length body; a body read to
  the connection's end) and keeps the reader's state as h11 would;
- calls the response's stream callable with each piece (hopmeter's own tap, which never raises
  and starts no task; a callable someone else put there leaves the body to mitmproxy) and frames
  what it returns (a list under `--chaos`) as the client's HTTP/1 server would
  (`framing.chunked`);
- writes each to the client's writer unless it is closing, and marks the connection's activity
  for mitmproxy's idle timeout. A client in TLS to the proxy (mitmproxy's `ClientTLSLayer`
  terminating it, HTTP/1.1 negotiated) gets what that layer's `send_data` and `tls_interact`
  would give it: each framed chunk into the layer's OpenSSL connection (`sendall`), then its
  records read out (`bio_read`) until there are none, each written in order. The TLS layer is
  found once per response, when the relay is armed (`arm`; hopmeter.proxy.fastpath.client_tls).
  A client that speaks HTTP/2 gets what mitmproxy's `Http2Server` would send for each piece
  instead of HTTP/1 framing: the piece into its HTTP/2 connection on the flow's stream
  (`send_data` of mitmproxy's BufferedH2Connection, which holds back what the stream's window
  does not allow, as for mitmproxy), then the frames the connection has to send
  (`data_to_send`), written (in TLS: through the client's OpenSSL connection) as one write. A
  piece that fits the stream's windows and frame size at once takes h2's steps for it by
  hopmeter.proxy.fastpath.h2_frames (the same bytes and windows, a fraction of the work).

An upstream in TLS (mitmproxy's `ServerTLSLayer` for the flow's connection, under the HTTP
layer) is followed one step lower: its reads go through mitmproxy's `server_event` and its TLS
layer, which decrypts each one (`receive_data`) and hands the plaintext to its HTTP client
(`event_to_child`); `install()` puts `tls_event_to_child` in front of that for ServerTLSLayer,
and the relay takes the plaintext there as it takes a plain upstream's read (inside mitmproxy's
`server_event`, so not as the read arrives: no `ReadShortcut`). What it leaves goes on to the
HTTP client as it would have.

A read that arrives while mitmproxy's read loop for the upstream connection waits with nothing
buffered is taken even earlier, in the connection's protocol callback (`ReadShortcut`, in front
of mitmproxy's `StreamReaderProtocol`): no stream reader, no wake-up of the loop's task, and the
loop's drain step only when a writer could make it wait (then reading pauses until it has
waited, as the loop would). A read as big as mitmproxy's read size (more is waiting) goes to the
stream reader, which stops reading at twice that, so a fast upstream cannot hold the loop.

Whatever the relay does not take goes to mitmproxy's own method: a read while any layer on the
path is paused (a hook in progress, the response's headers hook included), the last chunk and its
trailers, an incomplete chunk header, bytes h11 would reject (mitmproxy then reports the same
error), the final read of a content-length body, an HTTP/2 upstream not in TLS (in TLS: its
DATA frames as hopmeter.proxy.fastpath.h2_upstream takes them), an HTTP/2 client's stream
no longer open for the proxy to send on, an upstream TLS layer not open, a client TLS layer whose
tunnel is not open (the handshake), that holds events it queued, or whose session was shut down
(a close_notify either way), TLS inside TLS, `store_streamed_bodies`, `proxy_debug`, or a relay
that failed. A read can be split: the relay takes what comes before such a point and mitmproxy's
method gets the rest, with the reader's state as h11 left it. tests/proxy/fastpath/test_relay.py
holds the pieces to h11's on random splits, and the bytes and records of real flows to those of
the same flows with the relay off (`hopmeter run --no-relay`); test_client_tls.py does the same
for clients in TLS, on random bodies and reads, over HTTP/1.1 and HTTP/2.

It fails closed. A read goes through its steps in order (`STEPS`): the checks and the split only
read, so a fault there leaves the whole read to mitmproxy's layers, untouched, and the relay
steps aside for the rest of the response. From the first step that changes anything (the
reader's state, the tap, the client's TLS connection or writer) a fault ends the client's
connection with a reset (`cut`): the client sees its body end without its last chunk (or its
length, or with a reset where the body runs to the close; over HTTP/2 every stream of the
connection ends unfinished), never a piece twice and never a piece missing in the middle, and
the flow's record says `ended: "error"` with `relay_error`. Both are counted
(hopmeter_internal_errors_total{where="relay"}, hopmeter_relay_faults_total{outcome}) and logged.

It changes a class of the interpreter's mitmproxy, so only `hopmeter run` installs it
(hopmeter.proxy.fastpath); the addons a user loads into a plain mitmdump leave mitmproxy as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from hopmeter.log import get_logger
from hopmeter.proxy.fastpath import client_tls, framing, gate
from hopmeter.proxy.fastpath.backpressure import needs_drain
from hopmeter.proxy.fastpath.client_tls import send as send_tls
from hopmeter.proxy.fastpath.h2_frames import send as send_frame
from hopmeter.proxy.fastpath.h2_upstream import H2Upstream
from hopmeter.proxy.fastpath.internals import (
    BufferedH2Connection,
    ChunkedReader,
    ClientTLSLayer,
    ConnectionHandler,
    ContentLengthReader,
    DataReceived,
    Http1Client,
    Http1Connection,
    Http1Server,
    Http2Client,
    Http2Server,
    Http10Reader,
    HttpClient,
    HttpLayer,
    HttpStream,
    NextLayer,
    ServerTLSLayer,
    TunnelState,
    chunk_header_re,
    connection_handlers,
    layers_to_http,
)
from hopmeter.proxy.options import RELAY, declare

log = get_logger()

# A fault in the relay, told to the measuring addon: the flow, the exception, and whether the
# client's connection was cut (True) or the bytes were left to mitmproxy's layers (False).
OnFault = Callable[[http.HTTPFlow, BaseException, bool], None]

# The steps of a relayed read, in order (docs/reliability.md). A fault in the first two leaves the
# read to mitmproxy's layers; in any later one it cuts the client's connection.
STEPS = (
    "check",  # mitmproxy's layers would only move this read (`_ready`; direct: its loop waits)
    "split",  # the read into the pieces h11's reader would give (`split_chunked`)
    "commit",  # h11's reader state as it would leave it; mitmproxy's idle timer told
    "tap",  # each piece through the response's stream callable
    "frame",  # framed as mitmproxy's HTTP/1 server (`framing.chunked`) or HTTP/2 server would
    "write",  # written to the client's writer (in TLS: through its OpenSSL connection first)
    "rest",  # what follows the relay's part handed to mitmproxy's layers (`_rest`)
    "drain",  # after a direct read: mitmproxy's drain step if a writer needs it (`needs_drain`)
    "resume",  # reading resumed after that step (`ReadShortcut._resume`)
)
LEFT_STEPS = STEPS[:2]  # a fault leaves the read to mitmproxy; later ones cut the connection

_MITMPROXY_SERVER_EVENT = ConnectionHandler.server_event
# ServerTLSLayer's own (it swallows the upstream's OpenConnection while it waits for the
# client's hello), or TunnelLayer's where a release inherits it
_MITMPROXY_TLS_TO_CHILD = ServerTLSLayer.event_to_child
_TLS_TO_CHILD_OWN = "event_to_child" in ServerTLSLayer.__dict__
_OPEN = TunnelState.OPEN
_ESTABLISHING = TunnelState.ESTABLISHING
_KEY = "_hopmeter_relay"  # in an upstream connection's __dict__: its BodyRelay
_READ_BODY = Http1Connection.read_body
_STREAM_BODY = HttpStream.state_stream_response_body
_DataReceived = DataReceived
_CRLF = b"\r\n"
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_MAX_SIZE_DIGITS = 20  # h11's chunk_size pattern: 1 to 20 hex digits
# h11 0.16 keeps the CRLF still to be read after a chunk as bytes and checks it; an h11 that keeps a
# count (and skips unchecked) is not followed: its chunked bodies go through mitmproxy's layers.
_H11_CHECKS_CRLF = isinstance(ChunkedReader()._bytes_to_discard, bytes)
# body readers by what the relay does with a read (mitmproxy's `make_body_reader` picks one)
_CHUNKED, _LENGTH, _TO_EOF = 1, 2, 3
# The biggest read the relay takes as it arrives: mitmproxy's own read size. A bigger one (the
# loop's buffer filled: more is waiting) goes through mitmproxy's stream reader, which stops
# reading once it holds twice that, so a fast upstream cannot keep the loop reading one
# connection read after read while every other stream and the measuring wait.
_DIRECT_MAX_BYTES = 65535
# SO_LINGER on, 0 s: closing sends a reset at once, so a client reading a body to the connection's
# end (no length, no chunks) can tell the cut from the body's end; the kernel's unsent bytes go.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


# Why a streamed response is left to mitmproxy's layers: /metrics' `reason` label (bounded).
TLS = "tls"  # TLS on the upstream's or the client's connection, not as the relay follows it
# the upstream's connection is HTTP/2 (or not plain HTTP/1), or the client's neither HTTP/1 nor
# mitmproxy's HTTP/2 server as the relay follows it
NOT_HTTP1 = "not_http1"
PROXY_DEBUG = "proxy_debug"  # proxy_debug logs every event in every layer
LAYERS = "layers"  # a layer on the path is still being decided or does more than pass events on
UNLOCATED = "unlocated"  # the connection's handler, HTTP layer, writer or stream was not found
VERSION = "version"  # the fast paths are off: mitmproxy, h11 or Python not as read (fastpath.gate)
# the stream callable is not one the relay may call in mitmproxy's place (hopmeter's own tap has
# `relay_safe`: it never raises and starts no task; another addon's callable, or hopmeter's tap
# chained after one or keeping a copy of the body, goes through mitmproxy's layers)
CALLABLE = "callable"
DECLINED = (TLS, NOT_HTTP1, PROXY_DEBUG, LAYERS, UNLOCATED, VERSION, CALLABLE)
# What a fault in the relay did: /metrics' `outcome` label.
LEFT = "left_to_mitmproxy"  # nothing of the read was delivered: mitmproxy's layers moved it
CUT = "cut"  # the client's connection was ended with a reset, the record says ended "error"


class Stats:
    """What the relays of this process did (a /metrics counter; tests)."""

    __slots__ = (
        "armed",
        "declined",
        "direct",
        "faults",
        "h2_own_frames",
        "h2_pieces",
        "h2_up_pieces",
        "pieces",
        "tls_pieces",
    )

    def __init__(self) -> None:
        self.armed = 0  # responses a relay was armed for
        self.declined = dict.fromkeys(DECLINED, 0)  # responses left to mitmproxy, by reason
        self.pieces = 0  # body pieces moved by a relay instead of mitmproxy's layers
        self.tls_pieces = 0  # of those, pieces sent through a client's TLS connection
        self.h2_pieces = 0  # of those, pieces sent to a client over HTTP/2
        self.h2_up_pieces = 0  # of those, pieces from an upstream over HTTP/2 (DATA frames)
        self.h2_own_frames = 0  # DATA frames, in or out, whose steps h2_frames took, not h2
        self.direct = 0  # reads a relay took as they arrived, without mitmproxy's read loop
        self.faults = {LEFT: 0, CUT: 0}  # faults in a relay, by what became of the read


STATS = Stats()


def counts() -> list[tuple[str, str, float | tuple[str, dict[str, int]]]]:
    """The relay's counts for /metrics (hopmeter.export.prometheus.ProcessCounters)."""
    return [
        (
            "relayed_pieces",
            "Response body pieces `hopmeter run` moved from upstream to client itself instead of "
            "through mitmproxy's layers (the same bytes, stream callable and framing).",
            STATS.pieces,
        ),
        (
            "relayed_tls_pieces",
            "Of the relayed pieces, those sent through the client's TLS connection.",
            STATS.tls_pieces,
        ),
        (
            "relayed_h2_pieces",
            "Of the relayed pieces, those sent to a client over HTTP/2 (DATA on its stream).",
            STATS.h2_pieces,
        ),
        (
            "relayed_h2_upstream_pieces",
            "Of the relayed pieces, those that came from an upstream over HTTP/2 (its DATA "
            "frames).",
            STATS.h2_up_pieces,
        ),
        (
            "relayed_h2_own_frames",
            "HTTP/2 DATA frames a relay received from an upstream or sent to a client taking "
            "h2's steps for them itself (the same bytes and windows, a fraction of the work).",
            STATS.h2_own_frames,
        ),
        (
            "relayed_responses",
            "Streamed responses from an HTTP/1 upstream, or an HTTP/2 upstream in TLS, a relay "
            "was armed for.",
            STATS.armed,
        ),
        (
            "relayed_direct_reads",
            "Upstream reads a relay took as they arrived, without mitmproxy's read loop.",
            STATS.direct,
        ),
        (
            "relay_declined",
            "Streamed responses left to mitmproxy's layers, by reason: tls, not_http1 (an "
            "HTTP/2 upstream not in TLS, a client neither HTTP/1 nor HTTP/2), "
            "proxy_debug, layers (a layer that does more than pass events on), unlocated, "
            "version (the relay is off: mitmproxy, h11 or Python is not as it was read), "
            "callable (the stream callable is not hopmeter's own tap alone).",
            ("reason", dict(STATS.declined)),
        ),
        (
            "relay_faults",
            "Faults in the relay, by outcome: left_to_mitmproxy (nothing of the read delivered: "
            "mitmproxy's layers moved it) or cut (the client's connection was reset, the flow "
            "recorded ended error).",
            ("outcome", dict(STATS.faults)),
        ),
    ]


def split_chunked(
    data: bytes, in_chunk: int, discard: bytes
) -> tuple[list[bytes], int, int, bytes]:
    """The body pieces h11's ChunkedReader would give mitmproxy for `data`, read with an empty
    receive buffer from the state (`in_chunk` bytes of a chunk still to come, `discard` the CRLF
    still to be read after one).

    Stops before what the reader would not turn into data: the last chunk (size 0, then
    trailers), a chunk header not complete in `data`, a header h11's pattern rejects, a CRLF that
    is not one. Returns (pieces, bytes of `data` used, in_chunk, discard) as h11 would leave them
    after the bytes used; the rest of `data` is for h11.
    """
    if not in_chunk and not discard:  # the usual read: one whole chunk, a bare hex size
        eol = data.find(_CRLF, 0, _MAX_SIZE_DIGITS + 2)
        if eol > 0 and not data[:eol].translate(None, _HEX_DIGITS):
            size = int(data[:eol], 16)
            start = eol + 2
            if size and start + size + 2 == len(data) and data.endswith(_CRLF):
                return [data[start:-2]], len(data), 0, b""
    pieces: list[bytes] = []
    pos = 0
    end = len(data)
    while pos < end:
        if discard:
            n = min(len(discard), end - pos)
            if data[pos : pos + n] != discard[:n]:
                break
            discard = discard[n:]
            pos += n
        elif in_chunk == 0:
            eol = data.find(_CRLF, pos)
            if eol < 0:
                break
            header = chunk_header_re.fullmatch(data, pos, eol + 2)
            if header is None:
                break
            size = int(header["chunk_size"], 16)
            if size == 0:
                break
            in_chunk = size
            pos = eol + 2
        else:
            n = min(in_chunk, end - pos)
            pieces.append(data[pos : pos + n])
            pos += n
            in_chunk -= n
            if in_chunk == 0:
                discard = _CRLF
    return pieces, pos, in_chunk, discard


class _Done:
    """An awaitable that is already done: `server_event`'s answer for a read the relay took."""

    __slots__ = ()

    def __await__(self) -> Iterator[None]:
        return iter(())


_DONE = _Done()


def server_event(self: ConnectionHandler, event: Any) -> Any:
    """mitmproxy's `server_event`, a read from a relayed upstream moved by the relay."""
    if type(event) is _DataReceived:
        relay = event.connection.__dict__.get(_KEY)
        if relay is not None and relay.up_tls is None:  # else: its plaintext, below
            used = relay.take(self, event.data)  # never raises
            if used:
                if used == len(event.data):
                    return _DONE
                try:
                    event = _rest(event, used)
                except Exception as exc:  # the relay's part is delivered, the rest cannot follow
                    relay.cut(exc)
                    return _DONE
    return _MITMPROXY_SERVER_EVENT(self, event)


def tls_event_to_child(self: ServerTLSLayer, event: Any) -> Any:
    """mitmproxy's ServerTLSLayer.event_to_child, a read's plaintext from a relayed upstream in
    TLS moved by the relay: mitmproxy's TLS layer decrypted the read (`receive_data`) and hands
    the plaintext to its HTTP client here, inside mitmproxy's `server_event`. What the relay
    does not take goes on to the layer's child as it would have."""
    event = tls_take(self, event)
    if event is not None:
        yield from _MITMPROXY_TLS_TO_CHILD(self, event)


def tls_take(layer: ServerTLSLayer, event: Any) -> Any:
    """The relay's part of an event `layer` hands its child: the event for the child (all of
    it, or the read less what the relay moved), or None when nothing is left. Never raises."""
    if type(event) is _DataReceived:
        relay = event.connection.__dict__.get(_KEY)
        if relay is not None and relay.up_tls is layer:
            used = relay.take(relay.handler, event.data)  # never raises
            if used:
                if used == len(event.data):
                    return None
                try:
                    return _rest(event, used)
                except Exception as exc:  # the relay's part is delivered, the rest cannot follow
                    relay.cut(exc)
                    return None
    return event


def _rest(event: Any, used: int) -> Any:
    """The read less the relay's part, for mitmproxy's layers."""
    return _DataReceived(event.connection, event.data[used:])


class ReadShortcut(asyncio.Protocol):
    """An upstream connection's protocol while `hopmeter run` relays on it: a read that comes
    while mitmproxy's read loop for the connection waits for data (its stream reader empty) goes
    to the connection's relay at once, without the stream reader and the read loop's wake-up;
    the loop's drain step after it is done here (`_drain`) only when a writer could make it wait,
    as `hopmeter.proxy.fastpath.backpressure` does. Anything else, and what the relay leaves, goes
    to mitmproxy's protocol as it would have."""

    def __init__(
        self, inner: Any, conn: Any, handler: ConnectionHandler, reader: Any, transport: Any
    ) -> None:
        self.inner = inner
        self.conn = conn
        self.handler = handler
        self.reader = reader
        self.transport = transport
        self.draining: BodyRelay | None = None  # the relay whose read paused reading
        self.drain_task: asyncio.Future[None] | None = None  # a reference while it runs

    def data_received(self, data: bytes) -> None:
        relay = self.conn.__dict__.get(_KEY)
        if relay is not None and self.draining is None and len(data) < _DIRECT_MAX_BYTES:
            try:  # mitmproxy's read loop waits for this read (asyncio's reader, private names)
                reader = self.reader
                waiter = reader._waiter
                waits = (
                    waiter is not None
                    and not waiter.done()
                    and not reader._buffer
                    and not reader._eof
                )
            except Exception as exc:  # nothing taken: the stream reader gets the read
                relay.fail(exc)
                waits = False
            if waits:
                used = relay.take(self.handler, data)  # never raises
                if used == len(data):
                    if not relay.dead:
                        try:  # what the read loop does next: its drain step, if needed
                            STATS.direct += 1
                            if needs_drain(self.handler):
                                self._drain(relay)
                        except Exception as exc:  # the read went out; its drain step did not
                            relay.cut(exc)
                    return
                data = data[used:]
        self.inner.data_received(data)

    def _drain(self, relay: BodyRelay) -> None:
        """What mitmproxy's read loop does after a read that filled a client's buffers: no
        further read is handled until mitmproxy's drain step has waited for them. Reading pauses
        meanwhile (the kernel's receive buffer holds what comes), and resumes after the step."""
        self.transport.pause_reading()
        self.draining = relay  # before the task: an eager task may finish before it is returned
        self.drain_task = asyncio.ensure_future(self._drained())

    async def _drained(self) -> None:
        try:
            with contextlib.suppress(Exception):  # the connection went: the read loop sees it
                await self.handler.drain_writers()
        finally:
            relay, self.draining = self.draining, None
            self.drain_task = None
            try:
                self._resume()
            except Exception as exc:  # reading would stay paused: a stall the client cannot see
                if relay is not None:
                    relay.cut(exc)

    def _resume(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _shortcut(handler: ConnectionHandler, conn: Any) -> None:
    """Put a ReadShortcut in front of the upstream connection's protocol (once)."""
    io = handler.transports.get(conn)
    writer = getattr(io, "writer", None)
    if io is None or type(writer) is not asyncio.StreamWriter:
        return
    transport = writer.transport
    protocol = transport.get_protocol()
    if type(protocol) is asyncio.StreamReaderProtocol:
        transport.set_protocol(ReadShortcut(protocol, conn, handler, io.reader, transport))


class BodyRelay:
    """One streamed response's path through mitmproxy, held to move its body's reads."""

    __slots__ = (
        "cut_at",
        "dead",
        "flow",
        "h1",
        "h2",
        "handler",
        "http_layer",
        "kind",
        "layers",
        "on_fault",
        "ours",
        "own_steps",
        "reader",
        "response",
        "server",
        "sid",
        "ssl",
        "store_option",
        "stream",
        "tap",
        "tls",
        "up",
        "up_tls",
        "writer",
    )

    def __init__(
        self,
        *,
        handler: ConnectionHandler,
        flow: http.HTTPFlow,
        http_layer: HttpLayer,
        h1: Http1Client | Http2Client,
        sid: int,
        server: Http1Server | Http2Server,
        stream: HttpStream,
        layers: tuple[Any, ...],
        store_option: Any,
        writer: Any,
        on_fault: OnFault,
        tls: Any = None,
        up_tls: Any = None,
        ours: int | None = None,
        own_steps: bool = False,
    ) -> None:
        self.handler = handler
        self.flow = flow
        # mitmproxy's objects, read by private names below (checked against mitmproxy's code):
        self.response: Any = flow.response
        self.tap: Any = getattr(flow.response, "stream", None)  # armed with it (`relay_safe`)
        self.http_layer = http_layer
        self.h1: Any = h1  # the upstream connection's Http1Client (Http2Client: `ours`)
        self.sid = sid  # the flow's stream id in the HTTP layer
        self.server: Any = server
        # an HTTP/2 client's connection (mitmproxy's BufferedH2Connection), else None
        self.h2: Any = server.h2_conn if type(server) is Http2Server else None
        # an HTTP/2 frame's steps by h2_frames where they fit (the gate's `check_h2_frames`)
        self.own_steps = own_steps
        self.stream: Any = stream
        self.layers = layers  # those whose pause would hold a read back: a hook in progress
        self.store_option = store_option  # mitmproxy's store_streamed_bodies (read per read)
        self.on_fault = on_fault
        # the client's writer: mitmproxy skips a write to a connection it has dropped from its
        # transports, whose writer it closed first; the relay skips a write to a closing writer
        self.writer = writer
        # the client's TLS layer (ClientTLSLayer) and its OpenSSL connection, when in TLS
        self.tls: Any = tls
        self.ssl: Any = tls.tls if tls is not None else None
        # the upstream's TLS layer (ServerTLSLayer) when in TLS: the relay takes its plaintext
        self.up_tls: Any = up_tls
        # from an HTTP/2 upstream: the flow's stream id on that connection (mitmproxy's own),
        # and the connection's relay, which takes the reads and hands each stream's pieces here
        self.ours = ours
        self.up: H2Upstream | None = None
        self.reader: Any = None  # h11's body reader, once mitmproxy made it (_bind_reader)
        self.kind = 0
        self.dead = False  # a fault, or a reader it does not follow: mitmproxy's layers move it
        self.cut_at: BaseException | None = None  # the fault that cut the client's connection

    def take(self, handler: ConnectionHandler, data: bytes) -> int:
        """Move what mitmproxy's layers would only move of `data`; how many bytes of it are done
        with: moved, or gone with the client's connection after a fault (`cut`). The rest is
        for mitmproxy's layers. Behind an upstream in TLS `data` is plaintext, taken inside
        mitmproxy's own `server_event` (which holds its lock). Never raises."""
        try:  # "check", "split": nothing changed yet
            writer = self._ready(handler)
            if writer is None:
                return 0
            kind = self.kind
            if kind == _CHUNKED:
                reader = self.reader
                pieces, used, in_chunk, discard = split_chunked(
                    data, reader._bytes_in_chunk, reader._bytes_to_discard
                )
                if not used:
                    return 0
            elif kind == _LENGTH:
                used = len(data)
                if used >= self.reader._remaining:
                    return 0  # the body's last bytes: mitmproxy ends the message
                pieces = [data]
            else:
                used = len(data)
                pieces = [data]
        except Exception as exc:  # mitmproxy's layers move this read, and the rest of the body
            self.fail(exc)
            return 0
        try:  # "commit" onwards: h11's reader as it would be after this part, the idle timer
            if kind == _CHUNKED:  # told as mitmproxy's server_event tells it, the pieces out
                reader._bytes_in_chunk = in_chunk
                reader._bytes_to_discard = discard
            elif kind == _LENGTH:
                self.reader._remaining -= used
            handler.timeout_watchdog.register_activity()
            if pieces:
                self._deliver(pieces, writer)
        except Exception as exc:
            self.cut(exc)
        return used

    def _ready(self, handler: ConnectionHandler) -> Any:
        """The client's writer when mitmproxy's layers would only move a read, else None."""
        if self.dead or handler is not self.handler:
            return None
        up = self.up_tls
        if up is not None:  # a TLS upstream's plaintext: its layer open, holding nothing back
            if up.tunnel_state is not _OPEN or up._event_queue:
                return None
        elif handler._server_event_lock.locked():
            return None
        h1 = self.h1
        if self.reader is None and not self._bind_reader():
            return None
        if (
            h1.state.__func__ is not _READ_BODY
            or h1.body_reader is not self.reader
            or h1.stream_id != self.sid
            or h1.buf
        ):
            return None
        if self.kind == _CHUNKED and self.reader._reading_trailer:
            return None
        return self._ready_down()

    def _ready_down(self) -> Any:
        """The client's writer when, from the flow's HTTP stream down to the client, mitmproxy's
        layers would only move a piece of the body (asked per read), else None."""
        for lay in self.layers:
            if lay._paused is not None:
                return None
        stream = self.stream
        response = self.response
        if (
            stream.server_state.__func__ is not _STREAM_BODY
            or self.http_layer.streams.get(self.sid) is not stream
            or self.flow.response is not response
            or self.response.stream is not self.tap
            or self.store_option.value is True
        ):
            return None
        server = self.server
        if self.h2 is None:
            if server.response is None or server.stream_id != self.sid:
                return None
        elif not server.is_open_for_us(self.sid) or server.h2_conn is not self.h2:
            return None  # the client reset the stream, or the connection is closing
        tls = self.tls
        if tls is not None and not client_tls.ready(tls, self.ssl):
            return None  # the handshake, queued events, a close_notify: mitmproxy's to handle
        return self.writer

    def _bind_reader(self) -> bool:
        """Take the body reader mitmproxy made for this response (after the headers' hook began,
        so not there yet when the relay was armed); a reader the relay does not follow ends it."""
        if self.h1.state.__func__ is not _READ_BODY or self.h1.stream_id != self.sid:
            return False  # not reading this body yet: ask again at the next read
        reader = self.h1.body_reader
        if type(reader) is ChunkedReader and _H11_CHECKS_CRLF:
            self.kind = _CHUNKED
        elif type(reader) is ContentLengthReader:
            self.kind = _LENGTH
        elif type(reader) is Http10Reader:
            self.kind = _TO_EOF
        else:
            self.dead = True
            return False
        self.reader = reader
        return True

    def _deliver(self, pieces: list[bytes], writer: Any) -> None:
        """What HttpStream, Http1Server and server_event do with each piece, in their order."""
        if self.h2 is not None:
            self._deliver_h2(pieces, writer)
            return
        tap = self.response.stream
        chunked = framing.chunked(self.server, self.server.response)
        ssl = self.ssl
        for piece in pieces:
            out = tap(piece)
            chunks: Iterable[bytes] = [out] if isinstance(out, bytes) else out
            for chunk in chunks:
                raw = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
                if raw:
                    _write(raw, writer, ssl)
        self._count(pieces)

    def _deliver_h2(self, pieces: list[bytes], writer: Any) -> None:
        """What HttpStream, Http2Server (Http2Connection._handle_event with a ResponseData) and
        server_event do with each piece for an HTTP/2 client, in their order: every chunk the
        stream callable returns into the connection on the flow's stream (`_ready` found the
        stream open for the proxy), then the frames it has to send, if any, as one write."""
        tap = self.response.stream
        h2, sid, ssl, own = self.h2, self.sid, self.ssl, self.own_steps
        for piece in pieces:
            out = tap(piece)
            chunks: Iterable[bytes] = [out] if isinstance(out, bytes) else out
            for chunk in chunks:
                raw = send_frame(h2, sid, chunk) if own else None
                if raw is None:  # h2's own steps (or a piece that does not fit at once)
                    h2.send_data(sid, chunk)
                    raw = h2.data_to_send()
                else:
                    STATS.h2_own_frames += 1
                if raw:
                    _write(raw, writer, ssl)
        STATS.h2_pieces += len(pieces)
        self._count(pieces)

    def _count(self, pieces: list[bytes]) -> None:
        STATS.pieces += len(pieces)
        if self.ssl is not None:
            STATS.tls_pieces += len(pieces)
        if self.ours is not None:
            STATS.h2_up_pieces += len(pieces)
            if self.own_steps:  # each an upstream's DATA frame, taken in by h2_frames
                STATS.h2_own_frames += len(pieces)

    def fail(self, exc: BaseException) -> None:
        """A fault before anything of a read changed: the relay steps aside for the rest of this
        response, mitmproxy's layers move the read."""
        self.dead = True
        with contextlib.suppress(Exception):  # never raises: it runs on mitmproxy's read path
            STATS.faults[LEFT] += 1
            self.on_fault(self.flow, exc, False)

    def cut(self, exc: BaseException) -> None:
        """A fault once a read was under way: some of it may have reached the client, the rest
        cannot follow in order. End the client's connection with a reset, so that the client
        can tell its body is not whole, and have the flow recorded as ended by an error. Never
        raises: it runs on mitmproxy's read path, and the reset must happen whatever failed."""
        if self.cut_at is not None:
            return
        self.dead = True
        self.cut_at = exc
        with contextlib.suppress(Exception):
            STATS.faults[CUT] += 1
            self.on_fault(self.flow, exc, True)
        try:
            transport = self.writer.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            transport.abort()
        except Exception:  # no transport to abort: mitmproxy closes the connection itself
            with contextlib.suppress(Exception):
                self.handler.close_connection(self.flow.client_conn)


def _write(raw: bytes, writer: Any, ssl: Any) -> None:
    """One piece to the client as mitmproxy sends it: to its writer unless that is closing
    (mitmproxy skips a dropped connection's writes), or through its TLS connection (`ssl`) as
    mitmproxy's client TLS layer sends it."""
    if ssl is None:
        if not writer.is_closing():
            writer.write(raw)
    else:
        send_tls(ssl, raw, writer)


def arm(
    flow: http.HTTPFlow,
    handler: Any,
    on_fault: OnFault,
    h2_upstream: bool = True,
    own_steps: bool = False,
) -> BodyRelay | str:
    """A relay for `flow`'s response body, or why mitmproxy's layers move it instead (one of
    DECLINED). `h2_upstream`: whether one may be armed behind an HTTP/2 upstream (the version
    gate's `check_h2_upstream`); `own_steps`: whether it takes HTTP/2 DATA frames' steps itself
    (h2_frames; the gate's `check_h2_frames`)."""
    if flow.response is None or not getattr(flow.response.stream, "relay_safe", False):
        return CALLABLE
    if handler is None or not isinstance(getattr(handler, "transports", None), dict):
        return UNLOCATED  # no live connection handler for this client
    options = handler.layer.context.options
    if options.proxy_debug:
        return PROXY_DEBUG
    chain = layers_to_http(handler)
    if not chain:
        return UNLOCATED  # no HTTP layer under this client's connection
    above = _layers_above(chain, flow)
    if isinstance(above, str):
        return above
    layers, tls = above
    http_layer = chain[-1]
    upstream = _upstream(flow, http_layer, h2_upstream)
    if isinstance(upstream, str):
        return upstream
    up_tls, client, h1, sid, ours = upstream
    if up_tls is not None:
        layers.append(up_tls)
    server = http_layer.connections.get(flow.client_conn)
    if type(server) is Http2Server:
        if type(server.h2_conn) is not BufferedH2Connection or "_handle_event" in server.__dict__:
            return NOT_HTTP1  # not mitmproxy's HTTP/2 server as the relay follows it
    elif type(server) is not Http1Server:
        return NOT_HTTP1  # the client's connection
    io = handler.transports.get(flow.client_conn)
    writer = getattr(io, "writer", None)
    if writer is None:
        return UNLOCATED  # the client's connection has no writer
    stream = http_layer.streams.get(sid) if sid is not None else None
    if (
        sid is None
        or not isinstance(stream, HttpStream)
        or getattr(stream, "flow", None) is not flow
    ):
        return UNLOCATED  # this flow's HTTP stream
    relay = BodyRelay(
        handler=handler,
        flow=flow,
        http_layer=http_layer,
        h1=h1,
        sid=sid,
        server=server,
        stream=stream,
        layers=(*layers, http_layer, client, h1, stream, server),
        store_option=options._options["store_streamed_bodies"],
        writer=writer,
        on_fault=on_fault,
        tls=tls,
        up_tls=up_tls,
        ours=ours,
        own_steps=own_steps,
    )
    if ours is not None:
        relay.up = _h2_upstream(flow, handler, up_tls, h1, own_steps)
        if relay.up is None:
            return UNLOCATED  # the upstream's connection has no writer
    return relay


def _layers_above(chain: list[Any], flow: http.HTTPFlow) -> tuple[list[Any], Any] | str:
    """The layers above the HTTP layer in `chain` that a paused state could hold, and the
    client's TLS layer among them (or None); or why the relay cannot follow them (one of
    DECLINED)."""
    layers: list[Any] = []
    tls = None
    for obj, nxt in itertools.pairwise(chain):
        if isinstance(obj, NextLayer):
            if getattr(obj._handle, "__self__", None) is not nxt:
                return LAYERS  # still being decided
        elif _delegates(obj, nxt):
            layers.append(obj)
        elif tls is None and type(obj) is ClientTLSLayer:
            if not client_tls.follows(obj, nxt, flow.client_conn):
                return TLS  # not the one TLS session the relay follows
            tls = obj
            layers.append(obj)
        elif _passes_on(obj, nxt, flow):
            layers.append(obj)
        else:
            return LAYERS  # does more than pass events on
    if flow.client_conn.tls and tls is None:
        return TLS
    return layers, tls


def _h2_upstream(
    flow: http.HTTPFlow, handler: Any, up_tls: Any, client: Any, own_steps: bool
) -> Any:
    """The relay of the flow's HTTP/2 upstream connection (made once, for its first stream),
    or None when the connection has no writer."""
    up = flow.server_conn.__dict__.get(_KEY)
    if type(up) is H2Upstream and up.client is client and up.handler is handler:
        return up
    writer = getattr(handler.transports.get(flow.server_conn), "writer", None)
    if writer is None:
        return None
    return H2Upstream(
        handler=handler, up_tls=up_tls, client=client, writer=writer, own_steps=own_steps
    )


def _upstream(
    flow: http.HTTPFlow, http_layer: HttpLayer, h2_upstream: bool
) -> tuple[Any, Any, Any, int | None, int | None] | str:
    """The flow's way from the HTTP layer to its upstream as the relay follows it: (the
    connection's TLS layer or None, mitmproxy's HttpClient for it, the Http1Client or Http2Client
    under that, the flow's stream id in the HTTP layer, its stream id on an HTTP/2 connection or
    None), or why mitmproxy's layers move the body (one of DECLINED)."""
    client = http_layer.connections.get(flow.server_conn)
    up_tls = None
    if type(client) is ServerTLSLayer:
        if not _upstream_tls(client, flow.server_conn):
            return TLS  # not the one TLS session the relay follows
        up_tls, client = client, client.child_layer
    elif flow.server_conn.tls:
        return TLS  # the upstream's TLS is not where the relay looks for it
    h1 = getattr(client, "child_layer", None)
    if type(client) is not HttpClient or not _delegates(client, h1):
        return NOT_HTTP1  # the upstream's connection
    if type(h1) is Http1Client:
        return up_tls, client, h1, h1.stream_id, None
    if type(h1) is not Http2Client or up_tls is None:
        return NOT_HTTP1  # HTTP/2 in the clear: the relay takes HTTP/2 frames from TLS only
    if not h2_upstream:
        return VERSION
    sid = next((k for k, v in http_layer.streams.items() if v.flow is flow), None)
    ours = h1.our_stream_id.get(sid) if sid is not None else None
    if ours is None or h1.their_stream_id.get(ours) != sid:
        return UNLOCATED  # this flow's stream on the upstream connection
    return up_tls, client, h1, sid, ours


def _upstream_tls(layer: Any, server: Any) -> bool:
    """Whether `layer`, the HTTP layer's way to `server`, is mitmproxy's TLS layer for that
    connection as the relay follows it: an open session of its own, TunnelLayer's methods (the
    plaintext reaches the relay through `event_to_child`, `tls_event_to_child`)."""
    return (
        type(layer) is ServerTLSLayer
        and layer.conn is server
        and layer.tunnel_connection is server
        and layer.tunnel_state is _OPEN
        and not layer.__dict__.keys() & client_tls.OVERRIDDEN
    )


def _passes_on(obj: Any, child: Any, flow: http.HTTPFlow) -> bool:
    """Whether `obj`, above the HTTP layer, is a TLS layer for a server connection other than
    the flow's, which hands the flow's reads down and its client's writes up unchanged: reverse
    mode keeps one for its own upstream connection, never opened (INACTIVE) when the HTTP layer
    opens the flow's. While its own handshake runs it holds every event back: not then."""
    return (
        type(obj) is ServerTLSLayer
        and obj.child_layer is child
        and obj.conn is not flow.server_conn
        and obj.conn is not flow.client_conn
        and obj.tunnel_state is not _ESTABLISHING
        and not obj.__dict__.keys() & client_tls.OVERRIDDEN
    )


def _delegates(obj: Any, child: Any) -> bool:
    """Whether `obj` hands every event to `child` unchanged (mitmproxy's layers that are done
    deciding replace their `_handle_event` with the child's `handle_event`)."""
    handle = obj.__dict__.get("_handle_event")
    return (
        child is not None
        and getattr(handle, "__self__", None) is child
        and getattr(handle, "__name__", "") == "handle_event"
    )


class Relay:
    """Arms a relay for each response that starts streaming (`hopmeter run` only), once the fast
    paths are installed (`started`); counts the responses it leaves to mitmproxy, and why."""

    def __init__(self, on_fault: OnFault) -> None:
        self.on_fault = on_fault
        self.connections: dict[Any, Any] | None = None
        self.on = False  # the fast paths are installed: arm relays
        self.off_because: str | None = None  # the version gate's line, when it turned them off
        self.h2_upstream = False  # arm relays behind HTTP/2 upstreams too
        self.h2_off_because: str | None = None  # the version gate's line for those alone
        self.own_steps = False  # HTTP/2 DATA frames' steps by h2_frames, not h2
        self.steps_off_because: str | None = None  # the version gate's line for those
        # with the relay off (--no-relay): the gate's line when it kept the mends off too
        self.mend_off_because: str | None = None

    def load(self, loader: Loader) -> None:
        declare(loader, RELAY)

    def started(self, off_because: str | None) -> None:
        """The fast paths were installed (None), or the version gate kept them off (its line)."""
        self.on = off_because is None
        self.off_because = off_because
        self.h2_off_because = gate.check_h2_upstream() if self.on else None
        self.h2_upstream = self.on and self.h2_off_because is None
        self.steps_off_because = gate.check_h2_frames() if self.on else None
        self.own_steps = self.on and self.steps_off_because is None

    def running(self) -> None:
        self.connections = connection_handlers()
        offs = (self.off_because, self.h2_off_because, self.steps_off_because)
        for off in (*offs, self.mend_off_because):
            if off is not None:
                log.warning(off)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if not ctx.options.hopmeter_relay or flow.response is None:
            return
        if not self.on:
            if self.off_because is not None:
                STATS.declined[VERSION] += 1
            return
        if self.connections is None:
            return
        try:
            handler = self.connections.get(flow.client_conn.id)
            relay = arm(flow, handler, self.on_fault, self.h2_upstream, self.own_steps)
            if isinstance(relay, BodyRelay):
                up = relay.up
                if up is not None:  # an HTTP/2 upstream: one relay for all its streams
                    up.add(relay)
                    flow.server_conn.__dict__[_KEY] = up
                else:
                    if relay.up_tls is None:  # a TLS upstream's reads are ciphertext till read
                        _shortcut(relay.handler, flow.server_conn)
                    flow.server_conn.__dict__[_KEY] = relay
                STATS.armed += 1
            else:
                STATS.declined[relay] += 1
        except Exception as exc:  # never in the flow's way: mitmproxy's layers move it
            with contextlib.suppress(Exception):
                self.on_fault(flow, exc, False)

    def response(self, flow: http.HTTPFlow) -> None:
        _disarm(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        _disarm(flow)

    def done(self) -> None:
        """The proxy stops: every relay steps aside, so that no read moves past mitmproxy's
        layers once the flows in flight are recorded as ended (`shutdown`). mitmproxy's layers
        take the reads that come while the process writes what it holds, and its connections
        close with their tasks, as without the relay: the client sees its stream cut where the
        record ends, never bytes the record does not count."""
        stopped = stop_all(self.connections)
        if stopped:
            log.debug(f"hopmeter: {stopped} relays stopped with the proxy")


def stop_all(connections: dict[Any, Any] | None) -> int:
    """Mark every armed relay of these connection handlers dead (mitmproxy's layers move every
    read from now on); how many there were. Never raises."""
    stopped = 0
    for handler in list((connections or {}).values()):
        try:
            for conn in list(handler.transports):
                relay = conn.__dict__.get(_KEY)
                if relay is None:
                    continue
                relay.dead = True
                stopped += 1
                for each in getattr(relay, "flows", {}).values():  # an HTTP/2 upstream's streams
                    each.dead = True
        except Exception as exc:  # a handler not as read: its relays, if any, end with the loop
            log.debug(f"hopmeter: stopping a connection's relay: {type(exc).__name__}: {exc}")
    return stopped


def _disarm(flow: http.HTTPFlow) -> None:
    """The flow's response is over: its relay goes (from an HTTP/2 upstream: its stream's, and
    the connection's with its last stream)."""
    kept = flow.server_conn.__dict__
    up = kept.get(_KEY)
    if type(up) is H2Upstream:
        for ours, relay in list(up.flows.items()):
            if relay.flow is flow:
                del up.flows[ours]
        if up.flows:
            return
    kept.pop(_KEY, None)


def install() -> None:
    """Put the relay's `server_event` in front of mitmproxy's (`hopmeter run` only)."""
    ConnectionHandler.server_event = server_event  # type: ignore[method-assign]
    ServerTLSLayer.event_to_child = tls_event_to_child  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `server_event` is not mitmproxy's own."""
    return ConnectionHandler.server_event is not _MITMPROXY_SERVER_EVENT


def uninstall() -> None:
    """mitmproxy's own method again (tests)."""
    ConnectionHandler.server_event = _MITMPROXY_SERVER_EVENT  # type: ignore[method-assign]
    if _TLS_TO_CHILD_OWN:
        ServerTLSLayer.event_to_child = _MITMPROXY_TLS_TO_CHILD  # type: ignore[method-assign]
    elif "event_to_child" in ServerTLSLayer.__dict__:  # TunnelLayer's again, inherited
        del ServerTLSLayer.event_to_child
