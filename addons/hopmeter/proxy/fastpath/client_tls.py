"""The relay's way through mitmproxy's TLS layer to a client in TLS to the proxy.

When mitmproxy's `ClientTLSLayer` terminates the client's TLS (a handshake per connection, HTTP/1.1
negotiated), every chunk mitmproxy sends the client comes up from the HTTP layer as a `SendData`
for the client's connection, which the TLS layer's `_handle_command` turns into `send_data`: the
chunk into its OpenSSL connection (`sendall`, the errors of a peer that is going ignored), then
`tls_interact`, which reads the connection's output (`bio_read(65535)`) until OpenSSL has none
(`WantReadError`) and sends each piece to the client's writer. `send` does the same, in the same
order, for the relay (hopmeter.proxy.fastpath.relay).

`follows` is asked once per response, when the relay is armed: the layer is the client's one TLS
session (not TLS inside TLS, not a connection passed through by `ignore_hosts`), its handshake is
done, and its methods are TunnelLayer's own. `ready` is asked for each read: the tunnel is still
open, it holds no events it queued, and the session was not shut down (a close_notify either
way): otherwise mitmproxy's layers move the read. The code of each method named here is
fingerprinted by hopmeter.proxy.fastpath.gate.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hopmeter.proxy.fastpath.internals import SSL, ClientTLSLayer, TunnelState

_OPEN = TunnelState.OPEN
_SEND_ERRORS = (SSL.ZeroReturnError, SSL.SysCallError)  # what mitmproxy's send_data ignores
_WantReadError = SSL.WantReadError
_READ_SIZE = 65535  # mitmproxy's tls_interact reads its connection's output this much at a time
# a layer's own attribute by one of these names (ClientTLSLayer sets `event_to_child` after a
# failed handshake) means it does more than TunnelLayer's methods do
OVERRIDDEN = frozenset({"event_to_child", "_handle_command", "send_data"})


def follows(layer: Any, child: Any, client: Any) -> bool:
    """Whether `layer`, above `child` on the way to the HTTP layer, is mitmproxy's TLS layer for
    `client` as the relay follows it: an open session of its own, TunnelLayer's methods."""
    return (
        type(layer) is ClientTLSLayer
        and layer.child_layer is child
        and layer.conn is client
        and layer.tunnel_connection is client
        and layer.tunnel_state is _OPEN
        and type(layer.tls) is SSL.Connection
        and not layer.__dict__.keys() & OVERRIDDEN
    )


def ready(layer: Any, ssl: Any) -> bool:
    """Whether mitmproxy's TLS layer would only pass a chunk through `ssl` now."""
    return (
        layer.tunnel_state is _OPEN
        and not layer._event_queue
        and layer.tls is ssl
        and not ssl.get_shutdown()
    )


def send(ssl: Any, raw: bytes, writer: Any) -> None:
    """`raw` to the client as mitmproxy's TLSLayer.send_data and tls_interact send it: through
    the OpenSSL connection, each piece of its output written in order (none to a closing writer,
    as mitmproxy skips a closed connection's writes)."""
    with contextlib.suppress(*_SEND_ERRORS):  # the client is going: mitmproxy drops it too
        ssl.sendall(raw)
    while True:
        try:
            record = ssl.bio_read(_READ_SIZE)
        except _WantReadError:
            return
        if not writer.is_closing():
            writer.write(record)
