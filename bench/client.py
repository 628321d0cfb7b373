"""The bench load generator: opens streams through a topology and measures each event's delay.

    python bench/client.py load --target 127.0.0.1:8080 --streams 50 --rate 50 --events 300 \
        --mode paced --warmup-s 1.5 --measure-s 5
    python bench/client.py soak --target 127.0.0.1:8080 --flows 100000 --concurrency 64

`load` prints one JSON object with the delay percentiles; `soak` prints `{"flows": N}` each
`--report-every` flows (so the harness can read RSS at that moment) and a summary at the end.

`load --proto` picks what the client speaks to the proxy: `h1` (plain HTTP/1.1, one connection
per stream), `tls` (HTTP/1.1 over TLS, one connection per stream) or `h2` (HTTP/2 over TLS, the
streams multiplexed on as few connections as the proxy's SETTINGS_MAX_CONCURRENT_STREAMS allows;
mitmproxy announces 100). TLS runs through `ssl.MemoryBIO` over the same raw socket, so the
kernel's receive stamp is still read with each segment; the proxy's certificate is not checked
(it is the proxy's own CA's, and the bench measures time, not trust).

Delay of an event = arrival − send. The send time is the `t` the upstream embeds in the event
(`time.time_ns()`, CLOCK_REALTIME). Arrival is taken twice: from the kernel (SO_TIMESTAMPNS: when
the segment reached this socket, also CLOCK_REALTIME), which does not depend on how soon this
process gets to read, and from `time.time_ns()` after the read returns. The kernel stamp is the
figure reported; the user-space one shows whether the client itself kept up. When one read
returns several events the kernel stamp is the last segment's, so the earlier events in that read
are charged a little more delay, never less.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import re
import socket
import ssl
import struct
import sys
import time
from array import array
from typing import Any

import h2.config  # installed with mitmproxy
import h2.connection
import h2.events
from h2.settings import SettingCodes

# uvloop when installed (bench/README.md); imported by name, so that this module type-checks
# with and without it
try:
    uvloop: Any = importlib.import_module("uvloop")
except ImportError:  # stdlib asyncio is fine, only slower
    uvloop = None

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux <asm-generic/socket.h>
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
MARK = b'{"t":'
TERMINATOR = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body (our payloads hold no CR)
# A chunk's framing inside an event: a proxy that frames each read as a chunk of its own (mitmproxy
# under load) may cut one anywhere, even inside a number.
FRAMING = re.compile(rb"\r\n[0-9a-fA-F]+\r\n")
RECV_BYTES = 256 * 1024
WAVE = 64  # connections opened together
WAVE_WAIT_S = 2.0  # the longest a wave waits for its response headers
H2_PER_CONNECTION = (
    100  # mitmproxy's HTTP/2 server announces h2's default of 100 concurrent streams
)
H2_WINDOW = 1 << 24  # flow-control window per stream and for the connection: never the limit
BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def bench_header(n: int, rate: float, mode: str) -> bytes:
    """The upstream's X-Bench header value: which stream to send (bench/upstream.py)."""
    return b"n=%d;rate=%s;mode=%s" % (n, repr(rate).encode(), mode.encode())


def request(target: str, n: int, rate: float, mode: str) -> bytes:
    body = BODY
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"host: %s\r\ncontent-type: application/json\r\naccept: text/event-stream\r\n"
        b"x-bench: %s\r\ncontent-length: %d\r\n\r\n%s"
        % (target.encode(), bench_header(n, rate, mode), len(body), body)
    )


