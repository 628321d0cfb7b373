"""The metrics endpoint: serves a registry on /metrics, /healthz and /readyz, in a daemon thread.

/healthz is liveness only: the process answers. /readyz asks the `ready` callable it was given
(the proxy's cached view of its upstreams, hopmeter.proxy.addon.readiness): 200 when ready, 503 with
the reason when not. Neither ever waits on the upstream, nor on other clients: the endpoint's
thread reads every request's head itself, without blocking, and answers these two at once; only
a /metrics scrape gets a thread of its own. Clients that connect and send nothing (or scrapers
that stop reading) therefore cannot keep a liveness probe from its answer.

/metrics speaks OpenMetrics when the scraper asks for it (so trace-id exemplars show) and the
classic text format otherwise, and honours `?name[]=` filtering (prometheus_client's WSGI app
does all three). The exposition leaves out prometheus_client's `_created` series without
touching its process-wide switch (`WithoutCreated`). Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from hopmeter.errors import PortError
from hopmeter.export.prometheus import Metrics

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# Whether the proxy is ready for traffic, and one line saying why (or why not). Called from the
# endpoint's threads: it must only read state, never block.
ReadyCheck = Callable[[], tuple[bool, str]]


def _text() -> list[tuple[str, str]]:
    # a new list per response: wsgiref adds Content-Length to the list it is given
    return [("Content-Type", "text/plain; charset=utf-8")]


class WithoutCreated:
    """A registry as /metrics shows it: every sample but the `_created` ones (docs/design.md §8).

    prometheus_client gives every counter and histogram label set a `_created` series, one more
    series each that nothing of hopmeter's reads. Its switch (an environment variable read at
    import, or disable_created_metrics()) is process-wide and would change every other registry
    in a user's own mitmdump, so this view drops the samples from hopmeter's exposition only.
    """

    def __init__(self, registry: CollectorRegistry, names: Iterable[str] | None = None) -> None:
        self._registry = registry
        self._source: Collector = registry if names is None else registry.restricted_registry(names)

    def collect(self) -> Iterator[Metric]:
        """The registry's metric families, each without its `_created` samples."""
        for family in self._source.collect():
            created = family.name + "_created"
            kept = copy.copy(family)  # a collector may hand out families it keeps
            kept.samples = [s for s in family.samples if s.name != created]
            yield kept

    def restricted_registry(self, names: Iterable[str]) -> WithoutCreated:
        """The same view of only the samples named (what `/metrics?name[]=...` asks for)."""
        return WithoutCreated(self._registry, names)


# At most this many scrapes are answered at once, each in its own thread; one more is answered
# 503 and counted (`hopmeter_metrics_connections_refused_total`): a flood of scrapes (or of slow
# readers) never costs the proxy a thread each.
MAX_CONNECTIONS = 32
# At most this many connections wait for their request's head (a few hundred bytes each, no
# thread); past it the one waiting longest is closed and counted.
MAX_PENDING = 256
MAX_HEAD_BYTES = 16 * 1024  # a request head past this is answered 431
# A connection that has not sent its request, or not read its answer, this long is closed.
CONNECTION_TIMEOUT_S = 10.0
# With no descriptor free, accept() fails and the listener stays readable: it is left alone
# this long (as asyncio's own servers do) rather than tried again at once, a busy loop.
ACCEPT_PAUSE_S = 1.0
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _QuietHandler(WSGIRequestHandler):
    """wsgiref's handler, reading the request head the endpoint's thread already read."""

    timeout = CONNECTION_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader: the head was read from it already
        heads: dict[Any, bytes] = getattr(self.server, "heads", {})
        self.rfile = io.BytesIO(heads.pop(self.request, b""))

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not news; stay silent."""


class _Refused:
    """The connections the endpoint refused: a scrape past MAX_CONNECTIONS at once, or the
    longest waiting past MAX_PENDING connections without a request."""

    def __init__(self) -> None:
        self.count = 0

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "hopmeter_metrics_connections_refused",
            f"Connections to the metrics endpoint refused: a scrape while {MAX_CONNECTIONS} were "
            f"being answered (503), the oldest of {MAX_PENDING} waiting for their request "
            f"(closed), or a request head over {MAX_HEAD_BYTES} bytes (431)",
        )
        family.add_metric([], self.count)
        yield family


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight must not keep the process alive
    block_on_close = False
    request_queue_size = 128  # the listen backlog (socketserver's is 5): accepted, then judged
    refused: _Refused
    slots: threading.BoundedSemaphore
    heads: dict[Any, bytes]  # each connection's request head, read by the endpoint's thread
    ready: ReadyCheck | None

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while fewer than MAX_CONNECTIONS are answered, else
        answered 503 at once and counted."""
        if not self.slots.acquire(blocking=False):
            self.refused.count += 1
            self.heads.pop(request, None)
            _answer(request, "503 Service Unavailable", "busy: too many scrapes at once\n")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            self.heads.pop(request, None)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, a DNS query per start; nothing here
        # needs a server name, so bind and set the WSGI environment without it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that hangs up mid-response is not an error worth a traceback."""


