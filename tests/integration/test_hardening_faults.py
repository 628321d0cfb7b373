"""Faults on real processes: resets, hangs, clients that leave or read slowly, TLS + HTTP/2
upstreams, WebSockets and plain downloads, each through a running `hopmeter run`."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto import events as ws

from tests.harness.findings import stream_kinds
from tests.harness.procs import (
    Proc,
    free_port,
    hopmeter,
    measuring,
    read_records,
    rss_kib,
    wait_for,
)

pytestmark = pytest.mark.integration

Handler = Callable[[socket.socket, str], None]


class RawUpstream:
    """A loopback upstream on blocking sockets: each connection runs the handler for its path.

    Unlike tests/harness/scripted.py the handler owns the socket, so it can reset it, block in
    recv() to see when the proxy closes it, or time each sendall() to see backpressure.
    """

    def __init__(self, routes: dict[str, Handler]) -> None:
        self.routes = routes
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> RawUpstream:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for t in self._threads:
            t.join(5)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                head = _read_request(conn)
                if head is None:
                    return
                path = head.split(b" ", 2)[1].decode()
                self.routes[path.split("?", 1)[0]](conn, head.decode("latin-1"))
            except Exception as exc:  # the test reads these
                self.errors.append(exc)


def _read_request(conn: socket.socket) -> bytes | None:
    """The request head, after reading (and dropping) a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return None
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        piece = conn.recv(65536)
        if not piece:
            return None
        body += piece
    return head


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n"
)


def event(i: int, pad: int = 0) -> bytes:
    """An OpenAI chat chunk carrying word `i` (and `pad` filler characters)."""
    return f'data: {{"choices":[{{"delta":{{"content":" w{i}{"x" * pad}"}}}}]}}\n\n'.encode()


def reset_peak(pid: int) -> None:
    """Start VmHWM afresh from the current RSS (Linux: write 5 to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def records_for(path: Path, request_path: str, count: int = 1) -> list[dict[str, Any]]:
    """Wait for `count` records of `request_path` in the records file."""

    def found() -> list[dict[str, Any]] | None:
        if not path.exists():
            return None
        lines = path.read_bytes().split(b"\n")[:-1]  # whole lines only
        recs = [orjson.loads(ln) for ln in lines if ln.strip()]
        recs = [r for r in recs if r["request"]["path"] == request_path]
        return recs if len(recs) >= count else None

    return wait_for(found, 15, f"{count} record(s) of {request_path}")


class Proxy:
    """The shared proxy: its process, records file, base URL and the upstream's routes."""

    def __init__(self, proc: Proc, records: Path, port: int, routes: dict[str, Handler]) -> None:
        self.proc = proc
        self.records = records
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.routes = routes

    @property
    def pid(self) -> int:
        """The hopmeter process (`python -m hopmeter.cli`, no shell in between)."""
        return self.proc.popen.pid

    def healthy(self) -> None:
        """The proxy still forwards a stream from start to end."""
        r = httpx.post(self.url + "/v1/chat/completions/ok", json={"stream": True}, timeout=10)
        assert r.status_code == 200 and r.content == b"".join(OK_EVENTS)


OK_EVENTS = [event(i) for i in range(3)] + [b"data: [DONE]\n\n"]


def _ok(conn: socket.socket, _head: str) -> None:
    conn.sendall(SSE_HEAD + b"".join(chunk(e) for e in OK_EVENTS) + b"0\r\n\r\n")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """One `hopmeter run` in front of a RawUpstream whose routes each test adds."""
    tmp = tmp_path_factory.mktemp("faults")
    routes: dict[str, Handler] = {"/v1/chat/completions/ok": _ok}
    with (
        RawUpstream(routes) as up,
        measuring(tmp, f"http://127.0.0.1:{up.port}") as running,
    ):
        p = Proxy(running.proc, running.records, running.port, routes)
        p.healthy()  # loads the tokenizer: memory measured after this is the steady state
        yield p
        assert "Traceback" not in running.proc.output()


# -- the upstream fails ----------------------------------------------------------------------------


