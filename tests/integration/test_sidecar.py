"""hopmeter as a production sidecar: upstream failures answered and recorded, graceful drain,
readiness, configuration by environment; each through the real `hopmeter run` process.

Timeouts are short flags here (a second or two) so that the whole file runs in seconds; the
defaults are in the CLI (docs/design.md §3).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.harness.procs import (
    HOPMETER,
    Proc,
    free_port,
    hopmeter,
    measuring,
    port_open,
    read_records,
    wait_for,
)
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def event(i: int) -> bytes:
    """One OpenAI chat event carrying token `i`."""
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d "}}],"model":"gpt-4o"}\n\n' % i


def stream_body(events: int) -> bytes:
    """The whole body a scripted stream of `events` events sends."""
    return b"".join(event(i) for i in range(events)) + b"data: [DONE]\n\n"


def streaming(events: int, gap_s: float) -> Any:
    """A scripted upstream handler: `events` events `gap_s` apart, then [DONE]."""

    async def handler(ex: Exchange) -> None:
        await ex.head(SSE_HEADERS)
        for i in range(events):
            await ex.chunk(event(i))
            await asyncio.sleep(gap_s)
        await ex.chunk(b"data: [DONE]\n\n")
        await ex.end()

    return handler


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of `name`'s samples on the proxy's /metrics whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def readyz(port: int) -> tuple[int, str]:
    """/readyz's status and body."""
    r = httpx.get(f"http://127.0.0.1:{port}/readyz")
    return r.status_code, r.text


def refused(port: int) -> bool:
    """True when a new connection to 127.0.0.1:port is refused."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


class Stream(threading.Thread):
    """A client reading one streamed response in the background."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.body = b""
        self.error: str | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json={"stream": True}, timeout=30) as r:
                for piece in r.iter_bytes():
                    self.body += piece
        except httpx.HTTPError as exc:
            self.error = type(exc).__name__
        finally:
            self.finished.set()


@contextmanager
def streams(url: str, n: int) -> Iterator[list[Stream]]:
    """`n` streams under way (each has its first bytes)."""
    started = [Stream(url) for _ in range(n)]
    for s in started:
        s.start()
    wait_for(lambda: all(s.body for s in started), what="every stream under way")
    yield started
    for s in started:
        s.join(30)


# --- upstream failures ---------------------------------------------------------------------------
class _BadRequest(socketserver.BaseRequestHandler):
    """A plain-HTTP server's answer to a TLS hello: 400."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")


async def _silent(ex: Exchange) -> None:
    await asyncio.sleep(60)


async def _stalls(ex: Exchange) -> None:
    await ex.head(SSE_HEADERS)
    await ex.chunk(event(0))
    await asyncio.sleep(60)


class Failing:
    """One `hopmeter run` with a listener in front of each kind of failing upstream."""

    def __init__(self, proc: Proc, records: Path, metrics: int, ports: dict[str, int]) -> None:
        self.proc = proc
        self.records = records
        self.metrics = metrics
        self.ports = ports
        self.upstreams: dict[str, int] = {}

    def url(self, listener: str) -> str:
        """The chat URL of one listener."""
        return f"http://127.0.0.1:{self.ports[listener]}{CHAT}"

    def records_of(self, listener: str, count: int) -> list[dict[str, Any]]:
        """Wait for `count` records of `listener`'s flows, and return them."""

        def enough() -> list[dict[str, Any]] | None:
            if not self.records.exists():
                return None
            found = [orjson.loads(ln) for ln in self.records.read_bytes().splitlines() if ln]
            mine = [r for r in found if r["hop"] == listener]
            return mine if len(mine) >= count else None

        return wait_for(enough, what=f"{count} records of {listener}")


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Failing]:
    """Listeners `refused` and `flood` (nothing listens), `tls` (https:// to a plain port),
    `blackhole` (a full listen queue: SYNs dropped), `silent` (never answers) and `stalls`
    (silent after one event), with 1 s timeouts; one process for all, to keep the file quick."""
    tmp = tmp_path_factory.mktemp("failing")
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    filler = socket.create_connection(full.getsockname())  # the queue holds one: full now
    with (
        full,
        filler,
        socketserver.ThreadingTCPServer(("127.0.0.1", 0), _BadRequest) as plain,
        ScriptedUpstream(_silent) as silent,
        ScriptedUpstream(_stalls) as stalls,
    ):
        threading.Thread(target=plain.serve_forever, daemon=True).start()
        upstreams = {
            "refused": f"http://127.0.0.1:{free_port()}",
            "flood": f"http://127.0.0.1:{free_port()}",
            "tls": f"https://127.0.0.1:{plain.server_address[1]}",
            "blackhole": f"http://127.0.0.1:{full.getsockname()[1]}",
            "silent": f"http://127.0.0.1:{silent.port}",
            "stalls": f"http://127.0.0.1:{stalls.port}",
        }
        ports = {name: free_port() for name in upstreams}
        metrics, records = free_port(), tmp / "records.jsonl"
        listeners = [
            arg
            for name, url in upstreams.items()
            for arg in ("--listener", f"{name}=reverse:{url}@127.0.0.1:{ports[name]}")
        ]
        with hopmeter(
            tmp,
            "run",
            *listeners,
            *("--records", str(records), "--metrics", f"127.0.0.1:{metrics}"),
            *("--connect-timeout", "1", "--read-timeout", "1", "--summary-interval", "0"),
            ports=(*ports.values(), metrics),
        ) as proc:
            yield Failing(proc, records, metrics, ports)
            assert "Traceback" not in proc.output()
        plain.shutdown()


