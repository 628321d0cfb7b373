"""Bytes out on real processes: slow clients told apart from a slow hop, and hopmeter's own cost.

One upstream stream (400 events of 8 KiB, 5 ms apart: 3.2 MB in 2 s) read by real clients over
loopback: one that reads fast, one that sleeps between reads, one with a tiny receive buffer. A
slow client's wait is compared with what the client itself logged: the time it slept while bytes
were already waiting for it. What the proxy cannot see is what the client's kernel holds unread
(its receive buffer) at the start and the end, so the stream is long next to that buffer's worth
at the client's pace (docs/reliability.md §3).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import sys
import termios
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.findings import stream_kinds
from tests.harness.h2client import PacedStream, read_streams
from tests.harness.procs import Measuring, Proc, free_port, measuring, read_records, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

EVENTS = 400
EVENT_BYTES = 8 * 1024
EVERY_S = 0.005
# The upstream's pace: 1.6 MB/s. The slow readers take 800 KB/s, half of it. A default receive
# buffer holds ~120 KB unread at each end of the stream, out of the proxy's sight: 3.2 MB keeps
# that under 4% of the wait.
SLOW_READ_BYTES, SLOW_SLEEP_S = 8192, 0.01
TINY_RCVBUF, TINY_READ_BYTES, TINY_SLEEP_S = 4096, 4096, 0.005
# "within 10% of what the client itself logged" (the bound)
WAIT_TOLERANCE = 0.10


def event(i: int, size: int) -> bytes:
    """One chat event of about `size` bytes."""
    pad = "x" * max(0, size - 64)
    return f'data: {{"choices":[{{"delta":{{"content":"w{i} {pad}"}}}}]}}\n\n'.encode()


async def _serve(ex: Exchange) -> None:
    """`EVENTS` events on a clock; `small` paths get 400 small ones, `h2` paths 60 of 8 KiB at
    20 ms, `stall` paths 50 small ones at 20 ms."""
    await ex.head({"content-type": "text/event-stream", "cache-control": "no-cache"})
    count, size, every = EVENTS, EVENT_BYTES, EVERY_S
    if "small" in ex.path:
        count, size = 400, 200
    elif "h2" in ex.path:
        count, every = 60, 0.02
    elif "stall" in ex.path:
        count, size, every = 50, 200, 0.02
    for i in range(count):
        await ex.chunk(event(i, size))
        await asyncio.sleep(every)
    await ex.chunk(b"data: [DONE]\n\n")
    await ex.end()


@dataclass
class Read:
    """What a client saw: the body and the time it slept while bytes already waited for it."""

    body: bytes
    slept_pending_s: float


def read_http1(port: int, path: str, read_bytes: int, sleep_s: float, rcvbuf: int = 0) -> Read:
    """GET `path` over a raw socket, `read_bytes` per recv, sleeping `sleep_s` after each."""
    with socket.socket() as s:
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window
        s.settimeout(30)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        body, slept = bytearray(), 0.0
        while not body.endswith(b"\r\n0\r\n\r\n"):
            data = s.recv(read_bytes)
            if not data:
                break
            body += data
            if sleep_s:
                t0 = time.monotonic()
                time.sleep(sleep_s)  # the slow reader's work per read: the point of this test
                if _unread(s):  # bytes waited for this reader while it slept
                    slept += time.monotonic() - t0
    return Read(bytes(body), slept)


def _unread(s: socket.socket) -> int:
    """Bytes in the socket's receive queue (FIONREAD)."""
    value: int = struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    return value


def kinds(rec: dict[str, Any]) -> list[str]:
    """The kinds of a record's findings."""
    return [f["kind"] for f in rec["findings"]]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Measuring]:
    """`hopmeter run` in front of the clocked upstream, given the CPU first on this machine.

    The hop's own hold is a property of the hop: on a 2-core machine shared with other work, a
    proxy preempted by whatever else runs would measure the host instead. So, where allowed, the
    proxy runs at a higher priority, as bench/ pins it (the test still passes without it on an
    idle machine).
    """
    tmp = tmp_path_factory.mktemp("delivery")
    confdir = tmp / "mitm"
    with (
        ScriptedUpstream(_serve) as up,
        measuring(tmp, f"http://127.0.0.1:{up.port}", "--set", f"confdir={confdir}") as hop,
    ):
        with contextlib.suppress(OSError):  # not allowed: run at the default priority
            os.setpriority(os.PRIO_PROCESS, hop.proc.popen.pid, -10)
        yield hop