def percentiles(values: array[int], scale: float) -> dict[str, float | None]:
    """p50, p99 and max of `values` times `scale`, by nearest rank."""
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, int(q * n + 0.5) - 1))] * scale

    return {"p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1] * scale, "n": n}


class Sink:
    """Every measured event of a load run, as compact columns."""

    def __init__(self, window_ns: tuple[int, int]) -> None:
        self.window = window_ns
        self.kernel_ns = array("q")
        self.user_ns = array("q")
        self.late_us = array("q")
        self.events = 0  # all token events received, measured or not


def kernel_stamp(anc: list[tuple[int, int, bytes]], user: int) -> int:
    """The kernel's receive time of a read (SCM_TIMESTAMPNS), or `user` when it gave none."""
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", raw[:16])
            return int(sec) * 1_000_000_000 + int(nsec)
    return user


def scan(sink: Sink, buf: bytes, kernel: int, user: int) -> tuple[int, int]:
    """Count and measure every whole event mark in `buf`: (events seen, where to keep from).

    What is kept is a mark not yet complete, or else the tail that could still begin one (or
    the chunked body's terminator)."""
    lo, hi = sink.window
    seen = 0
    pos = buf.find(MARK)
    keep_from = max(0, len(buf) - len(TERMINATOR))
    while pos >= 0:
        comma = buf.find(b",", pos + 5)
        comma2 = buf.find(b",", comma + 1) if comma >= 0 else -1
        if comma2 < 0:
            keep_from = pos
            break
        t_raw, l_raw = buf[pos + 5 : comma], buf[comma + 1 : comma2]
        if b"\r" in t_raw or b"\r" in l_raw:  # a proxy cut a chunk inside this event
            t_raw, l_raw = FRAMING.sub(b"", t_raw), FRAMING.sub(b"", l_raw)
        sent = int(t_raw)
        late = int(l_raw[4:])  # after `"l":`
        seen += 1
        if lo <= sent < hi:
            sink.kernel_ns.append(kernel - sent)
            sink.user_ns.append(user - sent)
            sink.late_us.append(late)
        pos = buf.find(MARK, comma2)
    sink.events += seen
    return seen, keep_from


def client_context(alpn: str) -> ssl.SSLContext:
    """A TLS client context that offers `alpn` and takes the proxy's certificate unchecked."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    return ctx


class Tls:
    """TLS over a raw non-blocking socket through memory BIOs: the socket stays ours, so its
    reads keep their kernel stamps."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")

    async def handshake(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        while True:
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                await loop.sock_sendall(sock, self.outgoing.read())
                data = await loop.sock_recv(sock, RECV_BYTES)
                if not data:
                    raise ConnectionResetError("closed during the TLS handshake") from None
                self.incoming.write(data)
            else:
                await loop.sock_sendall(sock, self.outgoing.read())
                return

    def wrap(self, data: bytes) -> bytes:
        """`data` as TLS records to send."""
        self.obj.write(data)
        return self.outgoing.read()

    def unwrap(self, data: bytes) -> bytes:
        """The plaintext of the records received so far (b"" when none is whole yet)."""
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        out = []
        while True:
            try:
                piece = self.obj.read(RECV_BYTES)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not piece:
                break
            out.append(piece)
        return b"".join(out)


async def connect(
    loop: asyncio.AbstractEventLoop, addr: tuple[str, int], alpn: str | None
) -> tuple[socket.socket, Tls | None]:
    """A connected, kernel-stamping, non-blocking socket; with `alpn`, TLS shaken hands."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await loop.sock_connect(sock, addr)
        tls = None
        if alpn is not None:
            tls = Tls(client_context(alpn))
            await tls.handshake(loop, sock)
    except (OSError, ssl.SSLError):
        sock.close()
        raise
    return sock, tls


class Stream:
    """One streamed response read from a raw non-blocking socket, kernel-timestamped; over TLS
    when `tls` (HTTP/1.1 either way)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sink: Sink, req: bytes, n: int, tls: bool = False
    ) -> None:
        self.loop = loop
        self.sink = sink
        self.req = req
        self.expected = n
        self.received = 0
        self.use_tls = tls
        self.tls: Tls | None = None
        self.sock: socket.socket | None = None
        self.buf = b""
        self.headers_done = False
        self.status = 0
        self.done: asyncio.Future[str] = loop.create_future()
        self.answered: asyncio.Future[None] = loop.create_future()  # response headers read

    async def start(self, addr: tuple[str, int]) -> None:
        try:
            self.sock, self.tls = await connect(
                self.loop, addr, "http/1.1" if self.use_tls else None
            )
            req = self.tls.wrap(self.req) if self.tls is not None else self.req
            await self.loop.sock_sendall(self.sock, req)
        except (OSError, ssl.SSLError) as exc:
            self.end(f"connect: {exc}")
            return
        self.loop.add_reader(self.sock.fileno(), self.readable)

    def readable(self) -> None:
        assert self.sock is not None
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(RECV_BYTES, 64)
        except BlockingIOError:
            return
        except OSError as exc:
            self.end(f"recv: {exc}")
            return
        user = time.time_ns()
        kernel = kernel_stamp(anc, user)
        if self.tls is not None:
            try:
                plain = self.tls.unwrap(data)
            except ssl.SSLError as exc:
                self.end(f"tls: {exc}")
                return
            if plain:
                self.take(plain, kernel, user)
            if data or self.sock is None:
                return
        if not data:
            self.end("eof" if self.received < self.expected else "ok")
            return
        self.take(data, kernel, user)

    def take(self, data: bytes, kernel: int, user: int) -> None:
        buf = self.buf + data
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self.status = int(buf[9:12])
            self.headers_done = True
            self.answered.set_result(None)
            buf = buf[end + 2 :]  # keep "\r\n" so a body that is only "0\r\n\r\n" still matches
        seen, keep_from = scan(self.sink, buf, kernel, user)
        self.received += seen
        if TERMINATOR in buf:
            self.end("ok" if self.received >= self.expected else "short")
            return
        self.buf = buf[keep_from:]

    def end(self, how: str) -> None:
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        if not self.done.done():
            self.done.set_result(how if self.status in (0, 200) else f"http {self.status}")
        if not self.answered.done():
            self.answered.set_result(None)