def test_dead_upstream_answers_502_with_a_record_and_a_metric_each(failing: Failing) -> None:
    """Nothing listens upstream: every client gets 502 within the connect timeout (a connect
    still pending at the 1 s timeout would have been a 504 connect_timeout), and every request
    has a record naming connect_refused, with the fix, and counts in flows_total."""
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: client.post(failing.url("refused"), json={}), range(20)))
    assert [r.status_code for r in got] == [502] * 20
    records = failing.records_of("refused", 20)
    assert {r["ended"] for r in records} == {"connect_refused"}
    for rec in records:
        assert "response" not in rec
        assert rec["upstream_error"]["status_sent"] == 502
        assert rec["upstream_error"]["detail"].startswith("ECONNREFUSED 127.0.0.1:")
        (finding,) = rec["findings"]
        assert finding["kind"] == "upstream_unreachable"
        assert "/readyz" in finding["fix"]
    counted = {"hop": "refused", "ended": "connect_refused", "status_class": "5xx"}
    wait_for(lambda: metric(failing.metrics, "hopmeter_flows_total", **counted) == 20)


def test_tls_to_a_plain_port_is_502_tls_failed(failing: Failing) -> None:
    """An https:// upstream URL for a plain-HTTP port (a server that answers a TLS hello with
    400, as HTTP servers do): 502, recorded tls_failed with the fix."""
    assert httpx.post(failing.url("tls"), json={}, timeout=10).status_code == 502
    (rec,) = failing.records_of("tls", 1)
    assert rec["ended"] == "tls_failed"
    assert rec["upstream_error"]["status_sent"] == 502
    assert "http://" in rec["findings"][0]["fix"]


def test_upstream_that_never_accepts_is_504_connect_timeout(failing: Failing) -> None:
    """An upstream whose listen queue is full (its SYNs dropped, like a black-holed host) is
    answered 504 at the connect timeout, not after the kernel's two minutes of retries."""
    r = httpx.post(failing.url("blackhole"), json={}, timeout=10)
    assert r.status_code == 504
    assert r.json()["error"]["type"] == "connect_timeout"
    (rec,) = failing.records_of("blackhole", 1)
    assert rec["ended"] == "connect_timeout"
    assert rec["upstream_error"]["status_sent"] == 504
    assert rec["upstream_error"]["timeout_s"] == 1.0
    assert rec["upstream_error"]["detail"].startswith("silent 1s 127.0.0.1:")


