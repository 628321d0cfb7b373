"""The relay behind an HTTP/2 upstream in TLS: its DATA frames moved past mitmproxy's layers.

mitmproxy keeps one HTTP/2 connection to an upstream for every stream a client opens towards it,
and its `Http2Client` feeds each read's plaintext to that connection's h2 state machine
(`BufferedH2Connection.receive_data`). For every DATA frame h2 gives back a `DataReceived`;
`Http2Connection.handle_h2_event` turns it into a `ResponseData` for the flow's HTTP stream (its
stream id mapped from mitmproxy's own to the HTTP layer's) and acknowledges the bytes
(`acknowledge_received_data`), and after the read whatever the connection has to send (window
updates) goes back to the upstream through its TLS layer. Each `ResponseData` then climbs the
layers to the flow's `HttpStream` and down to the client's connection, as it does from an HTTP/1
upstream.

`H2Upstream` is the relay of one such connection: the TLS layer hands it each read's plaintext
(hopmeter.proxy.fastpath.relay.tls_take), and it takes the read's leading whole DATA frames when
mitmproxy's layers would only move them:

- each frame is a DATA frame with no flag (no padding, not the stream's end: the end, like
  every other frame, is mitmproxy's), with a payload, for a stream a relay was armed for
  (`BodyRelay`, one per flow), whose flow is where it would only be moved (the relay's own
  checks, as for an HTTP/1 upstream) and whose h2 stream can receive it: open, its window and
  the connection's not exceeded, no declared length passed, no frame over the connection's
  frame size; the connection itself open, nothing partial in its receive buffer, no stream
  queued for a free slot, its `Http2Client` not closed;
- those frames go to the connection's h2 state machine, as mitmproxy would feed them, which
  must give back exactly one `DataReceived` per frame; each is acknowledged, the client's
  `last_activity` (its keep-alive pings' clock) set, and what the connection has to send
  written to the upstream through its TLS connection, as mitmproxy's TLS layer sends it. Where
  the version gate allows (`own_steps`), hopmeter.proxy.fastpath.h2_frames takes h2's steps for
  them instead: the same windows, counts and WINDOW_UPDATE frames, without h2's frame objects,
  state machines and events;
- each frame's data then goes to its flow's client as the relay delivers a piece
  (`BodyRelay._deliver`: the stream callable, the client's framing, its writer).

The rest of the read, from the first frame that is not such a frame, goes on to mitmproxy's
HTTP/2 client, as it would have. A read taken in part leaves the connection's receive buffer
empty, so mitmproxy's h2 reads the rest from a frame's start.

It fails closed as the relay does: a fault in the checks or the scan leaves the read to
mitmproxy (and the connection's relay steps aside for good); from the h2 state machine on, a
fault cuts the client connection of every stream whose frames were in the read (`BodyRelay.cut`),
and one in a flow's delivery cuts that flow's.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from hopmeter.proxy.fastpath import h2_frames
from hopmeter.proxy.fastpath.client_tls import send as send_tls
from hopmeter.proxy.fastpath.internals import (
    H2ConnectionState,
    H2DataReceived,
    H2StreamState,
    Http2StreamState,
    TunnelState,
)

_OPEN_TUNNEL = TunnelState.OPEN
_OPEN_CONNECTION = H2ConnectionState.CLIENT_OPEN
_RECEIVING = (H2StreamState.OPEN, H2StreamState.HALF_CLOSED_LOCAL)  # RECV_DATA allowed
_HEADERS_RECEIVED = Http2StreamState.HEADERS_RECEIVED
_H2DataReceived = H2DataReceived
_FRAME_HEADER = 9  # length (3), type, flags, stream id (4)
_DATA = 0  # the DATA frame's type
_STREAM_ID = 0x7FFFFFFF  # the stream id's bits (the top bit is reserved)


class H2Upstream:
    """The relays of one HTTP/2 upstream connection in TLS, by mitmproxy's stream id on it."""

    __slots__ = ("client", "dead", "flows", "h2", "handler", "own_steps", "up_tls", "writer")

    def __init__(
        self, *, handler: Any, up_tls: Any, client: Any, writer: Any, own_steps: bool = False
    ) -> None:
        self.handler = handler
        self.up_tls = up_tls  # mitmproxy's ServerTLSLayer: its plaintext reaches `take`
        self.client = client  # mitmproxy's Http2Client for the connection
        self.h2: Any = client.h2_conn  # its BufferedH2Connection
        self.writer = writer  # the upstream connection's writer (window updates)
        self.flows: dict[int, Any] = {}  # mitmproxy's stream id -> the flow's BodyRelay
        self.dead = False  # a fault in the checks: mitmproxy's layers move every read
        # the frames' steps taken by h2_frames rather than by h2 (the version gate's
        # `check_h2_frames`): the same state and bytes, a fraction of the work
        self.own_steps = own_steps

    def add(self, relay: Any) -> None:
        """Relay the body of `relay`'s flow, a stream of this connection."""
        self.flows[relay.ours] = relay

    def take(self, handler: Any, data: bytes) -> int:
        """Move the read's leading DATA frames that mitmproxy's layers would only move; how many
        bytes of `data` are done with (moved, or gone with the client connections a fault cut).
        The rest is for mitmproxy's HTTP/2 client. Never raises."""
        try:  # "check", "split": nothing changed yet
            taken = self._frames(handler, data)
            if not taken:
                return 0
        except Exception as exc:  # mitmproxy's layers move this read, and every later one
            self.fail(exc)
            return 0
        used = taken[-1][2]
        try:  # "commit": the frames into the connection's h2, as mitmproxy feeds them
            pieces = self._receive(data, taken)
        except Exception as exc:
            for relay, *_ in taken:
                relay.cut(exc)
            return used
        for (relay, writer, _, _), piece in zip(taken, pieces, strict=True):
            if relay.cut_at is None:  # else its client's connection is gone, and this with it
                try:
                    relay._deliver([piece], writer)
                except Exception as exc:
                    relay.cut(exc)
        return used

    def _frames(self, handler: Any, data: bytes) -> list[tuple[Any, Any, int, int]]:
        """The read's leading frames the relay takes: (the flow's relay, its client's writer,
        where the frame ends in `data`, its payload's length) for each."""
        if self.dead or handler is not self.handler:
            return []
        up = self.up_tls
        if up.tunnel_state is not _OPEN_TUNNEL or up._event_queue:
            return []
        client = self.client
        h2 = self.h2
        buffered = h2.incoming_buffer
        if (
            "_handle_event" in client.__dict__  # closed: mitmproxy's `done` answers every event
            or client.stream_queue
            or client.h2_conn is not h2
            or h2.state_machine.state is not _OPEN_CONNECTION
            or buffered._data
            or buffered._headers_buffer
        ):
            return []
        max_frame = h2.max_inbound_frame_size
        room = h2.inbound_flow_control_window
        taken: list[tuple[Any, Any, int, int]] = []
        ready: dict[int, tuple[Any, Any]] = {}  # stream id -> (relay, writer), once per read
        rooms: dict[int, int] = {}
        pos, size = 0, len(data)
        while pos + _FRAME_HEADER <= size:
            length = int.from_bytes(data[pos : pos + 3])
            end = pos + _FRAME_HEADER + length
            if data[pos + 3] != _DATA or data[pos + 4] or not length or end > size:
                break
            if length > max_frame or length > room:
                break
            sid = int.from_bytes(data[pos + 5 : pos + 9]) & _STREAM_ID
            seen = ready.get(sid)
            if seen is None:
                seen = ready[sid] = self._ready(sid, client, h2)
                rooms[sid] = _room(h2.streams[sid]) if seen[1] is not None else 0
            relay, writer = seen
            if writer is None or length > rooms[sid]:
                break
            rooms[sid] -= length
            room -= length
            taken.append((relay, writer, end, length))
            pos = end
        return taken

    def _ready(self, sid: int, client: Any, h2: Any) -> tuple[Any, Any]:
        """(the relay of stream `sid`, its client's writer when mitmproxy's layers would only
        move a piece of its body now, else None)."""
        relay = self.flows.get(sid)
        if relay is None or relay.dead:
            return relay, None
        stream = h2.streams.get(sid)
        if (
            stream is None
            or stream.state_machine.state not in _RECEIVING
            or client.streams.get(sid) is not _HEADERS_RECEIVED
            or client.their_stream_id.get(sid) != relay.sid
            or not stream.state_machine.headers_received
        ):
            return relay, None
        return relay, relay._ready_down()

    def _receive(self, data: bytes, taken: list[tuple[Any, Any, int, int]]) -> list[bytes]:
        """What mitmproxy's HTTP/2 client does with the read's whole DATA frames `taken`, up to
        their pieces (each frame's data): the frames through the connection's h2 (each
        acknowledged), the keep-alive clock set, and what the connection has to send written
        upstream. By h2_frames' steps, or by h2's own (its events checked: one DataReceived per
        frame)."""
        h2 = self.h2
        if self.own_steps:
            streams = h2.streams
            h2_frames.received(h2, [(streams[relay.ours], n) for relay, _, _, n in taken])
            self.client.last_activity = time.time()
            if h2._data_to_send:
                send_tls(self.up_tls.tls, h2.data_to_send(), self.writer)
            return [data[end - n : end] for _, _, end, n in taken]
        events: list[Any] = h2.receive_data(data[: taken[-1][2]])
        if len(events) != len(taken):
            raise RuntimeError(f"h2 gave {len(events)} events for {len(taken)} DATA frames")
        for (relay, *_), event in zip(taken, events, strict=True):
            if (
                type(event) is not _H2DataReceived
                or event.stream_id != relay.ours
                or event.stream_ended is not None
            ):
                raise RuntimeError(f"h2 gave {event!r} for a DATA frame")
        self.client.last_activity = time.time()
        for event in events:
            h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        out = h2.data_to_send()
        if out:
            send_tls(self.up_tls.tls, out, self.writer)
        return [event.data for event in events]

    def fail(self, exc: BaseException) -> None:
        """A fault before anything of a read changed: this connection's relay steps aside, and
        mitmproxy's layers move the read and every later one."""
        self.dead = True
        relay = next(iter(self.flows.values()), None)
        if relay is not None:
            relay.fail(exc)

    def cut(self, exc: BaseException) -> None:
        """A fault once a read was under way, when which streams it carried is not known: every
        relayed stream's client connection is cut."""
        self.dead = True
        for relay in list(self.flows.values()):
            with contextlib.suppress(Exception):
                relay.cut(exc)


def _room(stream: Any) -> int:
    """How many more bytes h2 accepts on `stream` before one of its checks fails: its window,
    and its declared length (content-length) if it has one."""
    room: int = stream.inbound_flow_control_window
    expected = stream._expected_content_length
    if expected is not None:
        room = min(room, expected - stream._actual_content_length)
    return room
