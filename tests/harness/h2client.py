"""A minimal HTTP/2 client over TLS (ALPN h2 only), built on the h2 library, for streaming tests.

httpx offers "http/1.1" first in ALPN, so a proxy that honours the client's order picks HTTP/1.1;
this client offers h2 alone and yields each DATA frame's payload as it arrives.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events


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