def test_upstream_that_accepts_and_never_answers_is_504(failing: Failing) -> None:
    """Connected, request sent, no response headers within the read timeout: the client gets a
    504 with an OpenAI-style error body, the record says upstream_timeout."""
    r = httpx.post(failing.url("silent"), json={"stream": True}, timeout=10)
    assert r.status_code == 504
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["type"] == "upstream_timeout"
    (rec,) = failing.records_of("silent", 1)
    assert rec["ended"] == "upstream_timeout"
    assert rec["upstream_error"]["status_sent"] == 504
    assert rec["findings"][0]["kind"] == "upstream_silent"


def test_stream_silent_after_its_headers_is_cut_as_upstream_idle(failing: Failing) -> None:
    """A stream that goes silent mid-body past the read timeout is cut; the client has every
    byte sent before the silence, and the record says upstream_idle with the status it had."""
    client = Stream(failing.url("stalls"))
    client.run()
    (rec,) = failing.records_of("stalls", 1)
    assert client.body == event(0)
    assert client.error == "RemoteProtocolError"  # a chunked body with no last chunk
    assert rec["ended"] == rec["response"]["ended"] == "upstream_idle"
    assert rec["response"]["status"] == 200
    assert rec["upstream_error"]["status_sent"] is None
    assert "upstream_silent" in [f["kind"] for f in rec["findings"]]


def test_a_thousand_failures_log_a_few_lines_not_one_per_request(failing: Failing) -> None:
    """1,000 requests to a dead upstream: 1,000 502s counted in the metric, and a handful of
    log lines in the proxy's whole output (mitmproxy's own included), never one per request."""
    before = len(failing.proc.output().splitlines())
    url = failing.url("flood")
    t0 = time.monotonic()
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda _: client.post(url, json={}).status_code, range(1000)))
    flood_s = time.monotonic() - t0
    assert statuses == [502] * 1000
    counted = {"hop": "flood", "ended": "connect_refused"}
    wait_for(lambda: metric(failing.metrics, "hopmeter_flows_total", **counted) == 1000)
    output = failing.proc.output().splitlines()
    lines = output[before:]
    print(f"1,000 refused requests in {flood_s:.1f}s: {len(lines)} log lines: {lines}")
    # connect_refused's first line (logged at once, here or in an earlier test), then one line
    # per 10 s interval while failures of it go on
    assert any("hopmeter: upstream connect_refused (ECONNREFUSED" in ln for ln in output)
    assert all("connect_refused" in ln for ln in lines)
    assert len(lines) <= 3 + flood_s / 10


# --- drain ---------------------------------------------------------------------------------------
def test_sigterm_lets_three_streams_finish_and_refuses_new_connections(tmp_path: Path) -> None:
    """SIGTERM during three long streams: a new connection is refused while they run, an idle
    keep-alive connection is closed, /readyz says draining, and the three streams complete
    byte-identical and are recorded complete before the proxy exits 0."""
    metrics = free_port()
    long, short = streaming(25, 0.1), streaming(1, 0)

    async def handler(ex: Exchange) -> None:
        await (short if ex.path == "/short" else long)(ex)

    with (
        ScriptedUpstream(handler) as up,
        measuring(
            tmp_path,
            f"http://127.0.0.1:{up.port}",
            *("--metrics", f"127.0.0.1:{metrics}", "--drain-timeout", "30"),
            ports=(metrics,),
        ) as proxy,
    ):
        idle = socket.create_connection(("127.0.0.1", proxy.port))
        idle.sendall(b"GET /short HTTP/1.1\r\nhost: x\r\n\r\n")
        read_records(proxy.records, 1)  # answered whole: the connection is now idle
        with idle, streams(proxy.url + CHAT, 3) as running:
            proxy.proc.popen.send_signal(signal.SIGTERM)
            wait_for(lambda: refused(proxy.port), what="the listener to close")
            assert not any(s.finished.is_set() for s in running)  # refused *during* the drain
            assert readyz(metrics) == (503, "not ready: draining: finishing the streams in "
                                       "flight, accepting no new ones\n")  # fmt: skip
            idle.settimeout(10)
            while idle.recv(65536):  # the rest of its response, then the proxy's close
                pass
        assert proxy.proc.popen.wait(30) == 0
    print([ln for ln in proxy.proc.output().splitlines() if "drain" in ln])
    assert [s.error for s in running] == [None] * 3
    assert [s.body for s in running] == [stream_body(25)] * 3
    records = read_records(proxy.records, 4)
    assert [r["ended"] for r in records] == ["complete"] * 4
    assert "Traceback" not in proxy.proc.output()