def test_upstream_reset_mid_stream(proxy: Proxy) -> None:
    """A reset after five events: the client gets those bytes; the record says upstream_reset."""
    sent = [event(i) for i in range(5)]

    def reset(conn: socket.socket, _head: str) -> None:
        conn.sendall(SSE_HEAD + b"".join(chunk(e) for e in sent))
        time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # linger 0: RST, not FIN

    path = "/v1/chat/completions/reset"
    proxy.routes[path] = reset
    got = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", proxy.url + path, json={"stream": True}, timeout=10) as r,
    ):
        for piece in r.iter_raw():
            got += piece
    rec = records_for(proxy.records, path)[0]
    assert got == b"".join(sent)
    assert rec["response"]["ended"] == "upstream_reset"
    assert rec["figures"]["events"] == 5
    truncated = [f for f in rec["findings"] if f["kind"] == "truncated"]
    assert truncated and "upstream reset the connection" in truncated[0]["evidence"]["reasons"]
    proxy.healthy()


def test_headers_and_never_a_body(proxy: Proxy) -> None:
    """Upstream sends headers and hangs; the client gives up, the proxy lets go and stays well."""
    upstream_closed = threading.Event()

    def hang(conn: socket.socket, _head: str) -> None:
        conn.sendall(SSE_HEAD)
        with contextlib.suppress(ConnectionError):
            while conn.recv(65536):  # blocks until the proxy closes the connection
                pass
        upstream_closed.set()

    path = "/v1/chat/completions/hang"
    proxy.routes[path] = hang
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream(
            "POST", proxy.url + path, json={"stream": True}, timeout=httpx.Timeout(10, read=0.5)
        ) as r,
    ):
        assert r.status_code == 200  # the headers were forwarded at once
        for _ in r.iter_raw():
            pass
    rec = records_for(proxy.records, path)[0]
    assert rec["response"]["ended"] == "client_gone"
    assert rec["response"]["bytes_wire"] == 0 and rec["figures"]["events"] == 0
    assert not [f for f in rec["findings"] if f["kind"] in ("truncated", "not_streamed")]
    assert upstream_closed.wait(10), "the proxy kept the hung upstream connection open"
    proxy.healthy()


def test_client_disconnect_closes_the_upstream(proxy: Proxy) -> None:
    """A client that hangs up mid-stream: the upstream's next writes fail; ended client_gone."""
    write_failed = threading.Event()
    sent_events = []

    def endless(conn: socket.socket, _head: str) -> None:
        conn.sendall(SSE_HEAD)
        try:
            for i in range(2000):  # 20 s at most
                conn.sendall(chunk(event(i)))
                sent_events.append(time.monotonic())
                time.sleep(0.01)
        except OSError:
            write_failed.set()

    path = "/v1/chat/completions/endless"
    proxy.routes[path] = endless
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        client.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}".encode())
        got = b""
        while got.count(b"\n\n") < 5:
            piece = client.recv(65536)
            assert piece, "the proxy closed the stream early"
            got += piece
        left_at = time.monotonic()
    assert write_failed.wait(10), "the upstream could still write after the client left"
    rec = records_for(proxy.records, path)[0]
    sent_after = sum(1 for t in sent_events if t > left_at)
    print(f"\nclient_gone: upstream wrote {sent_after} more events before its write failed")
    assert rec["response"]["ended"] == "client_gone"
    assert rec["figures"]["events"] >= 5
    assert not [f for f in rec["findings"] if f["kind"] == "truncated"]
    proxy.healthy()


# -- a slow client ---------------------------------------------------------------------------------

SLOW_TOTAL_BYTES = 12 * 1024 * 1024
SLOW_CLIENT_BYTES_PER_S = 4 * 1024 * 1024
SLOW_EVENT = event(0, pad=990)  # ~1 KiB events, sent 16 to a chunk as fast as the socket takes
# The client's receive buffer: small, so that the bytes in flight sit in the proxy's buffers.
SLOW_CLIENT_RCVBUF = 32 * 1024


def _kernel_send_buffer_max() -> int:
    """The most a TCP send buffer autotunes to (net.ipv4.tcp_wmem's third field)."""
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


