"""The bench upstream: OpenAI chat chunks on a token clock, every event stamped as it is sent.

    python bench/upstream.py --listen 127.0.0.1:0      # prints {"port": N} on stdout when ready

Each request picks its stream with an `X-Bench: n=500;rate=50;mode=paced` header:

- `n` token events, one token (" tok") per event, then a finish chunk, `[DONE]` and the end chunk;
- `rate` events per second per stream (0: all at once, for the soak);
- `mode=paced`: each stream on its own clock with a random phase; `mode=lockstep`: every lockstep
  stream at that rate emits on the same tick of one shared clock, as batched decoding does.

Every token event is one HTTP/1.1 chunk whose JSON starts `{"t":<send ns>,"l":<late us>,...`:
`t` is `time.time_ns()` read immediately before the write (CLOCK_REALTIME, the clock the kernel
stamps received packets with; one clock for every process on the machine), `l` how late the write
was against its schedule (the upstream's own health: a late upstream is a bench bottleneck).
The rest is a Chat Completions chunk, so hopmeter parses it as openai.chat.

With `--h2-listen HOST:PORT` it also serves the same streams as HTTP/2 over TLS (a self-signed
certificate, ALPN h2): one connection carries many streams, each event one DATA frame. A proxy
in front of an HTTP/1 upstream opens a connection per HTTP/2 stream, and mitmproxy opens at most
5 at a time for one client connection: the HTTP/2 rows need an HTTP/2 upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import random
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h2.config  # installed with mitmproxy
import h2.connection
import h2.events

# uvloop when installed (bench/README.md); imported by name, so that this module type-checks
# with and without it
try:
    uvloop: Any = importlib.import_module("uvloop")
except ImportError:  # stdlib asyncio is fine, only slower
    uvloop = None

HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\n"
    b"x-accel-buffering: no\r\n"
    b"transfer-encoding: chunked\r\n"
)
EVENT = (
    b'data: {"t":%d,"l":%d,"id":"chatcmpl-bench","object":"chat.completion.chunk",'
    b'"created":1700000000,"model":"bench","choices":[{"index":0,"delta":{"content":" tok"},'
    b'"finish_reason":null}]}\n\n'
)
FINISH = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
)
DONE = b"data: [DONE]\n\n"
END = b"0\r\n\r\n"
MAX_HEAD_BYTES = 64 * 1024  # a bench request head is ~300 bytes


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk holding `payload`."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Ticker:
    """The shared clock of lockstep streams at one rate: one tick writes one event to each."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float) -> None:
        self.loop = loop
        self.interval = 1.0 / rate
        self.members: dict[Stream, None] = {}  # insertion-ordered set
        self.when = 0.0
        self.handle: asyncio.TimerHandle | None = None

    def join(self, stream: Stream) -> None:
        self.members[stream] = None
        if self.handle is None:
            now = self.loop.time()
            self.when = math.ceil(now / self.interval) * self.interval
            self.handle = self.loop.call_at(self.when, self.tick)

    def leave(self, stream: Stream) -> None:
        self.members.pop(stream, None)

    def tick(self) -> None:
        late_us = int((self.loop.time() - self.when) * 1e6)
        for stream in list(self.members):
            stream.emit(late_us)
        if self.members:
            self.when += self.interval
            self.handle = self.loop.call_at(self.when, self.tick)
        else:
            self.handle = None


TICKERS: dict[float, Ticker] = {}


class Stream:
    """One response being sent."""

    def __init__(self, conn: Conn | H2Response, n: int, rate: float, mode: str) -> None:
        self.conn = conn
        self.left = n
        self.rate = rate
        self.mode = mode
        self.when = 0.0
        self.handle: asyncio.TimerHandle | None = None
        self.ticker: Ticker | None = None

    def start(self) -> None:
        loop = self.conn.loop
        if self.left <= 0:
            self.finish()
        elif self.rate <= 0:
            while self.left > 0 and not self.conn.closed:
                self.emit(0)
        elif self.mode == "lockstep":
            self.ticker = TICKERS.get(self.rate)
            if self.ticker is None:
                self.ticker = TICKERS[self.rate] = Ticker(loop, self.rate)
            self.ticker.join(self)
        else:
            self.when = loop.time() + random.random() / self.rate
            self.handle = loop.call_at(self.when, self.paced)

    def paced(self) -> None:
        self.emit(int((self.conn.loop.time() - self.when) * 1e6))
        if self.left > 0:
            self.when += 1.0 / self.rate
            self.handle = self.conn.loop.call_at(self.when, self.paced)

    def emit(self, late_us: int) -> None:
        if self.conn.closed:
            self.stop()
            return
        self.conn.write_event(EVENT % (time.time_ns(), late_us))
        self.left -= 1
        if self.left <= 0:
            self.finish()

    def finish(self) -> None:
        self.stop()
        if not self.conn.closed:
            self.conn.write_end()
            self.conn.response_done()

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.ticker is not None:
            self.ticker.leave(self)
            self.ticker = None


