"""A minimal HTTP/2 client over TLS (ALPN h2 only), built on the h2 library, for streaming tests.

httpx offers "http/1.1" first in ALPN, so a proxy that honours the client's order picks HTTP/1.1;
this client offers h2 alone and yields each DATA frame's payload as it arrives (`stream_post`), or
reads several streams of one connection, each at its own pace (`read_streams`).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings


def stream_post(
    host: str, port: int, path: str, body: bytes, timeout_s: float = 30.0
) -> Iterator[tuple[str, bytes]]:
    """POST over HTTP/2; yields ("status", b"200") once, then ("data", payload) per DATA frame."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection((host, port), timeout=timeout_s)
    sock = ctx.wrap_socket(raw, server_hostname=host)
    if sock.selected_alpn_protocol() != "h2":
        sock.close()
        raise AssertionError(f"server chose {sock.selected_alpn_protocol()!r}, not h2")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [
            (":method", "POST"),
            (":path", path),
            (":scheme", "https"),
            (":authority", f"{host}:{port}"),
            ("content-type", "application/json"),
        ],
    )
    conn.send_data(sid, body, end_stream=True)
    sock.sendall(conn.data_to_send())
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                    yield "status", dict(event.headers)[b":status"]
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    yield "data", event.data
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    return
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    raise AssertionError(f"stream reset: {event.error_code}")
            sock.sendall(conn.data_to_send())
    finally:
        sock.close()


# The window a stream read at once grants itself beyond the connection's setting (1 MiB).
OPEN_WINDOW = 1 << 20


@dataclass
class PacedStream:
    """One stream of `read_streams`: its path, how fast its reader consumes, what it saw."""

    path: str
    take_bytes: int = 0  # bytes consumed per tick; 0: everything at once, as it arrives
    every_s: float = 0.0
    body: bytearray = field(default_factory=bytearray)
    buffered: bytearray = field(default_factory=bytearray)  # arrived, not yet consumed
    ended: bool = False
    next_s: float = 0.0
    slept_pending_s: float = 0.0  # time between ticks while bytes already waited: its own wait


def read_streams(
    host: str, port: int, window: int, streams: list[PacedStream], timeout_s: float = 60.0
) -> list[PacedStream]:
    """GET every stream's path on one HTTP/2 connection whose streams announce `window` bytes.

    A paced stream consumes `take_bytes` every `every_s` and credits its stream window only for
    what it consumed, so the server's bytes wait for its window; a stream read at once grants
    itself `OPEN_WINDOW` more up front, as browsers do; the connection's window is credited at
    once, so one slow stream never stalls another.
    """
    sock = _connect(host, port, timeout_s)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
    )
    conn.initiate_connection()
    by_id: dict[int, PacedStream] = {}
    for st in streams:
        sid = conn.get_next_available_stream_id()
        head = [(":method", "GET"), (":path", st.path), (":scheme", "https")]
        conn.send_headers(sid, [*head, (":authority", f"{host}:{port}")], end_stream=True)
        if not st.take_bytes:
            conn.increment_flow_control_window(OPEN_WINDOW, stream_id=sid)
        by_id[sid] = st
    sock.sendall(conn.data_to_send())
    deadline = time.monotonic() + timeout_s
    try:
        while not all(st.ended and not st.buffered for st in streams):
            if time.monotonic() > deadline:
                raise AssertionError("streams did not finish in time")
            now = time.monotonic()
            for sid, st in by_id.items():
                _consume(conn, sid, st, now)
            sock.sendall(conn.data_to_send())
            waits = [st.next_s - now for st in streams if st.buffered and st.take_bytes]
            ready, _, _ = select.select([sock], [], [], max(0.0, min(waits, default=0.2)))
            if ready and not _receive(sock, conn, by_id):
                break
    finally:
        sock.close()
    return streams


def _connect(host: str, port: int, timeout_s: float) -> ssl.SSLSocket:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection((host, port), timeout=timeout_s)
    sock = ctx.wrap_socket(raw, server_hostname=host)
    if sock.selected_alpn_protocol() != "h2":
        sock.close()
        raise AssertionError(f"server chose {sock.selected_alpn_protocol()!r}, not h2")
    return sock


def _consume(conn: h2.connection.H2Connection, sid: int, st: PacedStream, now: float) -> None:
    """Consume what the stream's pace allows now, crediting its window for it."""
    if not st.buffered:
        return
    if not st.take_bytes:
        take = len(st.buffered)
    elif now >= st.next_s:
        if st.next_s:
            st.slept_pending_s += now - (st.next_s - st.every_s)
        take = min(st.take_bytes, len(st.buffered))
        st.next_s = now + st.every_s
    else:
        return
    st.body += st.buffered[:take]
    del st.buffered[:take]
    if not st.ended:
        conn.increment_flow_control_window(take, stream_id=sid)


def _receive(sock: ssl.SSLSocket, conn: h2.connection.H2Connection, by_id: dict[int, Any]) -> bool:
    """Read what arrived; False once the server closed the connection."""
    data = sock.recv(65536)
    if not data:
        return False
    for event in conn.receive_data(data):
        if isinstance(event, h2.events.DataReceived):
            by_id[event.stream_id].buffered += event.data
            if event.flow_controlled_length:  # the connection's window: credited at once
                conn.increment_flow_control_window(event.flow_controlled_length)
        elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
            by_id[event.stream_id].ended = True
    return True


def exchange(
    host: str, port: int, paths: list[str], timeout_s: float = 30.0
) -> dict[str, list[tuple[str, Any]]]:
    """POST to every path as streams of one HTTP/2 connection, opened together; what each
    stream saw, in order: ("status", code), ("data", payload) per DATA frame, ("trailers",
    fields), ("end", None), ("reset", error code), or ("closed", None) if the connection ended
    first. Returns once every stream ended or the connection did."""
    sock = _connect(host, port, timeout_s)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    body = b'{"model": "m", "stream": true}'
    seen: dict[int, list[tuple[str, Any]]] = {}
    for path in paths:
        sid = conn.get_next_available_stream_id()
        head = [(":method", "POST"), (":path", path), (":scheme", "https")]
        conn.send_headers(sid, [*head, (":authority", f"{host}:{port}")])
        conn.send_data(sid, body, end_stream=True)
        seen[sid] = []
    sock.sendall(conn.data_to_send())
    open_ = set(seen)
    try:
        while open_:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                for sid in open_:
                    seen[sid].append(("closed", None))
                break
            for event in conn.receive_data(data):
                sid = getattr(event, "stream_id", 0)
                if isinstance(event, h2.events.ResponseReceived):
                    seen[sid].append(("status", dict(event.headers)[b":status"]))
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    if event.data:
                        seen[sid].append(("data", event.data))
                elif isinstance(event, h2.events.TrailersReceived):
                    seen[sid].append(("trailers", event.headers))
                if isinstance(event, h2.events.StreamEnded):
                    seen[sid].append(("end", None))
                    open_.discard(sid)
                elif isinstance(event, h2.events.StreamReset) and sid in seen:
                    seen[sid].append(("reset", event.error_code))
                    open_.discard(sid)
            if out := conn.data_to_send():
                # a window update after the proxy closed (a cut): the close comes next
                with contextlib.suppress(ssl.SSLError, ConnectionError):
                    sock.sendall(out)
    finally:
        sock.close()
    return dict(zip(paths, seen.values(), strict=True))