def test_slow_client_backpressure_and_bounded_memory(proxy: Proxy) -> None:
    """A client reading 12 MiB at 4 MiB/s: the proxy reads at the client's pace, memory flat."""
    sends: list[tuple[float, int]] = []  # (wall time, body bytes sent so far)
    batch = SLOW_EVENT * 16

    def flood(conn: socket.socket, _head: str) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        conn.sendall(SSE_HEAD)
        total = 0
        while total < SLOW_TOTAL_BYTES:
            conn.sendall(chunk(batch))
            total += len(batch)
            sends.append((time.time(), total))
        conn.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    path = "/v1/chat/completions/flood"
    proxy.routes[path] = flood
    rss_before = rss_kib(proxy.pid)
    reset_peak(proxy.pid)
    recv: list[tuple[float, int]] = []  # (wall time, bytes received so far)
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_CLIENT_RCVBUF)
        rcvbuf = client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        client.settimeout(20)
        client.connect(("127.0.0.1", proxy.port))
        client.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}".encode())
        t0, got = time.time(), 0
        while True:
            data = client.recv(32 * 1024)
            if not data:
                break
            got += len(data)
            recv.append((time.time(), got))
            if data.endswith(b"0\r\n\r\n"):
                break
            ahead = t0 + got / SLOW_CLIENT_BYTES_PER_S - time.time()
            if ahead > 0:
                time.sleep(ahead)  # reading at the client's pace is the point of this test
    rec = records_for(proxy.records, path)[0]
    peak_growth_kb = rss_kib(proxy.pid, "VmHWM") - rss_before
    t_start = rec["request"]["t_start"]
    proxy_reads: list[tuple[float, int]] = []
    total = 0
    for offset, size in rec["chunks"]:
        total += size
        proxy_reads.append((t_start + offset, total))
    assert rec["chunks_dropped"] == 0 and total == rec["response"]["bytes_wire"]

    # Backpressure: hopmeter never reads further ahead of the client than the buffers between
    # them hold (kernel send buffer, the client's receive buffer, asyncio's 64 KiB write buffer,
    # one 64 KiB read) plus a slack for clock reading. Without backpressure it would read the
    # whole 12 MiB while the client had a fraction of it.
    in_flight_max = _kernel_send_buffer_max() + rcvbuf + 2 * 64 * 1024 + 256 * 1024
    ahead_max = max(n - _received_by(recv, t) for t, n in proxy_reads)
    assert ahead_max <= in_flight_max, (ahead_max, in_flight_max)

    # The pace: over the second half of the stream the record's chunk times follow the client's
    # rate, not the upstream's (which alone would take well under a second).
    half = SLOW_TOTAL_BYTES // 2
    proxy_rate = half / (_time_at(proxy_reads, SLOW_TOTAL_BYTES) - _time_at(proxy_reads, half))
    client_rate = half / (_time_at(recv, SLOW_TOTAL_BYTES) - _time_at(recv, half))
    assert 0.6 < proxy_rate / client_rate < 1.6, (proxy_rate, client_rate)

    # How far bytes-out lagged bytes-in: the proxy's read (record) to the client's read (here).
    lags = [_time_at(recv, n) - t for t, n in proxy_reads]
    upstream_to_proxy = [t - _time_at(sends, n) for t, n in proxy_reads[len(proxy_reads) // 2 :]]
    print(
        f"\nslow client: peak RSS growth {peak_growth_kb} KiB; proxy ahead of client max "
        f"{ahead_max / 2**20:.2f} MiB (bound {in_flight_max / 2**20:.2f}); proxy rate "
        f"{proxy_rate / 2**20:.2f} MiB/s vs client {client_rate / 2**20:.2f} MiB/s; "
        f"proxy-read -> client-read lag max {max(lags):.3f} s; upstream-send -> proxy-read lag "
        f"max {max(upstream_to_proxy):.3f} s; record duration {rec['figures']['duration_s']} s; "
        f"client wait {rec['delivery']['client_wait_s']} s, queued max "
        f"{rec['delivery']['queued_bytes_max'] / 2**20:.2f} MiB"
    )
    # Memory: the bytes waiting for the client sit in kernel buffers, not in hopmeter.
    assert peak_growth_kb < 16 * 1024, peak_growth_kb
    assert rec["response"]["ended"] == "complete"
    assert rec["response"]["bytes_out"] == rec["response"]["bytes_wire"]
    # the record now says who set the pace: the client, not the upstream
    assert "slow_client" in [f["kind"] for f in rec["findings"]]


def _received_by(series: list[tuple[float, int]], t: float) -> int:
    """Bytes the series had at wall time `t` (0 before its first point)."""
    n = 0
    for ts, total in series:
        if ts > t:
            break
        n = total
    return n


def _time_at(series: list[tuple[float, int]], n: int) -> float:
    """When the series first reached `n` bytes (its last time if it never did)."""
    for ts, total in series:
        if total >= n:
            return ts
    return series[-1][0]


# -- TLS and HTTP/2 upstream ---------------------------------------------------------------------


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_http2_upstream(tmp_path: Path) -> None:
    """h2 client -> hopmeter -> nginx speaking h2 over TLS (self-signed): intact and measured."""
    from tests.harness.h2client import stream_post
    from tests.harness.nginx import STREAMING, NginxConfig, NginxServer

    events = [event(i) for i in range(30)] + [b"data: [DONE]\n\n"]

    def paced(conn: socket.socket, _head: str) -> None:
        conn.sendall(SSE_HEAD)
        for e in events:
            conn.sendall(chunk(e))
            time.sleep(0.005)
        conn.sendall(b"0\r\n\r\n")

    cert, key = _self_signed(tmp_path)
    tls_port, port = free_port(), free_port()
    records = tmp_path / "records.jsonl"
    # nginx's own server block (its template's plain listener stays unused): TLS with h2 by ALPN
    tls = NginxConfig(
        name="tls_h2",
        effect="TLS and HTTP/2 towards the client, streaming to the upstream",
        location=STREAMING.location,
        http=f"""
            server {{
                listen 127.0.0.1:{tls_port} ssl http2;
                ssl_certificate {cert};
                ssl_certificate_key {key};
                location / {{
                    proxy_pass http://hopmeter_upstream;
                    {STREAMING.location}
                }}
            }}
        """,
    )
    with (
        RawUpstream({"/v1/chat/completions": paced}) as up,
        NginxServer(up.port, tls, prefix=tmp_path) as nginx,
        hopmeter(
            tmp_path,
            "run",
            f"https://127.0.0.1:{tls_port}",
            "--listen",
            f"127.0.0.1:{port}",
            "--records",
            str(records),
            "--metrics",
            "off",
            "--set",
            "ssl_insecure=true",
            "--set",
            f"confdir={tmp_path / 'mitm'}",
            ports=(port,),
        ),
    ):
        got = b""
        for kind, payload in stream_post(
            "127.0.0.1", port, "/v1/chat/completions", b'{"model": "gpt-4o", "stream": true}'
        ):
            if kind == "data":
                got += payload
            else:
                assert payload == b"200"
        rec = read_records(records, 1)[0]
        access = (nginx.prefix / "access.log").read_text()
    assert got == b"".join(events)
    assert '"POST /v1/chat/completions HTTP/2.0" 200' in access  # h2 on the upstream side
    assert rec["request"]["scheme"] == "https"
    assert rec["response"]["http_version"] == "HTTP/2.0"
    assert rec["api"] == "openai.chat" and rec["response"]["ended"] == "complete"
    assert rec["figures"]["events"] == len(events)
    assert rec["response"]["bytes_wire"] == len(got)
    assert not [f for f in rec["findings"] if f["kind"] in ("truncated", "whole_body_hold")]


def test_an_http2_client_that_hangs_up_mid_stream_left_itself(tmp_path: Path) -> None:
    """An HTTP/2 client's request body of no stated length reaches an HTTP/1 upstream with its
    length (mitmproxy would send it unframed, and the upstream read no body: it answered a
    default, non-streamed reply); closing its connection mid-stream reads as "peer closed
    connection" in mitmproxy, as an upstream's close does: the record says the client left,
    with no finding blaming the upstream."""
    from tests.harness.h2client import stream_post

    up, port = free_port(), free_port()
    records = tmp_path / "records.jsonl"
    upstream = ("upstream", "--listen", f"127.0.0.1:{up}", "--tls-dir", str(tmp_path / "tls"))
    with (
        hopmeter(tmp_path, *upstream, name="upstream", ports=(up,)),
        hopmeter(
            tmp_path,
            "run",
            f"https://127.0.0.1:{up}",
            *("--listen", f"127.0.0.1:{port}", "--records", str(records), "--metrics", "off"),
            *("--set", "ssl_insecure=true", "--set", f"confdir={tmp_path / 'mitm'}"),
            ports=(port,),
        ),
    ):
        frames = 0
        body = b'{"model": "gpt-4o", "stream": true}'
        for kind, _ in stream_post(
            "127.0.0.1", port, "/v1/chat/completions?tokens=200&rate=40", body
        ):
            frames += kind == "data"
            if frames == 5:
                break  # the generator's close closes the connection
        (rec,) = read_records(records, 1)
    assert rec["model"] == "gpt-4o" and rec["mitmproxy"]["request_buffered_by"] == "unsized"
    assert rec["ended"] == "client_gone", (rec["figures"], rec["response"], rec.get("delivery"))
    assert not [f for f in rec["findings"] if f["kind"] == "truncated"], rec["findings"]


# -- traffic that is no LLM stream ---------------------------------------------------------------


def _png(width: int = 256, height: int = 256) -> bytes:
    """A valid PNG of random pixels (incompressible, full of bytes that are not UTF-8)."""
    raw = b"".join(b"\x00" + os.urandom(width * 3) for _ in range(height))

    def part(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + part(b"IHDR", ihdr)
        + part(b"IDAT", zlib.compress(raw))
        + part(b"IEND", b"")
    )


DOWNLOAD_BYTES = 20 * 1024 * 1024


def test_download_and_image_pass_through_unflagged(proxy: Proxy) -> None:
    """A 20 MiB download and a PNG arrive byte-identical, api "other", with no findings."""
    blob = os.urandom(DOWNLOAD_BYTES)
    image = _png()
    bodies = {
        "/files/model.bin": (blob, "application/octet-stream"),
        "/img/cat.png": (image, "image/png"),
    }

    def serve(body: bytes, media: str) -> Handler:
        def handler(conn: socket.socket, _head: str) -> None:
            conn.sendall(
                f"HTTP/1.1 200 OK\r\ncontent-type: {media}\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
            )
            conn.sendall(body)

        return handler

    for path, (body, media) in bodies.items():
        proxy.routes[path] = serve(body, media)
    rss_before = rss_kib(proxy.pid)
    reset_peak(proxy.pid)
    for path, (body, _) in bodies.items():
        got = httpx.get(proxy.url + path, timeout=30).content
        assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest(), path
    peak_growth_kb = rss_kib(proxy.pid, "VmHWM") - rss_before
    print(f"\ndownload 20 MiB + PNG: peak RSS growth {peak_growth_kb} KiB")
    for path, (body, media) in bodies.items():
        rec = records_for(proxy.records, path)[0]
        assert rec["api"] == "other"
        assert rec["response"]["content_type"] == media
        assert rec["response"]["bytes_wire"] == rec["response"]["bytes_out"] == len(body)
        assert rec["response"]["ended"] == "complete"
        assert stream_kinds(rec) == [], (path, rec["findings"])
        assert rec["figures"]["tokens"] == 0 and rec["figures"]["events"] == 0
    assert peak_growth_kb < 16 * 1024, peak_growth_kb  # a streamed body is never held


def test_websocket_messages_pass_through(proxy: Proxy) -> None:
    """WebSocket text and binary messages (one of 300 KB) cross both ways unchanged."""

    def echo(conn: socket.socket, head: str) -> None:
        server = WSConnection(ConnectionType.SERVER)
        server.receive_data(head.encode("latin-1") + b"\r\n\r\n")
        for ev in server.events():
            if isinstance(ev, ws.Request):
                conn.sendall(server.send(ws.AcceptConnection()))
        for _ in range(10_000):  # bounded: the test sends a handful of messages
            data = conn.recv(65536)
            if not data:
                return
            server.receive_data(data)
            for ev in server.events():
                if isinstance(ev, ws.BytesMessage | ws.TextMessage):
                    conn.sendall(server.send(ev))
                elif isinstance(ev, ws.CloseConnection):
                    conn.sendall(server.send(ev.response()))
                    return

    path = "/realtime"
    proxy.routes[path] = echo
    messages: list[bytes | str] = [
        b"\x00\xffbinary\x80" * 1000,
        "text ✓ 🦙",
        b"",
        os.urandom(300_000),
    ]
    echoed: list[bytes | str] = []
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        client = WSConnection(ConnectionType.CLIENT)
        sock.sendall(client.send(ws.Request(host="127.0.0.1", target=path)))

        def events() -> list[ws.Event]:
            client.receive_data(sock.recv(65536) or None)
            return list(client.events())

        wait_for(lambda: any(isinstance(e, ws.AcceptConnection) for e in events()), 10, "101")
        for message in messages:
            frame = ws.BytesMessage(data=message) if isinstance(message, bytes) else None
            sock.sendall(client.send(frame or ws.TextMessage(data=str(message))))
            parts: list[Any] = []
            done = False
            for _ in range(1000):  # reads of up to 64 KiB: far more than a 300 KB message needs
                for ev in events():
                    if isinstance(ev, ws.BytesMessage | ws.TextMessage):
                        parts.append(ev.data)
                        done = ev.message_finished
                    assert not isinstance(ev, ws.CloseConnection), "closed mid-message"
                if done:
                    break
            echoed.append(b"".join(parts) if isinstance(message, bytes) else "".join(parts))
        sock.sendall(client.send(ws.CloseConnection(code=1000)))
    assert echoed == messages
    rec = records_for(proxy.records, path)[0]
    assert rec["response"]["status"] == 101 and rec["api"] == "other"
    assert stream_kinds(rec) == [], rec["findings"]
