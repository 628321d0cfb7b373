"""The client's side of a flow: its transport, its queues, and the bytes written to it.

mitmproxy gives addons no "these bytes left the socket" hook (docs/design.md §9). Its proxy server
keeps every live connection's handler in `Proxyserver.connections`, keyed by the client's id, and
each handler keeps an `asyncio.StreamWriter` per connection in `transports`; every byte sent to the
client goes through that writer's `write` (mitmproxy/proxy/server.py, `server_event`), and the
connection ends through its `close`. `ConnTracker` puts a counting wrapper on that one writer
instance and samples its transport's user-space buffer and the kernel's unsent queue
(SIOCOUTQNSD); hopmeter.core.ledger does the arithmetic. The handler table (and, for HTTP/2, the
client's stream buffers) is found through hopmeter.proxy.fastpath.internals, where every private
name of mitmproxy that hopmeter imports lives.

The writer is a plain Python object on both of `hopmeter run`'s loops, so the same wrapper follows
asyncio's selector transports and uvloop's compiled ones. Both write to the socket at once while
nothing waits and keep the rest in a user-space buffer (`get_write_buffer_size`); both keep the
socket open after `close` until that buffer is flushed. asyncio's socket object reads -1 once
closed; uvloop's keeps the number, so there the socket's inode, taken when following begins,
tells an open socket from a later connection given the same number.

The path was read in mitmproxy 10.4.2, 11.0.2, 11.1.3 and 12.3.1 and is the same in all four. It is
private, so every step is checked: a mitmproxy whose major version was not read, a different
registry, a writer that is not an asyncio stream (WireGuard, local and TUN modes), or a `write`
someone else already wrapped all give "not measured" with the reason, never a guess. The wrapper
calls the real `write` first and lets nothing escape: mitmproxy catches an exception there and
skips the rest of that event's commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import socket
import struct
import sys
import termios
from collections import deque
from collections.abc import Callable
from typing import Any

from mitmproxy import http, version

from hopmeter.clock import MONOTONIC, Clock
from hopmeter.core.ledger import GONE, T_IN, Ledger, N
from hopmeter.proxy.fastpath.internals import connection_handlers

# Linux ioctls on a TCP socket (include/uapi/linux/sockios.h): bytes in the send queue that the
# peer has not acknowledged (SIOCOUTQ, = TIOCOUTQ), and those not yet sent at all (SIOCOUTQNSD).
SIOCOUTQ = termios.TIOCOUTQ
SIOCOUTQNSD = 0x894B
_INT = struct.Struct("i")
_ZERO = bytes(_INT.size)
# struct tcp_info (include/uapi/linux/tcp.h): tcpi_rwnd_limited, µs the send was limited by the
# peer's receive window (Linux 4.10+), an unsigned 64-bit field at byte 176.
_RWND_LIMITED = struct.Struct("Q")
_RWND_LIMITED_AT = 176
_TCP_INFO_LEN = 232
# mitmproxy majors whose proxyserver → handler → transports → writer path was read (see above);
# pyproject pins 12, and hopmeter.proxy.fastpath.gate checks the minor and the code
TESTED_MAJORS = (12,)

# Look at a connection's queues this soon after a write that left bytes waiting, and every this
# often while they move: the resolution of an out or sent time seen by a sample.
POLL_FAST_S = 0.001
# While bytes wait and do not move, back off to this: a stuck client costs 125 looks a second.
POLL_STUCK_MAX_S = 0.008
# While nothing waits (the client keeps up), back off to this: ~16 looks a second for a flow
# whose chunks all went straight out (measured: 0.1-0.35 looks per chunk for fast readers).
POLL_IDLE_MAX_S = 0.064

OnFail = Callable[[str, BaseException], None]
Sock = Any  # socket.socket, asyncio's TransportSocket or uvloop's PseudoSocket
_SOCKET_TYPES = ("socket", "TransportSocket", "PseudoSocket")


def mitmproxy_major() -> int:
    """The running mitmproxy's major version."""
    return int(version.VERSION.split(".", 1)[0])


