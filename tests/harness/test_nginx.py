"""The nginx harness and what each named config does to an event stream, judged by ordering.

One asyncio loop runs both the upstream and the client, so "the client had event i when the
upstream had sent k events" is an exact statement, not a race between clocks.
"""

from __future__ import annotations

import asyncio
import socket
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import h11
import pytest

from tests.harness import nginx as nginx_harness
from tests.harness.nginx import (
    BUFFER_BURSTS,
    CONFIGS,
    GZIP_HOLD,
    NginxConfig,
    NginxError,
    NginxServer,
    available,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not available(), reason="nginx is not installed"),
]

# How long the upstream waits for the client to acknowledge an event before it sends the next:
# far above nginx's ~0.3 ms forwarding on loopback, so it is reached only when nginx holds.
LOCKSTEP_S = 5.0
# Pace of a stream whose holding is under test: long enough that separate writes stay separate
# reads, short enough to keep the file under a few seconds.
PACE_S = 0.005
# Token texts cycled through the events, so the stream compresses like a real reply.
WORDS = ("the", " model", " writes", " one", " token", " at", " a", " time", ",", " and")


def event(n: int) -> bytes:
    """An OpenAI-shaped SSE event (~175 bytes), as compressible as a real one."""
    word = WORDS[n % len(WORDS)]
    return (
        b'data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"m","choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}'
        b"\n\n" % word.encode()
    )


