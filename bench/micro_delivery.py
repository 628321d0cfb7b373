"""Micro-benchmark of following bytes out: what the extra timestamps cost per event, in process.

    python bench/micro_delivery.py           # table on stdout, JSON in bench/results/
    python bench/micro_delivery.py --json    # the JSON on stdout too

1. The hot path, CPU per event (time.thread_time), many short rounds alternating plain and
   followed, median of (followed - plain): what the stream callable does in either case (stamp,
   queue the chunk) plus mitmproxy's write to the client's transport; followed adds the chunk
   list, arming the connection's counter and the counting write wrapper
   (hopmeter.proxy.delivery.conn.ConnTracker). Once on a stand-in transport that does the selector
   transport's checks without the send() (the wrapper alone), once on a real loopback socket.
2. One look at a connection's queues (ConnTracker.poll): with nothing queued (no system call),
   and with a chunk in the kernel's queue (one SIOCOUTQNSD ioctl).
3. Looks per chunk for a reader that keeps up: 400 chunks, 5 ms apart, written through a real
   transport to a socket a thread drains, with the real poller (hopmeter.proxy.delivery.lane).
4. Timing one measuring step (two monotonic reads and one thread_time), paid once per batch.

Per event, the total is 1 + 2 × 3 (with the poller's timers) + 4, with one chunk per measuring
step (a single slow stream: the worst case) and with ten (a busy proxy measures many at once);
the target is under 3 µs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addons"))

from hopmeter.core.ledger import END, OUT, new_chunk
from hopmeter.proxy.delivery.conn import ConnTracker
from hopmeter.proxy.delivery.lane import DeliveryLane, FlowOut

EVENTS = 5000  # per round
ROUNDS = 41
CHUNK = b"data: " + b"x" * 200 + b"\n\n"
FRAMED = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
RESULTS = Path(__file__).resolve().parent / "results"
_SPARE_LOOP = asyncio.new_event_loop()


class StandInTransport:
    """What asyncio's selector transport does in write() with an empty buffer, minus send()."""

    def __init__(self) -> None:
        self._buffer: deque[bytes] = deque()
        self._eof = False
        self._conn_lost = 0

    def write(self, data: bytes) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(type(data).__name__)
        if self._eof or self._conn_lost:
            raise RuntimeError("closed")
        if not data:
            return
        if not self._buffer:
            data = memoryview(data)[len(data) :].tobytes()
            if not data:
                return
        self._buffer.append(data)

    def close(self) -> None:
        return

    def is_closing(self) -> bool:
        return True  # nothing to close: the StreamWriter around it has nothing to warn about

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._buffer))


def _ignore(*_: Any) -> None:
    return


def stand_in_writer(transport: StandInTransport) -> asyncio.StreamWriter:
    """An asyncio StreamWriter over the stand-in, as mitmproxy holds every client's transport
    (its loop is only asked for a future, never run)."""
    return asyncio.StreamWriter(transport, None, None, _SPARE_LOOP)  # type: ignore[arg-type]


def hot_rounds(writer: asyncio.StreamWriter, sock: Any) -> tuple[list[float], list[float]]:
    """CPU µs per event, plain and followed, over alternating rounds."""
    plain_write = writer.write
    tracker = ConnTracker(writer, sock, _ignore, _ignore)
    followed_write = writer.write
    mono = time.monotonic

    def plain() -> float:
        pending: list[Any] = []
        t0 = time.thread_time()
        for _ in range(EVENTS):
            now = mono()
            pending.append((None, CHUNK, now))  # the tap's queue, as today
            plain_write(FRAMED)  # mitmproxy's write
            if len(pending) > 64:
                pending.clear()
        return (time.thread_time() - t0) / EVENTS * 1e6

    def followed() -> float:
        out = FlowOut("HTTP/1.1")
        out.conn = tracker
        pending: list[Any] = []
        led = tracker.ledger
        t0 = time.thread_time()
        for _ in range(EVENTS):
            now = mono()
            out.chunk(len(CHUNK), now)  # the tap hands the chunk on
            pending.append((None, CHUNK, now))
            followed_write(FRAMED)  # the counting wrapper around mitmproxy's write
            if len(pending) > 64:  # bounded, as a poll and the packing would keep them
                pending.clear()
                led.kernel.clear()
                out.chunks.live.clear()
                out.count = 0
        return (time.thread_time() - t0) / EVENTS * 1e6

    plains, follows = [], []
    for i in range(ROUNDS):
        if i % 2:
            plains.append(plain())
            follows.append(followed())
        else:
            follows.append(followed())
            plains.append(plain())
    return plains, follows


def summary(plains: list[float], follows: list[float]) -> dict[str, Any]:
    """Medians and the spread of the per-round difference."""
    deltas = [f - p for p, f in zip(plains, follows, strict=True)]
    q1, _, q3 = statistics.quantiles(deltas, n=4)
    return {
        "plain_us": round(statistics.median(plains), 3),
        "followed_us": round(statistics.median(follows), 3),
        "delta_us": round(statistics.median(deltas), 3),
        "delta_iqr_us": [round(q1, 3), round(q3, 3)],
    }


DRAIN = (
    "import socket, sys\n"
    "s = socket.socket(fileno=int(sys.argv[1]))\n"
    "while s.recv(1 << 20):\n"
    "    pass\n"
)