def test_second_sigterm_stops_at_once_with_records(tmp_path: Path) -> None:
    """Two SIGTERMs: the proxy stops without waiting for the streams, and records each of them
    as shutdown."""
    with (
        ScriptedUpstream(streaming(600, 0.05)) as up,
        measuring(tmp_path, f"http://127.0.0.1:{up.port}", "--drain-timeout", "60") as proxy,
        streams(proxy.url + CHAT, 3) as running,
    ):
        proxy.proc.popen.send_signal(signal.SIGTERM)
        wait_for(lambda: refused(proxy.port), what="the drain to start")
        proxy.proc.popen.send_signal(signal.SIGTERM)
        assert proxy.proc.popen.wait(15) == 0
        assert not any(s.body == stream_body(600) for s in running)
    records = read_records(proxy.records, 3)
    assert [r["ended"] for r in records] == ["shutdown"] * 3
    assert all(r["figures"]["events"] >= 1 for r in records)


# --- readiness -----------------------------------------------------------------------------------
def test_readyz_fails_until_the_upstream_listens(tmp_path: Path) -> None:
    """/readyz answers 503 naming the cause while nothing listens upstream, and 200 once it
    does; /healthz answers 200 throughout."""
    metrics, upstream = free_port(), free_port()
    with measuring(
        tmp_path,
        f"http://127.0.0.1:{upstream}",
        *("--metrics", f"127.0.0.1:{metrics}", "--set", "hopmeter_ready_interval=0.2"),
        ports=(metrics,),
    ):
        wait_for(lambda: "not checked yet" not in readyz(metrics)[1], what="the first check")
        assert readyz(metrics) == (503, f"not ready: 127.0.0.1:{upstream} connect_refused "
                                   "(ECONNREFUSED)\n")  # fmt: skip
        assert httpx.get(f"http://127.0.0.1:{metrics}/healthz").status_code == 200
        with socket.create_server(("127.0.0.1", upstream)):
            wait_for(lambda: readyz(metrics)[0] == 200, what="/readyz to pass")
            assert readyz(metrics)[1] == f"ready: 127.0.0.1:{upstream} accepts connections\n"


# --- the long run: the upstream restarts under traffic -------------------------------------------
def upstream_proc(tmp: Path, port: int, name: str) -> Proc:
    """`hopmeter upstream` on `port`, listening."""
    proc = Proc([*HOPMETER, "upstream", "--listen", f"127.0.0.1:{port}"], tmp / f"{name}.log")
    proc.wait_port(port)
    return proc


def open_fds(pid: int) -> int:
    """How many file descriptors a process has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


class Traffic(threading.Thread):
    """Short streams one after another on fresh connections, each outcome noted with its time."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.outcomes: list[tuple[float, float, str]] = []  # (start, end, status or error)

    def run(self) -> None:
        headers = {"x-hopmeter-scenario": "tokens=5;rate=200"}
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = httpx.post(self.url, json={"stream": True}, headers=headers, timeout=10)
                outcome = str(r.status_code)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            self.outcomes.append((t0, time.monotonic(), outcome))


