"""The private parts of mitmproxy, h11 and h2 that hopmeter reaches, imported here and nowhere else.

mitmproxy gives addons no way to the client's socket, to a connection's layers or to its
per-read steps; hopmeter's fast paths (relay, backpressure, framing) and its delivery lane
(hopmeter.proxy.delivery.conn) reach them by private names. Every import of such a name is in this
module (ruff's banned-api rule keeps them out of the rest of hopmeter.proxy), and every function
whose code the fast paths repeat or lean on is fingerprinted at start by
hopmeter.proxy.fastpath.gate. The names read were checked in mitmproxy 12.3.1, h11 0.16.0,
pyOpenSSL 26.4.0 (the client TLS layer's connection: `sendall`, `bio_read`, `get_shutdown`) and h2
4.3.0 to 4.4.1 (an HTTP/2 upstream's connection: its receive buffer, its streams' windows and
declared lengths).

Besides the names: how to find a live client's connection handler (`connection_handlers`), its
layers down to the HTTP layer (`layers_to_http`) and an HTTP/2 client's stream buffers
(`locate_h2`), each of which answers "none" rather than guess when a step is not as expected.
"""

from __future__ import annotations

from typing import Any

from h2.connection import ConnectionInputs as H2ConnectionInputs
from h2.connection import ConnectionState as H2ConnectionState
from h2.connection import H2Connection, H2ConnectionStateMachine
from h2.events import DataReceived as H2DataReceived
from h2.frame_buffer import FrameBuffer
from h2.stream import H2Stream, H2StreamStateMachine
from h2.stream import StreamInputs as H2StreamInputs
from h2.stream import StreamState as H2StreamState
from h2.stream import _transitions as h2_stream_transitions
from h2.windows import WindowManager
from h11._readers import ChunkedReader, ContentLengthReader, Http10Reader, chunk_header_re
from mitmproxy import ctx, http
from mitmproxy.proxy.commands import SendData
from mitmproxy.proxy.events import DataReceived
from mitmproxy.proxy.layer import CommandGenerator, Layer, NextLayer
from mitmproxy.proxy.layers.http import HttpClient, HttpLayer, HttpStream
from mitmproxy.proxy.layers.http._events import HttpEvent, ResponseData
from mitmproxy.proxy.layers.http._http1 import (
    Http1Client,
    Http1Connection,
    Http1Server,
    make_body_reader,
)
from mitmproxy.proxy.layers.http._http2 import Http2Client, Http2Connection, Http2Server
from mitmproxy.proxy.layers.http._http2 import StreamState as Http2StreamState
from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection
from mitmproxy.proxy.layers.tls import ClientTLSLayer, ServerTLSLayer, TLSLayer
from mitmproxy.proxy.mode_specs import ProxyMode, ReverseMode
from mitmproxy.proxy.server import ConnectionHandler, TimeoutWatchdog
from mitmproxy.proxy.tunnel import TunnelLayer, TunnelState
from OpenSSL import SSL

__all__ = [
    "SSL",
    "BufferedH2Connection",
    "ChunkedReader",
    "ClientTLSLayer",
    "CommandGenerator",
    "ConnectionHandler",
    "ContentLengthReader",
    "DataReceived",
    "FrameBuffer",
    "H2Connection",
    "H2ConnectionInputs",
    "H2ConnectionState",
    "H2ConnectionStateMachine",
    "H2DataReceived",
    "H2Stream",
    "H2StreamInputs",
    "H2StreamState",
    "H2StreamStateMachine",
    "Http1Client",
    "Http1Connection",
    "Http1Server",
    "Http2Client",
    "Http2Connection",
    "Http2Server",
    "Http2StreamState",
    "Http10Reader",
    "HttpClient",
    "HttpEvent",
    "HttpLayer",
    "HttpStream",
    "Layer",
    "NextLayer",
    "ProxyMode",
    "ResponseData",
    "ReverseMode",
    "SendData",
    "ServerTLSLayer",
    "TLSLayer",
    "TimeoutWatchdog",
    "TunnelLayer",
    "TunnelState",
    "WindowManager",
    "chunk_header_re",
    "connection_handlers",
    "h2_stream_transitions",
    "layers_to_http",
    "locate_h2",
    "make_body_reader",
]

# A handful of layers deep in every mode (mode layer, NextLayers, TLS, HTTP); the bound stops a
# cycle, should a layer ever point back up.
MAX_LAYERS = 16


def connection_handlers() -> dict[Any, Any] | None:
    """mitmproxy's live connection handler per client id (`Proxyserver.connections`), or None
    when the running mitmproxy keeps no such table."""
    connections = getattr(ctx.master.addons.get("proxyserver"), "connections", None)
    return connections if isinstance(connections, dict) else None


def layers_to_http(handler: Any) -> list[Any]:
    """A connection handler's layers from its root down to its HTTP layer, that one last:
    handler.layer → (NextLayer.layer | .child_layer)* → HttpLayer; empty when there is none (a
    TCP or DNS connection, a layer not decided yet)."""
    chain: list[Any] = []
    obj = getattr(handler, "layer", None)
    for _ in range(MAX_LAYERS):
        if obj is None:
            return []
        chain.append(obj)
        if isinstance(obj, HttpLayer):
            return chain
        obj = obj.layer if isinstance(obj, NextLayer) else getattr(obj, "child_layer", None)
    return []


def locate_h2(handler: Any, flow: http.HTTPFlow) -> tuple[Any, int] | str:
    """(mitmproxy's HTTP/2 connection to the client, the flow's stream id), or why not.

    The HTTP layer's (`layers_to_http`) `connections[client]` is the Http2Server whose
    `h2_conn` (a BufferedH2Connection) keeps each stream's unsent bytes in `stream_buffers`; the
    stream id is the key of `HttpLayer.streams` whose flow is this one.
    """
    chain = layers_to_http(handler)
    if not chain:
        return "no HTTP layer under this client's connection"
    obj = chain[-1]
    server = obj.connections.get(flow.client_conn)
    h2conn = getattr(server, "h2_conn", None) if isinstance(server, Http2Server) else None
    if not isinstance(getattr(h2conn, "stream_buffers", None), dict) or not callable(
        getattr(h2conn, "local_flow_control_window", None)
    ):
        return "no HTTP/2 connection with stream buffers for this client"
    for sid, stream in obj.streams.items():
        if getattr(stream, "flow", None) is flow:
            return h2conn, sid
    return "this flow's HTTP/2 stream was not found"