@dataclass
class PacedUpstream:
    """Sends `events` SSE events, each after the client has the previous one or `wait_s` passed."""

    events: int
    wait_s: float
    accel_buffering: str = "no"  # hopmeter's upstream sends "no" by default
    always_chunked: bool = False  # chunked even to an HTTP/1.0 request, like hopmeter's upstream
    sent: int = 0
    ended: bool = False
    held_at: int | None = None  # the first event the client did not acknowledge in time
    acked: list[asyncio.Event] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request; close-delimited to HTTP/1.0 unless `always_chunked`."""
        head = await reader.readuntil(b"\r\n\r\n")
        chunked = self.always_chunked or not head.split(b"\r\n", 1)[0].endswith(b"HTTP/1.0")
        framing = b"transfer-encoding: chunked" if chunked else b"connection: close"
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\nx-accel-buffering: %s\r\n%s\r\n\r\n"
            % (self.accel_buffering.encode(), framing)
        )
        for n in range(self.events):
            data = event(n)
            writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            await writer.drain()
            self.sent += 1
            try:
                await asyncio.wait_for(self.acked[n].wait(), self.wait_s)
            except TimeoutError:
                self.held_at = n if self.held_at is None else self.held_at
        writer.write(b"0\r\n\r\n" if chunked else b"")
        await writer.drain()
        self.ended = True
        writer.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """One read at the client that completed at least one event."""

    events: int  # events complete at the client after this read
    sent: int  # events the upstream had written when the read happened
    ended: bool  # whether the upstream had finished the body by then


class SseClient(asyncio.Protocol):
    """Reads one response (HTTP/1.1, gzip accepted), acknowledging events as they complete."""

    def __init__(self, upstream: PacedUpstream) -> None:
        self.upstream = upstream
        self.http = h11.Connection(h11.CLIENT)
        self.gunzip: zlib._Decompress | None = None
        self.body = b""
        self.arrivals: list[Arrival] = []
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the request."""
        assert isinstance(transport, asyncio.Transport)
        request = h11.Request(
            method="GET",
            target="/v1/chat/completions",
            headers=[("host", "127.0.0.1"), ("accept-encoding", "gzip"), ("connection", "close")],
        )
        transport.write(self.http.send(request) + self.http.send(h11.EndOfMessage()))

    def data_received(self, data: bytes) -> None:
        """Decode what arrived and record the read if it completed an event."""
        self.http.receive_data(data)
        self._pump()

    def eof_received(self) -> None:
        """Let h11 see the end of a close-delimited body."""
        self.http.receive_data(b"")
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        """Finish, whatever state the response was in."""
        if not self.done.done():
            self.done.set_result(None)

    def _pump(self) -> None:
        before = self.body.count(b"\n\n")
        while (ev := self.http.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(ev, h11.Response) and (b"content-encoding", b"gzip") in ev.headers:
                self.gunzip = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            elif isinstance(ev, h11.Data):
                self.body += self.gunzip.decompress(ev.data) if self.gunzip else bytes(ev.data)
            elif isinstance(ev, h11.EndOfMessage | h11.ConnectionClosed):
                if not self.done.done():
                    self.done.set_result(None)
                break
        complete = self.body.count(b"\n\n")
        if complete > before:
            self.arrivals.append(
                Arrival(events=complete, sent=self.upstream.sent, ended=self.upstream.ended)
            )
            for n in range(before, min(complete, len(self.upstream.acked))):
                self.upstream.acked[n].set()


async def _exchange(config: NginxConfig, upstream: PacedUpstream, tmp: Path) -> SseClient:
    upstream.acked = [asyncio.Event() for _ in range(upstream.events)]
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with NginxServer(port, config, prefix=tmp) as nginx:
            loop = asyncio.get_running_loop()
            _, client = await loop.create_connection(
                lambda: SseClient(upstream), "127.0.0.1", nginx.port
            )
            await asyncio.wait_for(client.done, 30)
    finally:
        server.close()
    return client


def through(config: NginxConfig, upstream: PacedUpstream, tmp: Path) -> list[Arrival]:
    """Stream `upstream` through nginx running `config`; the client's reads that held events."""
    client = asyncio.run(_exchange(config, upstream, tmp))
    assert client.body == b"".join(event(n) for n in range(upstream.events))
    return client.arrivals


def without_ignore(config: NginxConfig) -> NginxConfig:
    """`config` minus `proxy_ignore_headers X-Accel-Buffering`."""
    location = config.location.replace("proxy_ignore_headers X-Accel-Buffering;", "")
    assert location != config.location
    return replace(config, name=f"{config.name}-honouring-header", location=location)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_passes_nginx_t(name: str, tmp_path: Path) -> None:
    """`nginx -t` accepts every named configuration."""
    assert "test is successful" in NginxServer(1, name, prefix=tmp_path).check()


def test_invalid_config_fails_with_the_error_log(tmp_path: Path) -> None:
    """A config nginx rejects raises NginxError quoting nginx's own complaint."""
    broken = NginxConfig(name="broken", effect="none", location="proxy_bufering off;")
    with pytest.raises(NginxError, match='unknown directive "proxy_bufering"'):
        NginxServer(1, broken, prefix=tmp_path).start()


def test_server_binds_loopback_and_stops(tmp_path: Path) -> None:
    """nginx listens on 127.0.0.1 only, and nothing listens once the context exits."""
    with NginxServer(1, "streaming", prefix=tmp_path) as nginx:
        port = nginx.port
        assert f"listen 127.0.0.1:{port};" in nginx.conf_path.read_text()
        assert nginx.url == f"http://127.0.0.1:{port}"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not (nginx.prefix / "nginx.pid").exists()


def test_server_without_prefix_cleans_up(tmp_path: Path) -> None:
    """Without a prefix, nginx runs in a temp directory that is removed when it stops."""
    with NginxServer(1, "streaming") as nginx:
        assert (nginx.prefix / "nginx.pid").exists()
    assert not nginx.prefix.exists()


def test_server_retries_a_port_taken_before_nginx_binds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the port picked for nginx is taken meanwhile, start() picks another and succeeds."""
    picked: list[int] = []
    real_free_port = nginx_harness._free_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]

        def pick() -> int:
            picked.append(taken if not picked else real_free_port())
            return picked[-1]

        monkeypatch.setattr(nginx_harness, "_free_port", pick)
        # nginx itself retries bind() for ~2.5 s before it gives up on the taken port.
        with NginxServer(1, "streaming", prefix=tmp_path) as nginx:
            assert picked[0] == taken
            assert nginx.port == picked[-1] != taken


def test_streaming_forwards_each_event_before_the_next_is_sent(tmp_path: Path) -> None:
    """streaming: the client has event i before the upstream writes event i+1, even under "yes"."""
    upstream = PacedUpstream(events=40, wait_s=LOCKSTEP_S, accel_buffering="yes")
    arrivals = through(CONFIGS["streaming"], upstream, tmp_path)
    assert upstream.held_at is None
    assert [a.events for a in arrivals] == list(range(1, 41))


def test_gzip_hold_delivers_nothing_before_the_body_ends(tmp_path: Path) -> None:
    """gzip_hold: the client gets no event until the upstream has finished the whole body."""
    upstream = PacedUpstream(events=40, wait_s=PACE_S)
    arrivals = through(GZIP_HOLD, upstream, tmp_path)
    assert arrivals[0].ended
    assert arrivals[0].events == 40


def test_gzip_hold_streams_when_the_header_is_honoured(tmp_path: Path) -> None:
    """Without proxy_ignore_headers, X-Accel-Buffering: no makes the gzip config stream."""
    upstream = PacedUpstream(events=20, wait_s=LOCKSTEP_S)
    through(without_ignore(GZIP_HOLD), upstream, tmp_path)
    assert upstream.held_at is None


def test_buffer_bursts_releases_full_buffers_of_a_close_delimited_body(tmp_path: Path) -> None:
    """buffer_bursts: an HTTP/1.0 close-delimited stream comes out a 4 KiB buffer at a time."""
    upstream = PacedUpstream(events=60, wait_s=PACE_S)
    arrivals = through(BUFFER_BURSTS, upstream, tmp_path)
    assert not arrivals[0].ended  # bursts, not a whole-body hold
    assert arrivals[0].events >= 20  # one 4 KiB buffer holds 23 events of 175 bytes
    # 60 events = 10.5 KB = 3 buffers; a buffer split across two reads would add one more each.
    assert 2 <= len(arrivals) <= 6


def test_buffer_bursts_streams_a_chunked_upstream(tmp_path: Path) -> None:
    """buffer_bursts forwards a chunked upstream per event: proxy buffers alone cannot hold it."""
    upstream = PacedUpstream(events=30, wait_s=LOCKSTEP_S, always_chunked=True)
    through(BUFFER_BURSTS, upstream, tmp_path)
    assert upstream.held_at is None


def test_gzip_bursts_turns_a_chunked_stream_into_bursts(tmp_path: Path) -> None:
    """gzip_bursts: a chunked stream arrives in a few large bursts, the first before the end."""
    upstream = PacedUpstream(events=300, wait_s=PACE_S)
    arrivals = through(CONFIGS["gzip_bursts"], upstream, tmp_path)
    assert not arrivals[0].ended
    assert arrivals[0].sent > arrivals[0].events  # the upstream was ahead: events were held
    assert 2 <= len(arrivals) <= 300 // 10