class H2Stream:
    """One response of an HTTP/2 connection: the same marks, counted per stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.expected = n
        self.received = 0
        self.buf = b""
        self.status = 0
        self.done: asyncio.Future[str] = loop.create_future()
        self.answered: asyncio.Future[None] = loop.create_future()

    def end(self, how: str) -> None:
        if not self.done.done():
            self.done.set_result(how if self.status in (0, 200) else f"http {self.status}")
        if not self.answered.done():
            self.answered.set_result(None)


class H2Connection:
    """Several streams on one HTTP/2-over-TLS connection (the `h2` package, sans-I/O)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sink: Sink,
        streams: list[H2Stream],
        headers: list[tuple[bytes, bytes]],
    ) -> None:

        self.loop = loop
        self.sink = sink
        self.streams = streams
        self.by_id: dict[int, H2Stream] = {}
        self.headers = headers
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.sock: socket.socket | None = None
        self.tls: Tls | None = None
        self.pending = b""  # TLS records not yet taken by the socket

    async def start(self, addr: tuple[str, int]) -> None:
        try:
            self.sock, self.tls = await connect(self.loop, addr, "h2")
        except (OSError, ssl.SSLError) as exc:
            self.end_all(f"connect: {exc}")
            return
        assert self.tls is not None
        if self.tls.obj.selected_alpn_protocol() != "h2":
            self.end_all(f"alpn: {self.tls.obj.selected_alpn_protocol()}")
            return
        self.h2.initiate_connection()
        self.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: H2_WINDOW})
        self.h2.increment_flow_control_window(H2_WINDOW)
        for s in self.streams:
            sid = self.h2.get_next_available_stream_id()
            self.by_id[sid] = s
            self.h2.send_headers(sid, self.headers)
            self.h2.send_data(sid, BODY, end_stream=True)
        self.loop.add_reader(self.sock.fileno(), self.readable)
        self.flush()

    def flush(self) -> None:
        """Send what h2 has for the peer; what the socket does not take waits for writability."""
        if self.sock is None or self.tls is None:
            return
        out = self.h2.data_to_send()
        if out:
            self.pending += self.tls.wrap(out)
        while self.pending:
            try:
                sent = self.sock.send(self.pending)
            except BlockingIOError:
                self.loop.add_writer(self.sock.fileno(), self.writable)
                return
            except OSError as exc:
                self.end_all(f"send: {exc}")
                return
            self.pending = self.pending[sent:]

    def writable(self) -> None:
        if self.sock is not None:
            self.loop.remove_writer(self.sock.fileno())
        self.flush()

    def readable(self) -> None:
        assert self.sock is not None and self.tls is not None
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(RECV_BYTES, 64)
        except BlockingIOError:
            return
        except OSError as exc:
            self.end_all(f"recv: {exc}")
            return
        user = time.time_ns()
        kernel = kernel_stamp(anc, user)
        try:
            plain = self.tls.unwrap(data)
            events = self.h2.receive_data(plain) if plain else []
        except Exception as exc:  # a TLS or HTTP/2 fault ends every stream on it
            self.end_all(f"h2: {exc}")
            return
        for ev in events:
            s = self.by_id.get(getattr(ev, "stream_id", 0) or 0)
            if isinstance(ev, h2.events.ResponseReceived) and s is not None:
                s.status = int(dict(ev.headers).get(b":status", b"0"))
                s.answered.set_result(None)
            elif isinstance(ev, h2.events.DataReceived) and s is not None:
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                buf = s.buf + ev.data
                seen, keep_from = scan(self.sink, buf, kernel, user)
                s.received += seen
                s.buf = buf[keep_from:]
            elif isinstance(ev, h2.events.StreamEnded) and s is not None:
                s.end("ok" if s.received >= s.expected else "short")
            elif isinstance(ev, h2.events.StreamReset) and s is not None:
                s.end(f"reset {ev.error_code}")
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.end_all(f"goaway {ev.error_code}")
                return
        if not data:
            self.end_all("eof")
            return
        self.flush()

    def end_all(self, how: str) -> None:
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for s in self.streams:
            s.end(how)

    def end(self, how: str) -> None:
        self.end_all(how)