class Conn(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive, one response at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.buf = bytearray()
        self.stream: Stream | None = None
        self.close_after = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.stream is not None:
            self.stream.stop()
            self.stream = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > MAX_HEAD_BYTES and self.stream is None:
            self.transport.close()
            return
        self.next_request()

    def next_request(self) -> None:
        if self.stream is not None or self.closed:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = int(headers.get("content-length", "0") or 0)
        if len(self.buf) < end + 4 + body:
            return
        del self.buf[: end + 4 + body]
        params = dict(
            pair.partition("=")[::2] for pair in headers.get("x-bench", "").split(";") if pair
        )
        self.close_after = headers.get("connection", "").lower() == "close"
        head = HEAD + (b"connection: close\r\n" if self.close_after else b"") + b"\r\n"
        self.transport.write(head)
        self.stream = Stream(
            self,
            n=int(params.get("n", "10")),
            rate=float(params.get("rate", "50")),
            mode=params.get("mode", "paced"),
        )
        self.stream.start()

    def write_event(self, payload: bytes) -> None:
        self.transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def write_end(self) -> None:
        self.transport.write(chunk(FINISH) + chunk(DONE) + END)

    def response_done(self) -> None:
        self.stream = None
        if self.close_after:
            self.transport.close()
        else:
            self.loop.call_soon(self.next_request)


H2_HEAD = [
    (b":status", b"200"),
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
]
H2_STREAMS = 1000  # concurrent streams announced: more than any bench load opens


class H2Response:
    """One HTTP/2 response of an `H2Conn`: what `Stream` writes to, as DATA frames."""

    def __init__(self, conn: H2Conn, stream_id: int) -> None:
        self.conn = conn
        self.loop = conn.loop
        self.stream_id = stream_id
        self.pending = b""  # what flow control has not let out yet

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def write_event(self, payload: bytes) -> None:
        self.send(payload, end=False)

    def write_end(self) -> None:
        self.send(FINISH + DONE, end=True)

    def response_done(self) -> None:
        self.conn.responses.pop(self.stream_id, None)

    def send(self, data: bytes, *, end: bool) -> None:
        self.pending += data
        self.ending = end
        self.flush()

    def flush(self) -> None:
        h2c = self.conn.h2
        try:
            room = h2c.local_flow_control_window(self.stream_id)
        except Exception:  # the stream is gone (reset): drop what it had
            self.pending = b""
            return
        size = min(room, len(self.pending), h2c.max_outbound_frame_size)
        while size > 0:
            h2c.send_data(self.stream_id, self.pending[:size])
            self.pending = self.pending[size:]
            room -= size
            size = min(room, len(self.pending), h2c.max_outbound_frame_size)
        if not self.pending and getattr(self, "ending", False):
            h2c.end_stream(self.stream_id)
            self.ending = False
        self.conn.transport.write(h2c.data_to_send())


class H2Conn(asyncio.Protocol):
    """One HTTP/2 connection over TLS (`--h2-listen`): the same streams, multiplexed."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.requests: dict[int, dict[bytes, bytes]] = {}
        self.responses: dict[int, H2Response] = {}
        self.streams: dict[int, Stream] = {}
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.local_settings.max_concurrent_streams = H2_STREAMS
        self.h2.initiate_connection()
        self.transport.write(self.h2.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for stream in self.streams.values():
            stream.stop()
        self.streams.clear()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except Exception:  # a protocol error: the bench's client or proxy is broken
            self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self.requests[ev.stream_id] = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self.respond(ev.stream_id)
            elif isinstance(ev, h2.events.WindowUpdated):
                ids = [ev.stream_id] if ev.stream_id else list(self.responses)
                for sid in ids:
                    if sid in self.responses:
                        self.responses[sid].flush()
            elif isinstance(ev, h2.events.StreamReset):
                stream = self.streams.pop(ev.stream_id, None)
                if stream is not None:
                    stream.stop()
                self.responses.pop(ev.stream_id, None)
        self.transport.write(self.h2.data_to_send())

    def respond(self, stream_id: int) -> None:
        headers = self.requests.pop(stream_id, {})
        params = dict(
            pair.partition("=")[::2]
            for pair in headers.get(b"x-bench", b"").decode().split(";")
            if pair
        )
        self.h2.send_headers(stream_id, H2_HEAD)
        response = self.responses[stream_id] = H2Response(self, stream_id)
        stream = self.streams[stream_id] = Stream(
            response,
            n=int(params.get("n", "10")),
            rate=float(params.get("rate", "50")),
            mode=params.get("mode", "paced"),
        )
        stream.start()


def tls_context(workdir: Path) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate (the proxy does not check it:
    `ssl_insecure`), offering h2."""
    key, cert = workdir / "key.pem", workdir / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt"),
            *("ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


async def serve(host: str, port: int, h2_listen: str = "") -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, host, port, backlog=4096, reuse_address=True)
    ready: dict[str, Any] = {"port": server.sockets[0].getsockname()[1]}
    h2_server = None
    if h2_listen:
        h2_host, _, h2_port = h2_listen.rpartition(":")
        with tempfile.TemporaryDirectory() as tmp:
            ctx = tls_context(Path(tmp))
        h2_server = await loop.create_server(
            H2Conn, h2_host, int(h2_port), backlog=4096, reuse_address=True, ssl=ctx
        )
        ready["h2_port"] = h2_server.sockets[0].getsockname()[1]
    print(json.dumps({**ready, "uvloop": uvloop is not None}), flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    p.add_argument(
        "--h2-listen", default="", metavar="HOST:PORT", help="also serve HTTP/2 over TLS here"
    )
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    try:
        if uvloop is not None:
            uvloop.run(serve(host, int(port), args.h2_listen))
        else:
            asyncio.run(serve(host, int(port), args.h2_listen))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