def record_for(proxy: Measuring, path: str) -> dict[str, Any]:
    """The one record of `path` (each test asks for a path of its own)."""

    def found() -> list[dict[str, Any]] | None:
        recs = [r for r in read_records(proxy.records, 1, 60) if r["request"]["path"] == path]
        return recs or None

    recs = wait_for(found, 60, f"the record of {path}")
    assert len(recs) == 1, (path, len(recs))
    return recs[0]


def _measured_wait(rec: dict[str, Any]) -> float:
    d = rec["delivery"]
    assert d["measured"] and d["reason"] is None, d
    assert not d["client_wait_is_lower_bound"]
    wait: float = d["client_wait_s"]
    return wait


@pytest.fixture(scope="module")
def slow_reads(proxy: Measuring) -> dict[str, Read]:
    """The sleepy reader and the tiny-buffer reader, side by side on two connections."""
    jobs = {
        "/v1/chat/completions/sleepy": (SLOW_READ_BYTES, SLOW_SLEEP_S, 0),
        "/v1/chat/completions/tiny": (TINY_READ_BYTES, TINY_SLEEP_S, TINY_RCVBUF),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {
            path: pool.submit(read_http1, proxy.port, path, *how) for path, how in jobs.items()
        }
        return {path: f.result() for path, f in futures.items()}


def test_a_reader_that_sleeps_between_reads_is_a_slow_client(
    proxy: Measuring, slow_reads: dict[str, Read]
) -> None:
    """Reads with a sleep after each: slow_client, the wait within 10% of the reader's own log."""
    got = slow_reads["/v1/chat/completions/sleepy"]
    rec = record_for(proxy, "/v1/chat/completions/sleepy")
    assert got.body.count(b"\n\n") == EVENTS + 1
    wait = _measured_wait(rec)
    print(f"\nsleepy reader: client wait {wait:.3f} s, it slept {got.slept_pending_s:.3f} s")
    assert "slow_client" in kinds(rec)
    assert abs(wait - got.slept_pending_s) <= WAIT_TOLERANCE * got.slept_pending_s
    # the hop itself kept nothing back: every chunk left in the step that read it
    assert rec["delivery"]["hold_p99_s"] < rec["delivery"]["client_wait_s"] / 100
    assert len(rec["chunks_out"]) == len(rec["chunks"])


def test_a_reader_with_a_tiny_receive_buffer_is_a_slow_client(
    proxy: Measuring, slow_reads: dict[str, Read]
) -> None:
    """A 4 KiB receive buffer: slow_client, the wait within 10%, the kernel agreeing on why."""
    got = slow_reads["/v1/chat/completions/tiny"]
    rec = record_for(proxy, "/v1/chat/completions/tiny")
    assert got.body.count(b"\n\n") == EVENTS + 1
    wait = _measured_wait(rec)
    print(f"\ntiny buffer: client wait {wait:.3f} s, it slept {got.slept_pending_s:.3f} s")
    assert "slow_client" in kinds(rec)
    assert abs(wait - got.slept_pending_s) <= WAIT_TOLERANCE * got.slept_pending_s
    finding = next(f for f in rec["findings"] if f["kind"] == "slow_client")
    # the kernel's own account: the client's receive window was the limit most of that time
    assert finding["evidence"]["rwnd_limited_s"] > 0.5 * wait
    # bytes waited in the kernel's send queue and in the proxy's write buffer
    assert finding["evidence"]["queued_bytes_max"] > 64 * 1024


def test_the_same_stream_read_fast_waits_on_nobody(proxy: Measuring) -> None:
    """Read as fast as it comes: no slow_client, no proxy_hold, every chunk sent when it left."""
    with httpx.Client(timeout=30) as client:
        body = client.get(f"{proxy.url}/v1/chat/completions/fast").content
    rec = record_for(proxy, "/v1/chat/completions/fast")
    assert body.count(b"\n\n") == EVENTS + 1
    assert not {"slow_client", "proxy_hold"} & set(stream_kinds(rec))
    wait = _measured_wait(rec)
    assert wait < 0.05 * rec["figures"]["duration_s"]


def test_a_fast_reader_gets_every_chunk_out_in_order_after_it_came_in(proxy: Measuring) -> None:
    """400 small events read fast: each chunk has an out time, at or after its read, in the
    order the chunks came; the hop's hold figures are in order and within those times.

    On loopback a chunk leaves in the step that read it, so its hold is hopmeter's and
    mitmproxy's work on it: how long that is, is measured by bench/hold.py (p99 under 1 ms).
    """
    with httpx.Client(timeout=30) as client:
        client.get(f"{proxy.url}/v1/chat/completions/small").raise_for_status()
    rec = record_for(proxy, "/v1/chat/completions/small")
    ins, outs = [c[0] for c in rec["chunks"]], [out[0] for out in rec["chunks_out"]]
    assert len(ins) == len(outs) == 401  # 400 events and [DONE], each a chunk of its own
    assert all(o >= i for i, o in zip(ins, outs, strict=True))
    assert outs == sorted(outs) and ins == sorted(ins)
    d = rec["delivery"]
    # the hold runs from the read to the write, which is at or before the out time
    longest = max(o - i for i, o in zip(ins, outs, strict=True))
    assert 0 <= d["hold_p50_s"] <= d["hold_p99_s"] <= d["hold_max_s"] <= longest + 2e-6
    assert d["negative_holds"] == 0


def test_http2_streams_are_followed_one_by_one(proxy: Measuring) -> None:
    """On one HTTP/2 connection, the stream read slowly is slow_client and its neighbour is not."""
    slow = PacedStream("/v1/chat/completions/h2-slow", take_bytes=2048, every_s=0.01)
    fast = PacedStream("/v1/chat/completions/h2-fast")
    read_streams("127.0.0.1", proxy.port, 4096, [slow, fast])
    slowed = record_for(proxy, slow.path)
    quick = record_for(proxy, fast.path)
    assert quick["delivery"]["http_version"] == slowed["delivery"]["http_version"] == "HTTP/2.0"
    assert "slow_client" in kinds(slowed) and "slow_client" not in kinds(quick)
    wait = _measured_wait(slowed)
    print(f"\nHTTP/2 slow stream: client wait {wait:.3f} s, it slept {slow.slept_pending_s:.3f} s")
    # what it cannot see is the client's own window: 4 KiB at 200 KB/s, 20 ms at each end
    assert abs(wait - slow.slept_pending_s) <= WAIT_TOLERANCE * slow.slept_pending_s
    assert _measured_wait(quick) < 0.05 * quick["figures"]["duration_s"]
    assert slow.body.count(b"\n\n") == fast.body.count(b"\n\n") == 61


def test_a_stalled_measuring_step_is_proxy_hold_at_hopmeters_own_hop(tmp_path: Path) -> None:
    """hopmeter's measuring made slow on purpose (a test script spins in it): proxy_hold, at the
    hop hopmeter stands on, with its own step's CPU in evidence; nothing blames the upstream."""
    from hopmeter.cli import addon_path

    stall = Path(__file__).with_name("slow_measure.py")
    port = free_port()
    records = tmp_path / "records.jsonl"
    mitmdump = str(Path(sys.executable).with_name("mitmdump"))
    with ScriptedUpstream(_serve) as up:
        proc = Proc(
            [
                mitmdump,
                "-s",
                str(addon_path()),
                "-s",
                str(stall),
                "--mode",
                f"reverse:http://127.0.0.1:{up.port}@127.0.0.1:{port}",
                "--set",
                "hopmeter_hop=edge",
                "--set",
                f"hopmeter_records={records}",
                "--set",
                "hopmeter_metrics=off",
                "--set",
                f"confdir={tmp_path / 'mitm'}",
            ],
            tmp_path / "mitmdump.log",
        )
        try:
            proc.wait_port(port)
            with httpx.Client(timeout=30) as client:
                client.get(f"http://127.0.0.1:{port}/v1/chat/completions/stall").raise_for_status()
            rec = read_records(records, 1, 60)[0]
        finally:
            proc.stop()
    assert rec["hop"] == "edge"
    hold = next(f for f in rec["findings"] if f["kind"] == "proxy_hold")
    ev = hold["evidence"]
    print(f"\nstalled measuring: {ev}")
    assert ev["own_step_max_cpu_s"] >= 0.05  # the 60 ms spin, counted as hopmeter's own CPU
    assert ev["own_steps"] >= 1 and ev["own_step_max_s"] >= ev["own_step_max_cpu_s"]
    # the chunks themselves were written in the step that read them: the stall delayed reading
    assert rec["delivery"]["hold_p99_s"] < 0.05
    assert "slow_client" not in kinds(rec)