async def enable_timestamps() -> None:
    """Linux switches packet timestamping on through a deferred work item: the first segments
    after the first socket asks for it can arrive unstamped. Ask once, early, and wait."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    await asyncio.sleep(0.2)
    sock.close()


async def open_h2(
    loop: asyncio.AbstractEventLoop, sink: Sink, addr: tuple[str, int], args: argparse.Namespace
) -> list[H2Stream]:
    """`args.streams` streams over HTTP/2, H2_PER_CONNECTION to a connection, each connection
    opened once the one before has its response headers."""
    headers = [
        (b":method", b"POST"),
        (b":path", b"/v1/chat/completions"),
        (b":authority", args.target.encode()),
        (b":scheme", b"https"),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
        (b"x-bench", bench_header(args.events, args.rate, args.mode)),
        (b"content-length", str(len(BODY)).encode()),
    ]
    streams = [H2Stream(loop, args.events) for _ in range(args.streams)]
    conns = []
    for i in range(0, len(streams), H2_PER_CONNECTION):
        group = streams[i : i + H2_PER_CONNECTION]
        conn = H2Connection(loop, sink, group, headers)
        conns.append(conn)
        await conn.start(addr)
        await asyncio.wait([s.answered for s in group], timeout=WAVE_WAIT_S)
    return streams


async def run_load(args: argparse.Namespace) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    host, _, port = args.target.rpartition(":")
    addr = (host, int(port))
    await enable_timestamps()
    t0 = time.time_ns()
    window = (t0 + int(args.warmup_s * 1e9), t0 + int((args.warmup_s + args.measure_s) * 1e9))
    sink = Sink(window)
    started = time.monotonic()
    streams: list[Stream] | list[H2Stream]
    if args.proto == "h2":
        streams = await open_h2(loop, sink, addr, args)
    else:
        req = request(args.target, args.events, args.rate, args.mode)
        streams = [
            Stream(loop, sink, req, args.events, tls=args.proto == "tls")
            for _ in range(args.streams)
        ]
        # Open in waves, as clients arrive, each once the proxy has answered the one before: the
        # kernel completes a handshake before the proxy accepts it, and 200 handshakes at once
        # overflow mitmproxy's default accept queue (100); each dropped SYN costs its client a
        # second, and the storm of late connections lands inside the measured window.
        for i in range(0, len(streams), WAVE):
            wave = streams[i : i + WAVE]
            await asyncio.gather(*(s.start(addr) for s in wave))
            await asyncio.wait([s.answered for s in wave], timeout=WAVE_WAIT_S)
    connected_s = time.monotonic() - started
    planned_s = args.events / args.rate if args.rate > 0 else 0.0
    budget = max(0.0, planned_s + args.grace_s - (time.monotonic() - started))
    _, pending = await asyncio.wait([s.done for s in streams], timeout=budget)
    for s in streams:
        if not s.done.done():
            s.end("timeout")
    outcomes: dict[str, int] = {}
    for s in streams:
        how = s.done.result()
        outcomes[how] = outcomes.get(how, 0) + 1
    return {
        "streams": args.streams,
        "proto": args.proto,
        "connections": args.streams
        if args.proto != "h2"
        else -(-args.streams // H2_PER_CONNECTION),
        "rate": args.rate,
        "mode": args.mode,
        "events_per_stream": args.events,
        "events_received": sink.events,
        "events_expected": args.events * args.streams,
        "events_measured": len(sink.kernel_ns),
        "outcomes": outcomes,
        "timed_out": len(pending),
        "connect_s": round(connected_s, 3),
        "elapsed_s": round(time.monotonic() - started, 3),
        "delay_ms": percentiles(sink.kernel_ns, 1e-6),
        "delay_user_ms": percentiles(sink.user_ns, 1e-6),
        "upstream_late_ms": percentiles(sink.late_us, 1e-3),
    }


async def soak_worker(args: argparse.Namespace, state: dict[str, int], req: bytes) -> None:
    host, _, port = args.target.rpartition(":")
    while state["started"] < args.flows:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for _ in range(args.per_connection):
                if state["started"] >= args.flows:
                    break
                state["started"] += 1
                writer.write(req)
                response = await reader.readuntil(TERMINATOR)
                ok = response.startswith(b"HTTP/1.1 200") and response.count(MARK) == args.events
                state["ok" if ok else "bad"] += 1
                state["done"] += 1
                if state["done"] % args.report_every == 0:
                    print(json.dumps({"flows": state["done"]}), flush=True)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            state["errors"] += 1
            print(json.dumps({"error": str(exc)[:200]}), file=sys.stderr, flush=True)
        finally:
            writer.close()


async def run_soak(args: argparse.Namespace) -> dict[str, object]:
    req = request(args.target, args.events, 0, "paced")
    state = {"started": 0, "done": 0, "ok": 0, "bad": 0, "errors": 0}
    started = time.monotonic()
    await asyncio.gather(*(soak_worker(args, state, req) for _ in range(args.concurrency)))
    elapsed = time.monotonic() - started
    return {**state, "elapsed_s": round(elapsed, 2), "flows_per_s": round(state["done"] / elapsed)}


def main() -> None:
    p = argparse.ArgumentParser(description="hopmeter bench load generator")
    sub = p.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load")
    load.add_argument("--target", required=True, metavar="HOST:PORT")
    load.add_argument("--streams", type=int, default=1)
    load.add_argument("--rate", type=float, default=50.0, help="events per second per stream")
    load.add_argument("--events", type=int, default=300, help="token events per stream")
    load.add_argument("--mode", choices=("paced", "lockstep"), default="paced")
    load.add_argument(
        "--proto", choices=("h1", "tls", "h2"), default="h1", help="what to speak to the proxy"
    )
    load.add_argument("--warmup-s", type=float, default=1.5)
    load.add_argument("--measure-s", type=float, default=5.0)
    load.add_argument("--grace-s", type=float, default=3.0, help="wait past the planned end")
    soak = sub.add_parser("soak")
    soak.add_argument("--target", required=True, metavar="HOST:PORT")
    soak.add_argument("--flows", type=int, default=100_000)
    soak.add_argument("--concurrency", type=int, default=64)
    soak.add_argument("--events", type=int, default=5, help="token events per flow")
    soak.add_argument("--per-connection", type=int, default=50, help="flows per connection")
    soak.add_argument("--report-every", type=int, default=10_000)
    args = p.parse_args()
    run = run_load if args.command == "load" else run_soak
    result = uvloop.run(run(args)) if uvloop is not None else asyncio.run(run(args))
    print(json.dumps({"result": result}), flush=True)


if __name__ == "__main__":
    main()
