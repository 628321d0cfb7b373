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
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import random
import socket
import sys
import time
from typing import Any

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

    def __init__(self, conn: Conn, n: int, rate: float, mode: str) -> None:
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
        payload = EVENT % (time.time_ns(), late_us)
        self.conn.transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.left -= 1
        if self.left <= 0:
            self.finish()

    def finish(self) -> None:
        self.stop()
        if not self.conn.closed:
            self.conn.transport.write(chunk(FINISH) + chunk(DONE) + END)
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

    def response_done(self) -> None:
        self.stream = None
        if self.close_after:
            self.transport.close()
        else:
            self.loop.call_soon(self.next_request)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, host, port, backlog=4096, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": bound, "uvloop": uvloop is not None}), flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    try:
        if uvloop is not None:
            uvloop.run(serve(host, int(port)))
        else:
            asyncio.run(serve(host, int(port)))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
