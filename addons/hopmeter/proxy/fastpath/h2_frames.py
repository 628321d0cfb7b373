"""An HTTP/2 DATA frame's steps in h2, taken without h2's generic machinery, when they only move
bytes and windows: what the relay does for each piece it moves on an HTTP/2 connection.

h2 is correct and general, and pays for it per frame: for a DATA frame received it builds a
hyperframe `DataFrame` out of its receive buffer, runs the connection's and the stream's state
machines (each transition a dict lookup keyed by two enums, hashed in Python), makes a
`DataReceived` event and, for the acknowledgement, looks the stream up again; for one it sends it
runs both state machines, makes and serializes a `DataFrame` and copies the bytes through its send
buffer. With the caches cold, as between two events of a paced stream, that was ~63 µs for a
received frame and its acknowledgement and ~38 µs for a sent frame, against ~11 and ~10 µs for
the steps here (bench/micro_h2.py, `micro-h2-20261206T074019Z.json`): h2 took more than half of
what bare mitmproxy spends per event on HTTP/2. For the frames the relay
moves (a DATA frame with no flag, on an open stream, within every window and the frame size) each
of those steps leaves the state as it was or changes a counter, and this module does just that:

- `received` is `H2Connection._receive_data_frame` and `acknowledge_received_data` for such a
  frame: the connection's and the stream's windows consumed, the stream's received length counted,
  then the bytes handed to the window managers as processed, and the WINDOW_UPDATE frames they ask
  for (h2's own `process_bytes` decides) added to what the connection has to send;
- `send` is `BufferedH2Connection.send_data` for a piece that fits at once: the two outbound
  windows lowered and the frame's nine header bytes put in front of the piece, after whatever the
  connection already had to send. Anything else (a piece over the frame size or a window, data
  already buffered for the stream, a stream not open for sending) returns None and goes to h2.

The state machines are not run: in the states these paths require, h2's transition for the input
keeps the state (`check` holds the tables to that). What each path mirrors is fingerprinted by the
version gate (hopmeter.proxy.fastpath.gate's `MIRRORED_H2_FRAMES`); when h2's code differs, the
relay calls h2 for every frame, as before. tests/proxy/fastpath/test_h2_frames.py holds both paths
to h2's own: the same bytes out, the same windows and counts after any sequence of frames.
"""

from __future__ import annotations

from typing import Any

from hopmeter.proxy.fastpath.internals import (
    H2ConnectionInputs,
    H2ConnectionState,
    H2ConnectionStateMachine,
    H2StreamInputs,
    H2StreamState,
    H2StreamStateMachine,
    h2_stream_transitions,
)

# the states the paths run in, each kept by its input (`check`)
SENDING = (H2StreamState.OPEN, H2StreamState.HALF_CLOSED_REMOTE)  # SEND_DATA keeps them
RECEIVING = (H2StreamState.OPEN, H2StreamState.HALF_CLOSED_LOCAL)  # RECV_DATA keeps them
_SERVER_OPEN = H2ConnectionState.SERVER_OPEN  # a proxy's connection to its HTTP/2 client
_HEADER_FLAGS = b"\x00\x00"  # a DATA frame's type (0) and flags (none)
_WINDOW_UPDATE = b"\x00\x00\x04\x08\x00"  # length 4, type WINDOW_UPDATE, no flags


def check() -> str | None:
    """None when h2's state machines keep each state these paths run in for the input they skip;
    else what differs."""
    conn = H2ConnectionStateMachine._transitions
    kept = [
        conn.get((state, step)) == (None, state)
        for state, step in (
            (H2ConnectionState.SERVER_OPEN, H2ConnectionInputs.SEND_DATA),
            (H2ConnectionState.CLIENT_OPEN, H2ConnectionInputs.RECV_DATA),
        )
    ]
    table = h2_stream_transitions
    kept += [table.get((state, H2StreamInputs.SEND_DATA)) == (None, state) for state in SENDING]
    kept += [
        table.get((state, H2StreamInputs.RECV_DATA)) == (H2StreamStateMachine.data_received, state)
        for state in RECEIVING
    ]
    return None if all(kept) else "h2's state machines are not the ones the DATA frame path skips"


def send(conn: Any, stream_id: int, data: bytes) -> bytes | None:
    """What `conn` (mitmproxy's BufferedH2Connection to a client) sends for `data` on its stream
    `stream_id`, as `send_data` then `data_to_send` give it; None, with nothing changed, when the
    piece is not one that fits at once (then h2 sends it)."""
    n = len(data)
    stream = conn.streams.get(stream_id)
    if (
        stream is None
        or not 0 < n <= conn.max_outbound_frame_size
        or n > conn.outbound_flow_control_window
        or n > stream.outbound_flow_control_window
        or stream.state_machine.state not in SENDING
        or conn.state_machine.state is not _SERVER_OPEN
        or conn.stream_buffers.get(stream_id)
    ):
        return None
    conn.outbound_flow_control_window -= n
    stream.outbound_flow_control_window -= n
    frame = n.to_bytes(3) + _HEADER_FLAGS + stream_id.to_bytes(4) + data
    pending = conn._data_to_send
    if pending:  # frames h2 queued before this one go first
        conn._data_to_send = bytearray()
        return bytes(pending) + frame
    return frame


def received(conn: Any, frames: list[tuple[Any, int]]) -> None:
    """Take in a read's DATA frames, each (its stream, its length) with no flag (each stream open
    for receiving with its headers received, each frame within both windows and its stream's
    declared length: the caller checked), then acknowledge them, as h2's `receive_data` of the
    read then `acknowledge_received_data` of each do: the WINDOW_UPDATE frames that asks for join
    what `conn` has to send (`data_to_send`)."""
    whole = conn._inbound_flow_control_window_manager
    for stream, n in frames:
        whole.current_window_size -= n
        stream._inbound_window_manager.current_window_size -= n
        stream._actual_content_length += n
    out = b""
    for stream, n in frames:
        increment = whole.process_bytes(n)
        if increment:
            out += _WINDOW_UPDATE + b"\x00\x00\x00\x00" + increment.to_bytes(4)
        increment = stream._inbound_window_manager.process_bytes(n)
        if increment:
            out += _WINDOW_UPDATE + stream.stream_id.to_bytes(4) + increment.to_bytes(4)
    if out:
        conn._data_to_send += out