def _app(registry: CollectorRegistry, ready: ReadyCheck | None) -> WSGIApp:
    metrics_app: WSGIApp = prometheus_client.make_wsgi_app(WithoutCreated(registry))

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") == "/metrics":
            return metrics_app(environ, start_response)
        start_response("404 Not Found", _text())
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    return app


def _health(head: bytes, ready: ReadyCheck | None) -> tuple[str, str] | None:
    """The answer (status, body) to a GET or HEAD of /healthz or /readyz, else None."""
    method, _, rest = head.partition(b" ")
    path = rest.partition(b" ")[0].partition(b"?")[0]
    if method not in (b"GET", b"HEAD"):
        return None
    if path == b"/healthz":
        return "200 OK", "ok\n"
    if path == b"/readyz" and ready is not None:
        ok, why = ready()
        return ("200 OK" if ok else "503 Service Unavailable"), (
            f"{'ready' if ok else 'not ready'}: {why}\n"
        )
    return None


def _answer(conn: socket.socket, status: str, body: str, *, head_only: bool = False) -> None:
    """A short answer, written without waiting: it fits any socket's send buffer, and a client
    that cannot take it is not waited for."""
    data = body.encode()
    head = (
        f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(head if head_only else head + data)


class _Pending:
    """A connection whose request head is still coming."""

    __slots__ = ("address", "due_s", "head")

    def __init__(self, address: Any, due_s: float) -> None:
        self.address = address
        self.due_s = due_s
        self.head = bytearray()


class _Heads:
    """The endpoint's thread: accepts, reads each request's head without blocking, answers
    /healthz and /readyz at once and hands a scrape to its own thread (`serve`).

    socketserver's `serve_forever` polls every 0.5 s for its shutdown flag: two wake-ups a second
    in an idle process, and a `shutdown()` that waits up to a poll on the thread calling it (the
    event loop, at exit). This blocks on the sockets and the wake socket together: no wake-up
    while idle (the wait is bounded only while a connection's head is due, or accepting is
    paused), and `MetricsServer.close` is heard at once.
    """

    def __init__(self, server: _Server, sel: selectors.BaseSelector) -> None:
        self.server = server
        self.sel = sel
        self.pending: dict[socket.socket, _Pending] = {}  # oldest first
        self.resume_s: float | None = None  # accepting paused until then: no descriptor free

    def serve(self, wake: socket.socket) -> None:
        """Until `wake` is readable."""
        server, sel, pending = self.server, self.sel, self.pending
        server.socket.setblocking(False)
        sel.register(server.socket, selectors.EVENT_READ)
        sel.register(wake, selectors.EVENT_READ)
        try:
            while True:
                dues = [p.due_s for p in pending.values()]
                if self.resume_s is not None:
                    dues.append(self.resume_s)
                wait = max(min(dues) - time.monotonic(), 0.0) if dues else None
                for key, _ in sel.select(wait):
                    if key.fileobj is wake:
                        return
                    if key.fileobj is server.socket:
                        if not self.accept():  # the listener stays readable: away a while,
                            sel.unregister(server.socket)  # not a busy loop
                            self.resume_s = time.monotonic() + ACCEPT_PAUSE_S
                        continue
                    conn: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        self.read_head(conn)
                    except Exception:  # one connection's fault never ends the endpoint
                        self.drop(conn)
                now = time.monotonic()
                for conn in [c for c, p in pending.items() if p.due_s <= now]:
                    self.drop(conn)  # silent, as it was
                if self.resume_s is not None and now >= self.resume_s:
                    sel.register(server.socket, selectors.EVENT_READ)
                    self.resume_s = None
        finally:
            for conn in list(pending):
                self.drop(conn)

    def accept(self) -> bool:
        """Every connection waiting to be accepted, each to wait for its request's head; False
        when the process (or the system) has no descriptor free for one."""
        while True:
            try:
                conn, address = self.server.socket.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:  # the client left before it was accepted, or no descriptor
                return exc.errno not in _OUT_OF_DESCRIPTORS
            if len(self.pending) >= MAX_PENDING:  # the one waiting longest makes room
                self.server.refused.count += 1
                self.drop(next(iter(self.pending)))
            conn.setblocking(False)
            self.pending[conn] = _Pending(address, time.monotonic() + CONNECTION_TIMEOUT_S)
            self.sel.register(conn, selectors.EVENT_READ)

    def read_head(self, conn: socket.socket) -> None:
        """Read what a connection sent; once its head is whole, answer it or hand it on."""
        server, waiting = self.server, self.pending[conn]
        try:
            data = conn.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(conn)
            return
        waiting.head += data
        head = bytes(waiting.head)
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            if len(head) > MAX_HEAD_BYTES:
                server.refused.count += 1
                _answer(conn, "431 Request Header Fields Too Large", "request head too large\n")
                self.drop(conn)
            return
        self.sel.unregister(conn)
        del self.pending[conn]
        try:
            answer = _health(head, server.ready)
        except Exception:  # the check is the proxy's: its fault is an answer, never our end
            answer = "500 Internal Server Error", "the readiness check failed\n"
        if answer is not None:
            _answer(conn, *answer, head_only=head.startswith(b"HEAD "))
            server.shutdown_request(conn)
            return
        conn.setblocking(True)
        server.heads[conn] = head
        server.process_request(conn, waiting.address)

    def drop(self, conn: socket.socket) -> None:
        """Close a connection still waiting for its head."""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        self.pending.pop(conn, None)
        self.server.shutdown_request(conn)


def _serve(server: _Server, wake: socket.socket) -> None:
    """The endpoint's thread (`_Heads.serve`)."""
    with wake, selectors.DefaultSelector() as sel:
        _Heads(server, sel).serve(wake)


@dataclass(slots=True)
class MetricsServer:
    """A running metrics endpoint; `close()` stops it and frees the port."""

    host: str
    port: int
    _server: _Server
    _thread: threading.Thread
    _wake: socket.socket  # the other end of the thread's wake socket
    _registry: CollectorRegistry
    _refused: _Refused

    @property
    def url(self) -> str:
        """Where /metrics is served."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the socket (a scrape in flight finishes in its own thread)."""
        self._wake.close()  # the thread's end reads EOF and returns
        self._thread.join(timeout=5)
        self._server.server_close()
        with contextlib.suppress(KeyError):  # its counter goes with it (a new one may come)
            self._registry.unregister(self._refused)


def serve(
    target: Metrics | CollectorRegistry,
    host: str = "127.0.0.1",
    port: int = 9464,
    ready: ReadyCheck | None = None,
    *,
    choose: str = "--metrics HOST:PORT",
    off: str = "--metrics off",
) -> MetricsServer:
    """Serve /metrics, /healthz and (given `ready`) /readyz on host:port (0 picks a free port) in
    a daemon thread.

    Raises PortError, naming the address and the fix, when the address does not resolve or
    cannot be bound: `choose` and `off` say how the user sets another address or none (a flag
    of `hopmeter run`'s by default, mitmproxy's `--set` in a user's mitmdump).
    """
    registry = target.registry if isinstance(target, Metrics) else target
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortError(
            f"metrics address {host}:{port} does not resolve ({exc.strerror}); choose another "
            f"with {choose} or turn the endpoint off with {off}"
        ) from exc
    family, _, _, _, sockaddr = infos[0]
    address = str(sockaddr[0])

    class Server(_Server):
        address_family = family

    try:
        server = Server((address, port), _QuietHandler)
    except OSError as exc:
        what = "is already in use" if exc.errno == errno.EADDRINUSE else f"failed: {exc.strerror}"
        raise PortError(
            f"metrics port {port} on {host} {what}; choose another with {choose} "
            f"or turn the endpoint off with {off}"
        ) from exc
    server.set_app(_app(registry, ready))
    server.refused, server.slots = _Refused(), threading.BoundedSemaphore(MAX_CONNECTIONS)
    server.heads, server.ready = {}, ready
    registry.register(server.refused)
    wake, heard = socket.socketpair()
    thread = threading.Thread(
        target=_serve, args=(server, heard), name="hopmeter-metrics", daemon=True
    )
    thread.start()
    return MetricsServer(
        host=host,
        port=server.server_address[1],
        _server=server,
        _thread=thread,
        _wake=wake,
        _registry=registry,
        _refused=server.refused,
    )
