"""The beacon endpoint of a real `hopmeter run --browser` against bad beacons, and its absence
without the flag.

Every bad beacon (malformed, wrong types, oversized, unsized, from another origin, for a trace
nobody announced, twice, a flood) gets a clear 4xx (or, for a body too long to read, a closed
connection), is counted in hopmeter_beacons_total, never reaches the upstream, and the proxy
goes on streaming. A beacon from the right page joins its record.
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.harness.beacons import ANNOUNCE, beacon, reads_of, traceparent
from tests.harness.beacons import PAGE_ORIGIN as ORIGIN_PAGE
from tests.harness.procs import Proc, free_port, hopmeter, wait_for

pytestmark = pytest.mark.integration
EVIL = "http://evil.example"
HEAD = b"POST /_hopmeter/beacon HTTP/1.1\r\nHost: x\r\n"


@dataclass
class Proxy:
    """One `hopmeter run` in front of the pages upstream."""

    port: int
    metrics_port: int
    records: Path
    upstream: Proc  # the demo upstream behind it, printing each request it sees

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def read(path: Path) -> list[dict[str, Any]]:
    """The records written so far (a line still being written is not one yet)."""
    if not path.exists():
        return []
    complete = path.read_bytes().split(b"\n")[:-1]
    return [orjson.loads(line) for line in complete if line.strip()]


def pages_upstream(tmp: Path) -> tuple[Proc, int]:
    """The demo upstream, printing every request it sees, listening; and its port."""
    port = free_port()
    proc = Proc([sys.executable, "-m", "tests.harness.pages_upstream", str(port)], tmp / "up.log")
    proc.wait_port(port)
    return proc, port


@contextlib.contextmanager
def running(tmp: Path, *flags: str) -> Iterator[Proxy]:
    """A demo upstream and `hopmeter run FLAGS` in front of it, with metrics and records."""
    up, up_port = pages_upstream(tmp)
    port, metrics = free_port(), free_port()
    records = tmp / "flows.jsonl"
    args = ["run", f"http://127.0.0.1:{up_port}", "--listen", f"127.0.0.1:{port}", *flags]
    args += ["--records", str(records), "--metrics", f"127.0.0.1:{metrics}", "--quiet"]
    try:
        with hopmeter(tmp, *args, ports=(port, metrics)):
            yield Proxy(port=port, metrics_port=metrics, records=records, upstream=up)
    finally:
        up.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """`hopmeter run --browser --hop edge`."""
    with running(tmp_path_factory.mktemp("browser"), "--browser", "--hop", "edge") as p:
        yield p


def post(p: Proxy, body: bytes, origin: str = ORIGIN_PAGE) -> httpx.Response:
    """POST `body` to the beacon endpoint as sendBeacon does (text/plain, with an Origin)."""
    headers = {"content-type": "text/plain;charset=UTF-8", "origin": origin}
    return httpx.post(f"{p.url}/_hopmeter/beacon", content=body, headers=headers, timeout=10)


def stream(p: Proxy, tp: str, announce: bool = True) -> bytes:
    """A streamed chat reply through the proxy, from the page's origin, announcing a beacon."""
    headers = {"traceparent": tp, "origin": ORIGIN_PAGE, "x-hopmeter-scenario": "tokens=9;rate=50"}
    if announce:
        headers["tracestate"] = ANNOUNCE
    body = {"model": "demo-1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{p.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200
    return r.content


def outcomes(p: Proxy) -> dict[str, float]:
    """hopmeter_beacons_total by outcome, scraped."""
    text = httpx.get(f"http://127.0.0.1:{p.metrics_port}/metrics", timeout=10).text
    found = re.findall(r'^hopmeter_beacons_total\{outcome="([a-z_]+)"\} (\S+)$', text, re.M)
    return {k: float(v) for k, v in found}


def raw(p: Proxy, head: bytes) -> bytes:
    """Send a request head on a raw socket; everything the proxy answers before closing."""
    with socket.create_connection(("127.0.0.1", p.port), timeout=10) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_the_page_s_beacon_joins_its_record(proxy: Proxy) -> None:
    """A stream that announced a beacon waits for it; the beacon from its page's origin is
    answered 204 and the record is written with the browser lane, aligned to every token."""
    tp = traceparent()
    trace_id = tp.split("-")[1]
    body = stream(proxy, tp)  # the stream is over before its beacon is sent
    r = post(proxy, orjson.dumps(beacon(tp, reads=reads_of(body))))
    assert r.status_code == 204 and r.headers["x-hopmeter-beacon"] == "accepted"
    rec = wait_for(lambda: next((x for x in read(proxy.records) if x["trace_id"] == trace_id), 0))
    assert rec["browser"]["joined"] is True and "screen" not in rec
    seg = rec["hops"][0]
    assert seg["segment"] == "browser>edge" and seg["tokens_aligned"] == 9
    again = post(proxy, orjson.dumps(beacon(tp)))
    assert again.status_code == 409 and again.headers["x-hopmeter-beacon"] == "duplicate"


def test_bad_beacons_get_a_clear_4xx_and_are_counted(proxy: Proxy) -> None:
    """Malformed, wrong types, a wrong method, oversized, another origin, a trace nobody
    announced: each its status, one line naming the problem, its outcome counted."""
    before = outcomes(proxy)
    tp = traceparent()
    stream(proxy, tp)
    cases = [
        (post(proxy, b"{not json"), 400, "malformed", "not JSON"),
        (post(proxy, orjson.dumps(beacon(tp, status="200"))), 400, "malformed", "status"),
        (post(proxy, orjson.dumps(beacon(tp, reads={"t": [1]}))), 400, "malformed", "reads.chars"),
        (post(proxy, b"x" * 70_000), 413, "too_large", "at most 65536"),
        (
            post(proxy, orjson.dumps(beacon(tp)), "http://evil.example"),
            403,
            "wrong_origin",
            "evil.example",
        ),
        (post(proxy, orjson.dumps(beacon(traceparent()))), 404, "unknown_trace", "announced"),
        (httpx.get(f"{proxy.url}/_hopmeter/beacon", timeout=10), 405, "wrong_method", "POST"),
    ]
    for r, status, outcome, says in cases:
        assert r.status_code == status, r.text
        assert r.headers["x-hopmeter-beacon"] == outcome
        assert says in r.text and r.text.count("\n") == 1
    after = outcomes(proxy)
    for _, _, outcome, _ in cases:
        n = sum(1 for c in cases if c[2] == outcome)
        assert after[outcome] - before.get(outcome, 0) == n, outcome
    assert post(proxy, orjson.dumps(beacon(tp))).status_code == 204  # the page's own still joins


def test_a_body_too_long_to_read_is_answered_unread(proxy: Proxy) -> None:
    """A beacon saying it is 10 MB long, or not saying its length, is not read: it is answered
    at its headers (413, 411), the connection closed, and counted."""
    before = outcomes(proxy)
    big = raw(proxy, HEAD + b"Content-Length: 10000000\r\n\r\n{")
    assert big.startswith(b"HTTP/1.1 413 ") and b"not read" in big
    unsized = raw(proxy, HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\n{")
    assert unsized.startswith(b"HTTP/1.1 411 ") and b"says its length" in unsized
    # every answer says its outcome in x-hopmeter-beacon (docs/browser.md), these two too
    assert b"\r\nx-hopmeter-beacon: too_large\r\n" in big.lower()
    assert b"\r\nx-hopmeter-beacon: unsized\r\n" in unsized.lower()

    def counted() -> dict[str, float] | None:
        now = outcomes(proxy)
        return now if now.get("unsized", 0) > before.get("unsized", 0) else None

    after = wait_for(counted)
    assert after["too_large"] == before.get("too_large", 0) + 1
    assert after["unsized"] == before.get("unsized", 0) + 1


def test_a_flood_is_refused_and_the_proxy_streams_on(proxy: Proxy) -> None:
    """Hundreds of beacons at once: past the rate bound they are answered 429 unread; a stream
    through the proxy meanwhile completes, and nothing of it reached the upstream."""
    before = outcomes(proxy)
    body = orjson.dumps(beacon(traceparent()))

    headers = {"origin": ORIGIN_PAGE}
    with httpx.Client(base_url=proxy.url, timeout=10) as client:  # threads share its pool

        def send(_: int) -> int:
            return client.post("/_hopmeter/beacon", content=body, headers=headers).status_code

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(send, range(600)))
    elapsed = time.monotonic() - t0
    # the bucket holds 200 and refills at 50 a second: the rest were refused
    assert set(statuses) <= {404, 429}
    assert 0 < statuses.count(404) <= 200 + 50 * elapsed + 1
    after = outcomes(proxy)
    assert after["flood"] - before.get("flood", 0) == statuses.count(429)
    assert b"[DONE]" in stream(proxy, traceparent(), announce=False)
    seen = proxy.upstream.output()
    assert "seen POST /v1/chat/completions" in seen and "/_hopmeter/" not in seen


def test_without_the_flag_the_endpoints_do_not_exist(tmp_path: Path) -> None:
    """Without --browser, /_hopmeter/beacon.js and /_hopmeter/beacon go upstream like any
    other request, and a stream that announces a beacon is written at once."""
    with running(tmp_path) as p:
        script = httpx.get(f"{p.url}/_hopmeter/beacon.js", timeout=10)
        assert script.status_code == 404 and "x-hopmeter-beacon" not in script.headers
        r = httpx.post(f"{p.url}/_hopmeter/beacon", content=b"{}", timeout=10)
        assert "x-hopmeter-beacon" not in r.headers
        tp = traceparent()
        stream(p, tp)
        trace_id = tp.split("-")[1]
        rec = wait_for(lambda: next((x for x in read(p.records) if x["trace_id"] == trace_id), 0))
        assert "browser" not in rec
        seen = p.upstream.output()
    assert "seen GET /_hopmeter/beacon.js" in seen and "seen POST /_hopmeter/beacon" in seen
