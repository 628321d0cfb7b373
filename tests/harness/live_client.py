"""A client connection as mitmproxy holds it, in process: real sockets, mitmproxy's own handler.

A `ProxyConnectionHandler` is built around a real accepted loopback connection and registered with
a real `Proxyserver`, as mitmproxy does for every client, so code that reaches the client's
transport through mitmproxy finds it; the peer is a plain socket the test reads, or does not read.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mitmproxy import http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.mode_servers import ProxyConnectionHandler
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow

from hopmeter.core.vocab import EventLoop
from hopmeter.proxy.run.loops import loop_factory


@dataclass
class Live:
    """A client connection as mitmproxy holds it, and the client's own socket."""

    proxyserver: Proxyserver
    handler: ProxyConnectionHandler
    writer: asyncio.StreamWriter
    peer: socket.socket
    tctx: Any  # mitmproxy's test context, to configure the addons in it


@asynccontextmanager
async def live_client(rcvbuf: int = 0, *addons: Any) -> AsyncIterator[Live]:
    """mitmproxy's handler for one real loopback connection, registered as the proxy does;
    `addons` join the proxyserver in mitmproxy's test context."""
    proxyserver = Proxyserver()
    with (
        taddons.context(proxyserver, *addons) as tctx,
        socket.create_server(("127.0.0.1", 0)) as server,
    ):
        peer = socket.socket()
        if rcvbuf:
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        peer.connect(server.getsockname())
        accepted, _ = server.accept()
        reader, writer = await asyncio.open_connection(sock=accepted)
        mode = ProxyMode.parse("regular")
        handler = ProxyConnectionHandler(tctx.master, reader, writer, tctx.options, mode)
        proxyserver.connections[handler.client.id] = handler
        try:
            yield Live(proxyserver, handler, writer, peer, tctx)
        finally:
            writer.close()
            peer.close()


def run(test: Callable[[], Coroutine[Any, Any, None]], loop: str = "asyncio") -> None:
    """Run an async test on a fresh loop of the kind `hopmeter run --loop LOOP` makes."""
    asyncio.run(test(), loop_factory=loop_factory(EventLoop(loop)))


def flow_of(live: Live) -> http.HTTPFlow:
    """A flow on the live client connection."""
    flow = tflow.tflow(resp=True)
    flow.client_conn = live.handler.client
    return flow


def unread(sock: socket.socket) -> bytes:
    """Everything the peer can read now."""
    sock.setblocking(False)
    got = bytearray()
    try:
        while data := sock.recv(1 << 20):
            got += data
    except BlockingIOError:
        pass
    return bytes(got)
