"""A mitmproxy script for `hopmeter run --set scripts=...`: what stands where mitmproxy's own
methods stood, and which protocol reads each upstream connection, written as one JSON line per
finished flow to the file named by HOPMETER_TEST_PROBE."""

from __future__ import annotations

import json
import os
from typing import Any

from mitmproxy import ctx
from mitmproxy.proxy.layers.http import HttpLayer
from mitmproxy.proxy.layers.http._http1 import Http1Server
from mitmproxy.proxy.server import ConnectionHandler


def _where(method: Any) -> str:
    return f"{method.__module__}.{method.__qualname__}"


def response(flow: Any) -> None:
    """The classes' methods now, and the protocol of this flow's upstream connection."""
    handler = ctx.master.addons.get("proxyserver").connections[flow.client_conn.id]
    transport = handler.transports[flow.server_conn].writer.transport
    seen = {
        "server_event": _where(ConnectionHandler.server_event),
        "drain_writers": _where(ConnectionHandler.drain_writers),
        "send": _where(Http1Server.send),
        "handle_connection": _where(ConnectionHandler.handle_connection),
        "get_connection": _where(HttpLayer.get_connection),
        "upstream_protocol": type(transport.get_protocol()).__name__,
    }
    with open(os.environ["HOPMETER_TEST_PROBE"], "a") as out:
        out.write(json.dumps(seen) + "\n")
