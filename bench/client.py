"""The bench load generator: opens streams through a topology and measures each event's delay.

    python bench/client.py load --target 127.0.0.1:8080 --streams 50 --rate 50 --events 300 \
        --mode paced --warmup-s 1.5 --measure-s 5
    python bench/client.py soak --target 127.0.0.1:8080 --flows 100000 --concurrency 64

`load` prints one JSON object with the delay percentiles; `soak` prints `{"flows": N}` each
`--report-every` flows (so the harness can read RSS at that moment) and a summary at the end.

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
import socket
import struct
import sys
import time
from array import array
from typing import Any

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
RECV_BYTES = 256 * 1024
WAVE = 64  # connections opened together
WAVE_WAIT_S = 2.0  # the longest a wave waits for its response headers


def request(target: str, n: int, rate: float, mode: str) -> bytes:
    body = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"host: %s\r\ncontent-type: application/json\r\naccept: text/event-stream\r\n"
        b"x-bench: n=%d;rate=%s;mode=%s\r\ncontent-length: %d\r\n\r\n%s"
        % (target.encode(), n, repr(rate).encode(), mode.encode(), len(body), body)
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


class Stream:
    """One streamed response read from a raw non-blocking socket, kernel-timestamped."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: Sink, req: bytes, n: int) -> None:
        self.loop = loop
        self.sink = sink
        self.req = req
        self.expected = n
        self.received = 0
        self.sock: socket.socket | None = None
        self.buf = b""
        self.headers_done = False
        self.status = 0
        self.done: asyncio.Future[str] = loop.create_future()
        self.answered: asyncio.Future[None] = loop.create_future()  # response headers read

    async def start(self, addr: tuple[str, int]) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        try:
            await self.loop.sock_connect(sock, addr)
            await self.loop.sock_sendall(sock, self.req)
        except OSError as exc:
            self.end(f"connect: {exc}")
            return
        self.loop.add_reader(sock.fileno(), self.readable)

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
        kernel = user
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", raw[:16])
                kernel = sec * 1_000_000_000 + nsec
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
        sink = self.sink
        lo, hi = sink.window
        pos = buf.find(MARK)
        keep_from = max(0, len(buf) - len(TERMINATOR))
        while pos >= 0:
            comma = buf.find(b",", pos + 5)
            comma2 = buf.find(b",", comma + 1) if comma >= 0 else -1
            if comma2 < 0:
                keep_from = pos
                break
            sent = int(buf[pos + 5 : comma])
            late = int(buf[comma + 5 : comma2])  # `"l":` is 4 bytes after the comma
            self.received += 1
            sink.events += 1
            if lo <= sent < hi:
                sink.kernel_ns.append(kernel - sent)
                sink.user_ns.append(user - sent)
                sink.late_us.append(late)
            pos = buf.find(MARK, comma2)
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


async def enable_timestamps() -> None:
    """Linux switches packet timestamping on through a deferred work item: the first segments
    after the first socket asks for it can arrive unstamped. Ask once, early, and wait."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    await asyncio.sleep(0.2)
    sock.close()


async def run_load(args: argparse.Namespace) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    host, _, port = args.target.rpartition(":")
    addr = (host, int(port))
    await enable_timestamps()
    t0 = time.time_ns()
    window = (t0 + int(args.warmup_s * 1e9), t0 + int((args.warmup_s + args.measure_s) * 1e9))
    sink = Sink(window)
    req = request(args.target, args.events, args.rate, args.mode)
    streams = [Stream(loop, sink, req, args.events) for _ in range(args.streams)]
    started = time.monotonic()
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