def socket_pair() -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """A loopback connection whose client side another process keeps draining (a thread of
    this one would wait for the GIL, and the kernel's buffers would fill)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    fd = client.fileno()
    drainer = subprocess.Popen([sys.executable, "-c", DRAIN, str(fd)], pass_fds=(fd,))
    client.close()
    return accepted, drainer


def per_call_us(fn: Callable[[], object], n: int = 20_000) -> float:
    """Median over rounds of CPU µs per call."""
    rounds = []
    for _ in range(9):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        rounds.append((time.thread_time() - t0) / n * 1e6)
    return round(statistics.median(rounds), 3)


async def on_a_socket() -> dict[str, Any]:
    """The hot path on a real transport, the cost of one look, and looks per chunk."""
    accepted, drainer = socket_pair()
    _, writer = await asyncio.open_connection(sock=accepted)
    sock = writer.get_extra_info("socket")
    try:
        hot = summary(*hot_rounds(writer, sock))
        tracker = ConnTracker(writer, sock, _ignore, _ignore)
        idle = per_call_us(lambda: tracker.poll(time.monotonic()))
        stuck = new_chunk(1, 0.0)  # out of the process, never sent: every look reads the kernel
        stuck[END], stuck[OUT] = tracker.ledger.written + 10**12, 0.0
        tracker.ledger.kernel.append(stuck)
        queued = per_call_us(lambda: tracker.poll(time.monotonic()))
        looks = await looks_per_chunk(writer, sock)
    finally:
        writer.close()
        await asyncio.sleep(0)
        drainer.wait(10)
    return {"hot_path_socket": hot, "look_idle_us": idle, "look_queued_us": queued, **looks}


async def looks_per_chunk(writer: asyncio.StreamWriter, sock: Any) -> dict[str, Any]:
    """400 chunks, 5 ms apart, through the real poller to a reader that keeps up."""
    delivery = DeliveryLane(_ignore)
    for key in ("write", "close"):
        writer.__dict__.pop(key, None)  # the hot-path rounds' wrappers
    tracker = ConnTracker(writer, sock, delivery.want, _ignore)
    looks = 0
    poll = tracker.poll

    def counted(now: float) -> bool:
        nonlocal looks
        looks += 1
        return poll(now)

    tracker.poll = counted  # type: ignore[method-assign]
    timers = 0
    arm = delivery._arm

    def counted_arm(at: float) -> None:
        nonlocal timers
        before = delivery._timer
        arm(at)
        timers += delivery._timer is not before

    delivery._arm = counted_arm  # type: ignore[method-assign]
    out = FlowOut("HTTP/1.1")
    out.conn = tracker
    tracker.outs.append(out)
    for _ in range(400):
        out.chunk(len(CHUNK), time.monotonic())
        writer.write(FRAMED)
        await asyncio.sleep(0.005)
    done = asyncio.Event()
    delivery.finish(out, done.set)
    await asyncio.wait_for(done.wait(), 5)
    return {
        "chunks": 400,
        "looks": looks,
        "looks_per_chunk": round(looks / 400, 3),
        "timers": timers,
        "timers_per_chunk": round(timers / 400, 3),
    }


def timer_us() -> float:
    """Scheduling one loop timer and cancelling it (call_later, TimerHandle.cancel)."""
    loop = asyncio.new_event_loop()
    try:
        return per_call_us(lambda: loop.call_later(0.001, _ignore).cancel())
    finally:
        loop.close()


def step_timing_us() -> float:
    """Two monotonic reads and one thread_time: what timing one measuring step adds."""

    def timed() -> None:
        time.monotonic()
        time.thread_time()
        time.monotonic()

    return per_call_us(timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    hot_stand_in = summary(*hot_rounds(stand_in_writer(StandInTransport()), socket.socket()))
    real = asyncio.run(on_a_socket())
    step = step_timing_us()
    timer = timer_us()
    looks = real["looks_per_chunk"]
    # per chunk: the hot path, its share of looks (each reading the kernel's queue) and of the
    # poller's timers, and the timing of one measuring step (one batch per event: the worst case)
    shared = real["look_queued_us"] * looks + timer * real["timers_per_chunk"]
    total = hot_stand_in["delta_us"] + shared + step
    total_socket = real["hot_path_socket"]["delta_us"] + shared + step
    # a busy proxy measures many chunks per step (200 lockstep streams: 200): at ten per step
    batched = hot_stand_in["delta_us"] + shared + step / 10
    when = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    doc = {
        "run": when,
        "python": sys.version.split()[0],
        "machine": platform.platform(),
        "events_per_round": EVENTS,
        "rounds": ROUNDS,
        "hot_path_stand_in": hot_stand_in,
        **real,
        "step_timing_us": step,
        "timer_us": timer,
        "per_event_us": round(total, 3),
        "per_event_us_socket": round(total_socket, 3),
        "per_event_us_ten_per_step": round(batched, 3),
        "target_per_event_us": 3.0,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{when}-delivery.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    for name in ("hot_path_stand_in", "hot_path_socket"):
        h = doc[name]
        print(f"{name}: plain {h['plain_us']} µs, followed {h['followed_us']} µs, "
              f"+{h['delta_us']} µs per event (IQR {h['delta_iqr_us']})")  # fmt: skip
    print(f"one look: {real['look_idle_us']} µs with nothing queued, "
          f"{real['look_queued_us']} µs reading the kernel's queue")  # fmt: skip
    print(f"looks per chunk, reader keeping up: {looks} ({real['looks']} for 400 chunks); "
          f"poller timers per chunk {real['timers_per_chunk']}, {timer} µs each")  # fmt: skip
    print(f"timing a measuring step: {step} µs per batch")
    print(f"per event, one per measuring step: {doc['per_event_us']} µs (stand-in), "
          f"{doc['per_event_us_socket']} µs (real socket); ten per step: "
          f"{doc['per_event_us_ten_per_step']} µs; target < 3 µs; written to {path}")  # fmt: skip


if __name__ == "__main__":
    main()
