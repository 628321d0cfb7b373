"""Tests for hopmeter.proxy.fastpath.connections: on mitmproxy's own HttpLayer, which upstream
connections are let go of; a read loop ended by an exception closes its connection; and
`hopmeter run` with HTTP/2 clients whose upstream was down, closes its connections, or that
drop mid-stream."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from mitmproxy import options
from mitmproxy.connection import ConnectionState, Server
from mitmproxy.proxy import context
from mitmproxy.proxy.layers.http import HttpLayer, HTTPMode, HttpStream
from mitmproxy.proxy.server import ConnectionHandler
from mitmproxy.test import tflow

from hopmeter.proxy.fastpath import connections
from tests.harness.procs import free_port, measuring, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream


def _server(
    state: ConnectionState, ended: bool, error: str | None = None, connected: bool = False
) -> Server:
    conn = Server(address=("127.0.0.1", 9000))
    conn.state = state
    conn.timestamp_end = 1.7e9 if ended else None
    conn.error = error
    conn.timestamp_tcp_setup = 1.7e9 if connected or ended else None
    return conn


def _layer() -> HttpLayer:
    ctx = context.Context(tflow.tclient_conn(), options.Options())
    ctx.server = Server(address=("127.0.0.1", 9000))
    return HttpLayer(ctx, HTTPMode.regular)


def test_only_connections_over_for_good_and_named_by_no_step_are_let_go() -> None:
    """Closed both ways and finished by the handler, or failed to connect without a socket: let
    go. Open, half closed, closed but not yet finished, failed with a socket whose read loop has
    not ended (a TLS failure: an event for it is still to come), the layer's own context
    connection, one waiting to be established (failed, its answer not yet given), one a stream
    still names: kept. A layer with only its client connection is left as it is."""
    layer = _layer()
    done = [_server(ConnectionState.CLOSED, ended=True) for _ in range(3)]
    done.append(_server(ConnectionState.CLOSED, ended=False, error="Connect call failed"))
    kept = {
        "open": _server(ConnectionState.OPEN, ended=False),
        "half closed": _server(ConnectionState.CAN_WRITE, ended=False),
        "closed, handler not done": _server(ConnectionState.CLOSED, ended=False),
        "named by a stream": _server(ConnectionState.CLOSED, ended=True),
        "waiting": _server(ConnectionState.CLOSED, ended=False, error="Connect call failed"),
        # a TLS handshake that failed: its error is set, its read loop's ConnectionClosed to come
        "tls failed, loop not ended": _server(
            ConnectionState.CLOSED, ended=False, error="certificate verify failed", connected=True
        ),
    }
    layer.context.server.state, layer.context.server.timestamp_end = ConnectionState.CLOSED, 1.0
    for conn in [*done, *kept.values(), layer.context.server]:
        layer.connections[conn] = object()  # the connection's layer stack
    stream = HttpStream(layer.context.fork(), 1)
    stream.context.server = kept["named by a stream"]
    layer.streams[1] = stream
    layer.waiting_for_establishment[kept["waiting"]].append(object())
    assert connections.over(layer) == done

    alone = _layer()
    alone.connections[alone.context.client] = object()
    assert connections.over(alone) == []


def test_the_step_prunes_then_runs_mitmproxys_method_and_a_fault_changes_nothing() -> None:
    """The step lets go of what `over` names, then hands the request to mitmproxy's own
    `get_connection` unchanged; a fault in it is reported and mitmproxy's method still runs."""
    calls: list[tuple[Any, Any, bool]] = []
    errors: list[str] = []
    original = connections._MITMPROXY_GET_CONNECTION
    connections._MITMPROXY_GET_CONNECTION = lambda s, e, reuse=True: calls.append((s, e, reuse))
    try:
        step = connections.make_get_connection(lambda where, exc: errors.append(where))
        layer = _layer()
        live = _server(ConnectionState.OPEN, ended=False)
        for conn in (live, _server(ConnectionState.CLOSED, ended=True)):
            layer.connections[conn] = object()
        step(layer, "event", reuse=False)
        assert list(layer.connections) == [live] and calls == [(layer, "event", False)]
        assert errors == []

        broken: Any = type("Broken", (), {"connections": property(lambda _: 1 / 0)})()
        step(broken, "event")
        assert errors == ["connections"] and calls[-1] == (broken, "event", True)
    finally:
        connections._MITMPROXY_GET_CONNECTION = original


def test_install_puts_both_in_front_and_uninstall_takes_them_away() -> None:
    connections.install(lambda where, exc: None)
    try:
        assert connections.installed()
        assert HttpLayer.get_connection is not connections._MITMPROXY_GET_CONNECTION
        assert ConnectionHandler.handle_connection is connections.handle_connection
    finally:
        connections.uninstall()
    assert not connections.installed()
    assert HttpLayer.get_connection is connections._MITMPROXY_GET_CONNECTION
    assert ConnectionHandler.handle_connection is connections._MITMPROXY_HANDLE_CONNECTION