def test_upstream_restart_under_traffic(tmp_path: Path) -> None:
    """Kill the upstream under traffic and bring it back on the same port: no request hangs,
    every request has a record, 502s come only while it is down, and afterwards the metrics
    count every flow, no stream is left open and /readyz passes."""
    port, metrics = free_port(), free_port()
    up = upstream_proc(tmp_path, port, "upstream1")
    try:
        with measuring(
            tmp_path,
            f"http://127.0.0.1:{port}",
            *("--metrics", f"127.0.0.1:{metrics}", "--quiet"),
            *("--set", "hopmeter_ready_interval=0.2"),
            ports=(metrics,),
        ) as proxy:
            clients = [Traffic(proxy.url + CHAT) for _ in range(4)]
            for c in clients:
                c.start()
            wait_for(lambda: all(len(c.outcomes) >= 3 for c in clients), what="traffic")
            fds = open_fds(proxy.proc.popen.pid)
            killed = time.monotonic()
            up.stop(signal.SIGKILL)
            wait_for(lambda: sum(o[2] == "502" for c in clients for o in c.outcomes) >= 10)
            wait_for(lambda: readyz(metrics)[0] == 503, what="/readyz to fail")
            up = upstream_proc(tmp_path, port, "upstream2")
            back = time.monotonic()
            n = sum(len(c.outcomes) for c in clients)
            wait_for(lambda: sum(len(c.outcomes) for c in clients) >= n + 20, what="recovery")
            for c in clients:
                c.stop.set()
                c.join(15)
            assert not any(c.is_alive() for c in clients)  # no request hung
            outcomes = [o for c in clients for o in c.outcomes]
            records = read_records(proxy.records, len(outcomes))
            assert len(records) == len(outcomes)
            # a stream under way when the upstream died is cut (the client sees an incomplete body)
            cut = [o for o in outcomes if o[2] not in ("200", "502")]
            assert all(o[2] == "RemoteProtocolError" and o[0] <= killed <= o[1] for o in cut)
            failed = [o for o in outcomes if o[2] == "502"]
            assert failed and all(end >= killed and start <= back for start, end, _ in failed)
            assert all(o[2] == "200" for o in outcomes if o[0] > back)
            wait_for(lambda: metric(metrics, "hopmeter_flows_total") == len(outcomes))
            # each 502 is counted under its cause: nearly all find nothing listening; a connect the
            # dying (or starting) upstream's kernel accepted and then reset is an upstream_reset
            causes = Counter(r["ended"] for r in records if "response" not in r)
            assert sum(causes.values()) == len(failed)
            assert set(causes) <= {"connect_refused", "upstream_reset"}
            assert causes["connect_refused"] >= len(failed) - 2
            for ended in causes:  # the 502s, and any stream cut at the kill (upstream_reset)
                n = sum(r["ended"] == ended for r in records)
                assert metric(metrics, "hopmeter_flows_total", ended=ended) == n
            assert metric(metrics, "hopmeter_streams_active") == 0
            wait_for(lambda: readyz(metrics)[0] == 200, what="/readyz to pass again")
            # no connection left open: the proxy's descriptors are back where traffic had them
            pid = proxy.proc.popen.pid
            wait_for(lambda: open_fds(pid) <= fds + 4, what="the proxy's connections to close")
            print(
                f"{len(outcomes)} requests: {len(failed)} answered 502 while the upstream was "
                f"down ({back - killed:.1f}s), {len(cut)} cut at the kill, the rest 200"
            )
    finally:
        up.stop()


# --- configuration by environment ----------------------------------------------------------------
def test_run_configured_by_environment_only(tmp_path: Path) -> None:
    """`hopmeter run` with no flags takes its upstream, listen address, records and metrics
    from HOPMETER_* variables; a flag given as well wins over its variable."""
    port, metrics = free_port(), free_port()
    records = tmp_path / "env.jsonl"
    with ScriptedUpstream(streaming(3, 0)) as up:
        env = {
            "HOPMETER_UPSTREAM": f"http://127.0.0.1:{up.port}",
            "HOPMETER_LISTEN": f"127.0.0.1:{free_port()}",  # the flag below wins
            "HOPMETER_RECORDS": str(records),
            "HOPMETER_METRICS": f"127.0.0.1:{metrics}",
            "HOPMETER_HOP": "pod",
            "HOPMETER_QUIET": "true",
        }
        with hopmeter(
            tmp_path, "run", "--listen", f"127.0.0.1:{port}", env=env, ports=(port, metrics)
        ):
            r = httpx.post(f"http://127.0.0.1:{port}{CHAT}", json={"stream": True})
            assert r.content == stream_body(3)
            (rec,) = read_records(records, 1)
    assert (rec["hop"], rec["ended"]) == ("pod", "complete")
    assert not port_open(int(env["HOPMETER_LISTEN"].rsplit(":", 1)[1]))
