"""`hopmeter run`'s mends of mitmproxy's bookkeeping of connections: the upstream connections a
client connection keeps, and the end of a read loop that was cancelled.

mitmproxy's HTTP layer keeps, for each client connection, every upstream connection it ever
opened for it (`HttpLayer.connections`), closed ones too, until the client connection ends. Two
things follow on a client connection that lives long, as a gateway's pooled HTTP/2 connection
does for days:

- Memory grows with every upstream connection opened: an upstream that closes its connections
  (HTTP/1.0, `Connection: close`, a model server's keep-alive timeout, or one HTTP/1 upstream
  connection per concurrent HTTP/2 stream) left ~5 KiB of layers, connection and response
  head per request, and each new request looked through all of them (slower and slower).
- A failed connect is answered for good: the failed connection stays in the list with its
  error, and each later request to the same upstream on that client connection is answered
  with that error (502) before any new connect is tried, even once the upstream is back. An
  HTTP/1 client is spared (the 502 closes its connection); an HTTP/2 client's connection
  answered 502 to every request after one refused connect while its model server restarted.

`install()` puts a step in front of mitmproxy's `HttpLayer.get_connection` (where a request
asks for an upstream connection) that first lets go of the connections that are over for
good: closed both ways and either finished by mitmproxy's connection handler (`timestamp_end`
set) or failed to connect before it had a socket (`error` set, no TCP setup, the attempt
answered): no event can come for them any more; and not the layer's own context connection, not
waiting to be established, and used by no stream still in the layer (whose steps could still
name it).
mitmproxy's own method then runs as before on what is left: a connection that is open or may
still be used is found and reused exactly as before.

A fault in the step leaves the list as it was (counted and logged, `on_error`) and runs
mitmproxy's own method.

mitmproxy's read loop of a connection (`ConnectionHandler.handle_connection`) catches a cancel
(a client that left: mitmproxy cancels the handler of each of its upstream connections) in its
read and in its drain step, then closes the connection; one that lands in its `server_event` (a
hook, the event lock) escapes before the close, and the socket stays open and registered for
reading for good: HTTP/2 clients that drop mid-stream left an upstream connection per stream,
and an upstream that closes its connections under concurrent HTTP/2 streams about one
descriptor per such request (4,000 requests, 20 at a time: 11 -> 2,807 descriptors, RSS 79 ->
121 MiB with `--no-relay`; 11 -> 11, 79 -> 87 MiB with this). `install()` also puts
`handle_connection` in front of mitmproxy's: when it ends by an exception with the connection
still among its transports, it closes the connection's writer and forgets it, as mitmproxy's own
end would have.

Both change classes of the interpreter's mitmproxy, so only `hopmeter run` installs them
(`hopmeter.proxy.fastpath.mend`, with the relay or without it, when the gate knows the installed
mitmproxy); a plain mitmdump keeps mitmproxy's behaviour (docs/mitmproxy.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from mitmproxy.connection import ConnectionState, Server

from hopmeter.proxy.fastpath.internals import ConnectionHandler, HttpLayer

OnError = Callable[[str, BaseException], None]

_MITMPROXY_GET_CONNECTION = HttpLayer.get_connection
_MITMPROXY_HANDLE_CONNECTION = ConnectionHandler.handle_connection
_CLOSED = ConnectionState.CLOSED


def over(layer: Any) -> list[Server]:
    """The upstream connections of `layer` (an HttpLayer) that are over for good and that no
    step of the layer can name any more (see the module's docstring)."""
    conns = layer.connections
    if len(conns) < 2:  # the client connection's own entry alone: nothing to let go of
        return []
    busy = {id(stream.context.server) for stream in layer.streams.values()}
    busy.add(id(layer.context.server))
    waiting = layer.waiting_for_establishment
    return [
        conn
        for conn in conns
        if type(conn) is Server
        and conn.state is _CLOSED
        # finished by the handler, or failed before it had a socket (a TLS failure has an
        # error and a socket whose read loop still owes the layer its ConnectionClosed)
        and (
            conn.timestamp_end is not None
            or (conn.error is not None and conn.timestamp_tcp_setup is None)
        )
        and id(conn) not in busy
        and conn not in waiting
    ]


def make_get_connection(on_error: OnError) -> Callable[..., Any]:
    def get_connection(self: Any, event: Any, *, reuse: bool = True) -> Any:
        try:
            conns = self.connections
            for conn in over(self):
                del conns[conn]
        except Exception as exc:  # the list as it was: mitmproxy's own behaviour
            on_error("connections", exc)
        return _MITMPROXY_GET_CONNECTION(self, event, reuse=reuse)

    return get_connection


async def handle_connection(self: ConnectionHandler, connection: Any) -> None:
    """mitmproxy's `handle_connection`, its end made sure: ended by an exception (a cancel that
    landed in its `server_event`) with the connection still among the handler's transports, the
    connection's writer is closed, the transport forgotten and the connection marked closed (so
    that no request takes it for an open one), as its own end does."""
    try:
        await _MITMPROXY_HANDLE_CONNECTION(self, connection)
    except BaseException:
        io = self.transports.get(connection)
        if io is not None:
            with contextlib.suppress(Exception):  # closing is all that is left to do
                if io.writer is not None:
                    io.writer.close()
            self.transports.pop(connection, None)
            with contextlib.suppress(Exception):  # never taken for an open one again (reused)
                connection.state = _CLOSED
        raise


def install(on_error: OnError) -> None:
    """Put the step in front of mitmproxy's `get_connection`, and the read loop's end made sure
    in front of its `handle_connection` (`hopmeter run` only)."""
    HttpLayer.get_connection = make_get_connection(on_error)  # type: ignore[method-assign]
    ConnectionHandler.handle_connection = handle_connection  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `HttpLayer.get_connection` is not mitmproxy's own."""
    return HttpLayer.get_connection is not _MITMPROXY_GET_CONNECTION


def uninstall() -> None:
    """Give mitmproxy its own methods back (tests)."""
    HttpLayer.get_connection = _MITMPROXY_GET_CONNECTION  # type: ignore[method-assign]
    ConnectionHandler.handle_connection = _MITMPROXY_HANDLE_CONNECTION  # type: ignore[method-assign]