class _Closing(BaseHTTPRequestHandler):
    """A small streamed reply, then the connection closed (`Connection: close`)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        del args


@contextmanager
def _upstream(port: int) -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Closing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


class _H2Session:
    """One HTTP/2 connection in TLS, requests one after another on it."""

    def __init__(self, port: int) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def post(self) -> int:
        conn, sid = self.conn, self.conn.get_next_available_stream_id()
        head = [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "https")]
        conn.send_headers(sid, [*head, (":authority", "localhost")])
        conn.send_data(sid, b'{"model": "m", "stream": true}', end_stream=True)
        self.sock.sendall(conn.data_to_send())
        status = 0
        while True:
            data = self.sock.recv(65536)
            assert data, "the proxy closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                    status = int(dict(event.headers)[b":status"])
                if isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    self.sock.sendall(conn.data_to_send())
                    return status
                if isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    return -1
            self.sock.sendall(conn.data_to_send())

    def close(self) -> None:
        self.sock.close()


@pytest.mark.integration
@pytest.mark.parametrize("relay", [(), ("--no-relay",)], ids=["relay", "no-relay"])
def test_an_http2_client_is_answered_again_once_its_upstream_is_back(
    tmp_path: Path, relay: tuple[str, ...]
) -> None:
    """An HTTP/2 client's connection whose first request found its upstream down (502): once
    the upstream listens, the next requests on the same connection reach it (mitmproxy alone
    answered every later request on that connection with the first one's connect error). The
    upstream closes each of its connections, so each request opens one: 20 of them on one client
    connection, every one answered; with the relay and without it."""
    port = free_port()
    with measuring(tmp_path, f"http://127.0.0.1:{port}", *relay) as proxy:
        session = _H2Session(proxy.port)
        try:
            assert session.post() == 502
            with _upstream(port):
                statuses = [session.post() for _ in range(20)]
        finally:
            session.close()
    assert statuses == [200] * 20


class _Writer:
    """A connection's writer: closed or not."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("raises", [asyncio.CancelledError, RuntimeError, None])
def test_a_read_loop_that_ends_by_an_exception_closes_its_connection(
    monkeypatch: pytest.MonkeyPatch, raises: type[BaseException] | None
) -> None:
    """mitmproxy's read loop ended by an exception (a cancel in its server_event) with its
    connection still among the transports: the writer is closed, the transport forgotten and
    the connection marked closed, and the exception goes on. One that ended as mitmproxy ends
    it is left as it is."""
    conn, writer = _server(ConnectionState.OPEN, ended=False), _Writer()
    handler: Any = SimpleNamespace(transports={conn: SimpleNamespace(writer=writer)})

    async def mitmproxys(self: Any, connection: Any) -> None:
        if raises is not None:
            raise raises()
        self.transports.pop(connection)  # what its own end does

    monkeypatch.setattr(connections, "_MITMPROXY_HANDLE_CONNECTION", mitmproxys)
    if raises is None:
        asyncio.run(connections.handle_connection(handler, conn))
        assert not writer.closed  # its own end closed it: nothing more
    else:
        with pytest.raises(raises):
            asyncio.run(connections.handle_connection(handler, conn))
        assert writer.closed and conn.state is ConnectionState.CLOSED  # never reused
    assert handler.transports == {}


def _drop_mid_stream(port: int, streams: int) -> None:
    """An HTTP/2 client in TLS: `streams` streams at once, the connection closed (no GOAWAY) once
    a few DATA frames came."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with ctx.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost"
    ) as sock:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        for _ in range(streams):
            sid = conn.get_next_available_stream_id()
            head = [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "https")]
            conn.send_headers(sid, [*head, (":authority", "localhost")])
            conn.send_data(sid, b'{"model": "m", "stream": true}', end_stream=True)
        sock.sendall(conn.data_to_send())
        frames = 0
        while frames < 5 and (data := sock.recv(65536)):
            frames += sum(isinstance(e, h2.events.DataReceived) for e in conn.receive_data(data))
            sock.sendall(conn.data_to_send())


async def _events(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream"})
    for _ in range(30):
        await ex.chunk(b'data: {"choices": [{"delta": {"content": "tok "}}]}\n\n')
        await asyncio.sleep(0.005)
    await ex.chunk(b"data: [DONE]\n\n")
    await ex.end()


@pytest.mark.integration
@pytest.mark.parametrize("relay", [(), ("--no-relay",)], ids=["relay", "no-relay"])
def test_http2_clients_that_drop_mid_stream_leave_no_upstream_connection_open(
    tmp_path: Path, relay: tuple[str, ...]
) -> None:
    """`hopmeter run` in front of an upstream that keeps connections alive: HTTP/2 clients
    that drop mid-stream, several at once, each with six streams (an upstream connection each).
    Once they are gone, every upstream connection is closed: none is left ESTABLISHED (they
    were, for good, one in a few: the process ran out of descriptors); with the relay and
    without it."""
    with (
        ScriptedUpstream(_events) as up,
        measuring(tmp_path, f"http://127.0.0.1:{up.port}", *relay) as p,
    ):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: _drop_mid_stream(p.port, 6), range(40)))
        assert len(up.requests) >= 40  # the streams reached the upstream
        wait_for(lambda: up.open_connections == 0, 20, "every upstream connection closed")