def locate(flow: http.HTTPFlow) -> tuple[Any, asyncio.StreamWriter, Sock] | str:
    """(handler, writer, socket) of a live flow's client connection, or why not."""
    if not sys.platform.startswith("linux"):
        return f"the kernel's send queue is read with Linux ioctls, not on {sys.platform}"
    if mitmproxy_major() not in TESTED_MAJORS:
        return f"mitmproxy {version.VERSION}: its client transports were not read yet"
    connections = connection_handlers()
    if connections is None:
        return "mitmproxy's proxyserver keeps no connections table"
    handler = connections.get(flow.client_conn.id)
    transports = getattr(handler, "transports", None)
    if not isinstance(transports, dict):
        return "no live connection handler for this client"
    writer = getattr(transports.get(flow.client_conn), "writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        return f"the client's writer is a {type(writer).__name__}, not an asyncio stream"
    transport = writer.transport
    if not callable(getattr(transport, "get_write_buffer_size", None)):
        return f"the client's transport is a {type(transport).__name__}"
    own = writer.__dict__.get("write")
    if own is not None and not isinstance(getattr(own, "__self__", None), ConnTracker):
        return "the client's writer.write is already wrapped by something else"
    sock = transport.get_extra_info("socket")
    if (
        type(sock).__name__ not in _SOCKET_TYPES
        or sock.type != socket.SOCK_STREAM
        or sock.fileno() < 0
    ):
        return "the client's connection has no open TCP socket"
    return handler, writer, sock


def _inode(sock: Sock) -> int | None:
    """The open socket's inode where its object keeps the number after closing (uvloop)."""
    if type(sock).__name__ != "PseudoSocket":
        return None  # socket.socket and asyncio's TransportSocket read -1 once closed
    return os.fstat(sock.fileno()).st_ino


def _ioctl(sock: Sock, request: int) -> int:
    value: int = _INT.unpack(fcntl.ioctl(sock.fileno(), request, _ZERO))[0]
    return value


def rwnd_limited_us(sock: Sock) -> int | None:
    """TCP_INFO's tcpi_rwnd_limited (µs), or None where the kernel does not report it."""
    if sock.fileno() < 0:
        return None
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    end = _RWND_LIMITED_AT + _RWND_LIMITED.size
    if len(raw) < end:
        return None
    value: int = _RWND_LIMITED.unpack_from(raw, _RWND_LIMITED_AT)[0]
    return value


class ConnTracker:
    """One client connection: its writer's write and close wrapped, its chunks followed.

    `poll` is called by hopmeter.proxy.delivery.lane.DeliveryLane (the poller); the rest by
    mitmproxy.
    """

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        sock: Sock,
        want: Callable[[ConnTracker, float, bool], None],
        on_fail: OnFail,
        h2conn: Any = None,
        *,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.writer = writer
        self.clock = clock  # the writes' times: the poller's clock (hopmeter.clock)
        self.transport: Any = writer.transport
        # The socket object, never its number: asyncio closes this object (fileno() then reads
        # -1), while a remembered number may already belong to the next accepted connection.
        # uvloop's object keeps the number: its inode says whether it is still this socket.
        self.sock = sock
        self._ino = _inode(sock)
        self.ledger = Ledger()
        self.h2conn = h2conn
        self.handed: dict[int, int] = {}  # HTTP/2 stream id -> bytes returned by its callable
        self._buffer_looks: dict[int, tuple[int, int]] = {}  # stream id -> (pieces, first's id)
        self.want = want  # the poller: look at this connection soon
        self.on_fail = on_fail
        self.outs: list[Any] = []  # FlowOuts of this connection not yet summarised
        self.broken: str | None = None
        self.active = False  # in the poller's set
        self.interval = 0.0
        self.due = 0.0
        self.last_poll = -math.inf  # none yet
        self.queued_at_close: int | None = None
        self.rwnd_at_close_us: int | None = None
        buf = getattr(self.transport, "_buffer", None)  # CPython's selector transport: a deque
        self._buf: deque[Any] | None = buf if isinstance(buf, deque) else None
        self._buffered_bytes: Callable[[], int] = self.transport.get_write_buffer_size
        self._write = writer.write
        self._close = writer.close
        writer.write = self.write  # type: ignore[method-assign]
        writer.close = self.close  # type: ignore[method-assign]

    # -- mitmproxy's calls -----------------------------------------------------------------------
    def write(self, data: Any) -> None:
        """writer.write: the real write first, then the count; nothing escapes."""
        self._write(data)
        try:
            led = self.ledger
            if led.armed is None:
                led.written += len(data)
            else:
                now = self.clock()
                buf = self._buf
                buffered = bool(buf) if buf is not None else self._buffered_bytes() > 0
                if led.wrote(len(data), now, buffered) and (buffered or not self.active):
                    self.want(self, now, buffered)  # a look soon; already due otherwise
            if led.held:
                self._released(self.clock())
        except Exception as exc:
            self.fail("counting a write", exc)

    def close(self) -> None:
        """writer.close: a last look at the queues (the socket goes once they are flushed)."""
        try:
            if self.broken is None and self.is_open():
                self.poll(self.clock())
                self.queued_at_close = self._user_bytes() + _ioctl(self.sock, SIOCOUTQ)
                self.rwnd_at_close_us = rwnd_limited_us(self.sock)
        except Exception as exc:
            self.fail("the last look before close", exc)
        self._close()

    # -- HTTP/2 ----------------------------------------------------------------------------------
    def h2_chunk(self, c: list[Any], sid: int) -> None:
        """An HTTP/2 chunk: written now if mitmproxy will frame it at once, else held.

        BufferedH2Connection.send_data frames a chunk at once only when the stream has nothing
        buffered and the flow-control window covers it; otherwise the chunk (or its tail) waits in
        `stream_buffers[sid]` until the client's WINDOW_UPDATE.
        """
        n = c[N]
        handed = self.handed.get(sid, 0) + n
        self.handed[sid] = handed
        h2c = self.h2conn
        led = self.ledger
        if sid not in led.held and not h2c.stream_buffers.get(sid):
            # h2's local_flow_control_window(sid), read inline: the smaller of the connection's
            # and the stream's send windows; a stream h2 no longer has goes to the method (which
            # raises, as before: FlowOut.chunk stops following the flow)
            stream = h2c.streams.get(sid)
            if stream is None:
                window = h2c.local_flow_control_window(sid)
            else:
                window = min(h2c.outbound_flow_control_window, stream.outbound_flow_control_window)
            if window >= n:
                led.arm(c)
                return
        led.hold(c, sid, handed)
        if c[GONE] is None:
            self.want(self, c[T_IN], False)

    def _released(self, now: float) -> None:
        """After a write: which held chunks did mitmproxy's stream buffers release into it?

        A buffer that still has as many pieces, the same one first, released nothing: only a
        changed buffer is summed (it can hold hundreds of pieces behind a slow reader, and this
        runs on every write of the connection while something is held).
        """
        h2c = self.h2conn
        buffers = h2c.stream_buffers
        led = self.ledger
        looked = self._buffer_looks
        for sid in list(led.held):
            pieces = buffers.get(sid)
            if pieces is None and _stream_reset(h2c, sid):
                # a reset drops the buffer unsent (BufferedH2Connection.reset_stream): never
                # infer "sent" from an empty buffer without knowing how the stream closed
                led.drop_stream(sid, "the HTTP/2 stream was reset with bytes held", now)
                looked.pop(sid, None)
                continue
            look = (len(pieces), id(pieces[0])) if pieces else (0, 0)
            if looked.get(sid) == look:
                continue
            looked[sid] = look
            queued = sum(len(piece.data) for piece in pieces) if pieces else 0
            if led.release(sid, self.handed.get(sid, 0) - queued, now):
                self.want(self, now, True)
            if sid not in led.held:
                looked.pop(sid, None)

    def stream_queued(self, sid: int) -> int:
        """Bytes of stream `sid` in mitmproxy's HTTP/2 stream buffer."""
        if self.h2conn is None:
            return 0
        return sum(len(piece.data) for piece in self.h2conn.stream_buffers.get(sid, ()))

    # -- the poller's calls ----------------------------------------------------------------------
    def poll(self, now: float) -> bool:
        """One look at the queues; True while some chunk still waits to be seen sent."""
        led = self.ledger
        prev, self.last_poll = self.last_poll, now
        led.disarm()  # a step that armed a chunk and wrote nothing has ended by now
        if self.broken is not None:
            return False
        if not self.is_open():
            self.give_up("the connection closed with bytes still queued", prev)
            return False
        user = self._user_bytes()
        unsent = _ioctl(self.sock, SIOCOUTQNSD) if led.user or led.kernel or user else 0
        moved = led.sample(now, prev, user, unsent)
        queued = user + unsent
        for out in self.outs:
            out.saw_queued(queued, self)
        if queued:  # bytes wait on the client: look again soon while they move
            self.interval = POLL_FAST_S if moved else min(self.interval * 2, POLL_STUCK_MAX_S)
        else:  # the client keeps up: look less and less often
            self.interval = min(max(self.interval, POLL_FAST_S) * 2, POLL_IDLE_MAX_S)
        return led.pending()

    def give_up(self, why: str, last: float) -> None:
        """Stop following this connection's chunks; what was seen stays."""
        self.ledger.give_up(why, last)
        if self.broken is None:
            self.broken = why

    def fail(self, where: str, exc: BaseException) -> None:
        """A bug in following: give the writer its own write and close back, and say so.

        Called from inside mitmproxy's write and close, so nothing here may raise either.
        """
        with contextlib.suppress(Exception):
            d = self.writer.__dict__
            d.pop("write", None)
            d.pop("close", None)
        if self.broken is None:
            self.broken = f"following the client's bytes failed ({where})"
        with contextlib.suppress(Exception):
            self.ledger.give_up(self.broken, self.last_poll)
        with contextlib.suppress(Exception):
            self.on_fail("delivery", exc)

    def is_open(self) -> bool:
        """Whether the socket followed is still open (and still this connection's)."""
        fd = self.sock.fileno()
        if fd < 0:
            return False
        if self._ino is None or not self.transport.is_closing():
            return True  # uvloop closes the socket only after its transport is closing
        try:
            return os.fstat(fd).st_ino == self._ino
        except OSError:
            return False

    def rwnd_limited_us(self) -> int | None:
        """The connection's TCP_INFO rwnd-limited time now, or at its close."""
        return rwnd_limited_us(self.sock) if self.is_open() else self.rwnd_at_close_us

    def _user_bytes(self) -> int:
        buf = self._buf
        if buf is not None and not buf:
            return 0
        return self._buffered_bytes()


def _stream_reset(h2conn: Any, sid: int) -> bool:
    """Whether HTTP/2 stream `sid` ended by a reset (or is gone, so nobody can tell)."""
    stream = h2conn.streams.get(sid)
    if stream is None:
        return True
    closed_by = getattr(stream.state_machine, "stream_closed_by", None)
    return closed_by is not None and str(getattr(closed_by, "name", "")).endswith("RST_STREAM")
