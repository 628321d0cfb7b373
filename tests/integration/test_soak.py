"""A soak through one running `hopmeter run`: many mixed flows (short streams, errors, resets,
clients leaving, non-LLM bodies) under random paths and model names. Afterwards memory and open
files are back near where they started, every flow was recorded once, and the metric series are
bounded.

The suite runs 6,000 flows; `HOPMETER_SOAK_FLOWS=100000` runs the full soak (a few minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest

from hopmeter.export.labels import DEFAULT_MODEL_FAMILIES
from tests.harness.procs import free_port, hopmeter, rss_kib, wait_for

pytestmark = pytest.mark.integration

FLOWS = int(os.environ.get("HOPMETER_SOAK_FLOWS", "6000"))
CONNECTIONS = 64  # concurrent client connections, each kept alive across its flows
WARMUP_FLOWS = 600  # before the baseline: tokenizer loaded, caches and arenas at working size
REQUEST_TIMEOUT_S = 20.0
SEED = 20260


# -- the upstream: one asyncio server in the test's loop, behaviour chosen per request ------------


def _event(i: int) -> bytes:
    return b'data: {"choices":[{"delta":{"content":" tok%d"}}]}\n\n' % i


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


async def _respond(kind: str, writer: asyncio.StreamWriter) -> bool:
    """Answer one request; False when the connection is to be dropped."""
    if kind in ("sse", "slow"):
        body = b"".join(_chunk(_event(i)) for i in range(random.randint(3, 8)))
        writer.write(SSE_HEAD + body)
        if kind == "slow":  # the client leaves during the pause
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    elif kind == "ndjson":
        lines = [b'{"message":{"content":"w%d"},"done":false}\n' % i for i in range(4)]
        lines.append(b'{"done":true,"eval_count":4}\n')
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + b"".join(map(_chunk, lines)) + b"0\r\n\r\n"
        )
    elif kind == "reset":
        writer.write(SSE_HEAD + _chunk(_event(0)) + _chunk(_event(1)))
        await writer.drain()
        writer.transport.abort()
        return False
    elif kind == "error":
        body = b'{"error":{"message":"overloaded","type":"server_error"}}'
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
    else:  # "blob": no LLM at all
        body = os.urandom(random.randint(256, 4096))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
    await writer.drain()
    return True


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            headers = _headers(head)
            if "content-length" in headers:
                await reader.readexactly(int(headers["content-length"]))
            if not await _respond(headers.get("x-soak", "blob"), writer):
                return
    writer.close()


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        out[name.strip().lower()] = value.strip()
    return out


# -- the clients ---------------------------------------------------------------------------------

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def _word(rng: random.Random, n: int = 10) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@dataclass
class Plan:
    """What one flow sends and how the client treats the answer."""

    kind: str
    method: str
    path: str
    body: bytes


def plan(rng: random.Random) -> Plan:
    """A random flow: mostly short chat streams, with errors, resets, leavers and plain bodies."""
    roll = rng.random()
    model = rng.choice(["gpt-4o-mini", "claude-sonnet-4", "llama-3.1-8b"])
    if rng.random() < 0.5:
        model = f"{rng.choice(['gpt', 'ft', 'x'])}-{_word(rng)}"  # random model names
    chat = rng.choice(["/v1/chat/completions", f"/v1/{_word(rng)}/chat/completions"])
    body = orjson.dumps({"model": model, "stream": True, "messages": []})
    if roll < 0.55:
        return Plan("sse", "POST", chat, body)
    if roll < 0.65:
        return Plan("ndjson", "POST", "/api/chat", body)
    if roll < 0.72:
        return Plan("error", "POST", chat, body)
    if roll < 0.78:
        return Plan("reset", "POST", chat, body)
    if roll < 0.84:
        return Plan("slow", "POST", chat, body)  # the client leaves after the first event
    return Plan("blob", "GET", f"/static/{_word(rng)}/{_word(rng, 6)}.png", b"")


@dataclass
class Tally:
    """What the clients saw."""

    sent: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)


async def _read_response(reader: asyncio.StreamReader, leave_early: bool) -> bool:
    """Read one response; True when the connection can carry the next request."""
    head = await reader.readuntil(b"\r\n\r\n")
    headers = _headers(head)
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
        return True
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if leave_early:
            return False  # the first chunk's size is in: hang up mid-stream
        await reader.readexactly(size + 2)
        if size == 0:
            return True


async def client(port: int, plans: list[Plan], tally: Tally) -> None:
    """Send `plans` one after another on a kept-alive connection, reconnecting when it drops."""
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    for p in plans:
        if conn is None:
            conn = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = conn
        tally.sent[p.kind] += 1
        writer.write(
            f"{p.method} {p.path} HTTP/1.1\r\nhost: soak\r\nx-soak: {p.kind}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(p.body)}\r\n\r\n".encode()
            + p.body
        )
        keep = False
        try:
            keep = await asyncio.wait_for(
                _read_response(reader, p.kind == "slow"), REQUEST_TIMEOUT_S
            )
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if p.kind != "reset":
                tally.failed.append(f"{p.kind} {p.path}: {exc!r}")
        if not keep:
            writer.close()
            conn = None
    if conn is not None:
        conn[1].close()


async def soak(port: int, flows: int, seed: int) -> tuple[Tally, float]:
    """Run `flows` flows over CONNECTIONS connections; what the clients saw and the seconds."""
    rng = random.Random(seed)
    plans = [plan(rng) for _ in range(flows)]
    tally = Tally()
    t0 = time.monotonic()
    await asyncio.gather(*(client(port, plans[i::CONNECTIONS], tally) for i in range(CONNECTIONS)))
    return tally, time.monotonic() - t0


# -- measuring the proxy -------------------------------------------------------------------------


def open_fds(pid: int) -> int:
    """How many file descriptors a process holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(port: int) -> str:
    """The /metrics text."""
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def series(text: str) -> int:
    """How many time series a scrape holds (sample lines)."""
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def label_values(text: str) -> dict[str, set[str]]:
    """Every value each label takes in a scrape."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        labels = line[line.index("{") + 1 : line.rindex("}")]
        for pair in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels):
            out.setdefault(pair[0], set()).add(pair[1])
    return out


def flows_counted(text: str) -> int:
    """The sum of hopmeter_flows_total over its label sets."""
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("hopmeter_flows_total{")
        )
    )


def streams_active(text: str) -> float:
    """The hopmeter_streams_active gauge."""
    line = next(ln for ln in text.splitlines() if ln.startswith("hopmeter_streams_active"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.timeout(max(120, FLOWS // 40))  # ~350 flows/s on 2 cores; the full soak needs more
def test_soak_mixed_flows(tmp_path: Path) -> None:
    """FLOWS mixed flows: each recorded once, memory and fds back near baseline, series bounded."""
    port, metrics_port = free_port(), free_port()
    records = tmp_path / "records.jsonl"
    report: dict[str, object] = {}
    # The upstream and the clients share one event loop in this thread; the upstream serves
    # whenever the loop runs (during each soak, and while waiting for the proxy to settle).
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(_serve, "127.0.0.1", 0))
    upstream_port = server.sockets[0].getsockname()[1]
    try:
        with hopmeter(
            tmp_path,
            "run",
            f"http://127.0.0.1:{upstream_port}",
            "--listen",
            f"127.0.0.1:{port}",
            "--records",
            str(records),
            "--metrics",
            f"127.0.0.1:{metrics_port}",
            "--quiet",
            ports=(port, metrics_port),
        ) as proxy:
            pid = proxy.popen.pid

            def settled(expected: int) -> str | None:
                loop.run_until_complete(asyncio.sleep(0.05))  # let the upstream finish writes
                text = scrape(metrics_port)
                ok = flows_counted(text) >= expected and streams_active(text) == 0
                return text if ok else None

            loop.run_until_complete(soak(port, WARMUP_FLOWS, SEED))
            wait_for(lambda: settled(WARMUP_FLOWS), 30, "the warm-up flows")
            rss0, fds0 = rss_kib(pid), open_fds(pid)
            half = FLOWS // 2
            first, s1 = loop.run_until_complete(soak(port, half, SEED + 1))
            text1 = wait_for(lambda: settled(WARMUP_FLOWS + half), 60, "the first half")
            rss1 = rss_kib(pid)
            second, s2 = loop.run_until_complete(soak(port, FLOWS - half, SEED + 2))
            total = WARMUP_FLOWS + FLOWS
            text2 = wait_for(lambda: settled(total), 60, "the second half")
            fds2 = wait_for(
                lambda: (n := open_fds(pid)) <= fds0 + 4 and n, 30, "connections closed"
            )
            rss2 = rss_kib(pid)
            report.update(
                flows=FLOWS,
                seconds=round(s1 + s2, 2),
                flows_per_s=round(FLOWS / (s1 + s2), 1),
                rss_baseline_kb=rss0,
                rss_half_kb=rss1,
                rss_end_kb=rss2,
                fds_baseline=fds0,
                fds_end=fds2,
                series_half=series(text1),
                series_end=series(text2),
                failed=len(first.failed) + len(second.failed),
            )
            print(f"\nsoak: {report}")
            assert not first.failed and not second.failed, (first.failed + second.failed)[:5]
            assert flows_counted(text2) == total
            lines = [ln for ln in records.read_bytes().split(b"\n") if ln.strip()]
            assert len(lines) == total  # every flow recorded exactly once
            ended = Counter(orjson.loads(ln)["response"]["ended"] for ln in lines[-200:])
            assert ended["complete"] > 100
            # bounded: random model names and paths collapse into "other", so the label values
            # are a fixed small set, whatever the traffic
            values = label_values(text2)
            families = {*DEFAULT_MODEL_FAMILIES.values(), "other", "none"}
            assert values["model"] <= families and len(values["model"]) <= 12, values["model"]
            assert values["route"] <= {"/v1/chat/completions", "/api/chat", "other"}
            assert max(len(v) for k, v in values.items() if k != "le") <= 32, values
            assert series(text2) < 5000
            # memory does not grow with flows: the second half costs no more than a slack
            assert rss2 - rss1 < 24 * 1024, (rss1, rss2)
            assert rss2 - rss0 < 48 * 1024, (rss0, rss2)
            assert "Traceback" not in proxy.output()
    finally:
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()
