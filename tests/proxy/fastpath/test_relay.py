"""Tests for hopmeter.proxy.fastpath.relay: the relay splits a read into h11's pieces; a real flow
through `hopmeter run` gives the client the same bytes and the same record with the relay on as
through mitmproxy's layers (`--no-relay`), whatever the guards are there for; a fault at any step
of a relayed read leaves the read to mitmproxy or cuts the client's connection, never more."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from h11._readers import ChunkedReader
from h11._receivebuffer import ReceiveBuffer
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.connection import Server
from mitmproxy.proxy.layers.tls import ServerTLSLayer
from mitmproxy.proxy.server import ConnectionHandler, ConnectionIO
from mitmproxy.test import taddons, tflow

from hopmeter.proxy.fastpath import backpressure, relay
from hopmeter.proxy.fastpath.relay import split_chunked
from hopmeter.upstream.tls import make_self_signed, server_context
from tests.harness.live_client import live_client, run, unread
from tests.harness.procs import free_port, measuring, read_records, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

# -- the pieces of a read, against h11's reader --------------------------------------------------

Event = tuple[str, bytes]


def _h11_events(reader: ChunkedReader, buf: ReceiveBuffer) -> Iterator[Event]:
    """What mitmproxy's `read_body` takes from h11 for what is in `buf`."""
    while True:
        try:
            event = reader(buf)
        except h11.ProtocolError as exc:
            yield ("error", str(exc).encode())
            return
        if event is None:
            return
        if isinstance(event, h11.EndOfMessage):
            yield ("end", b"")
            return
        if event.data:
            yield ("data", bytes(event.data))


def _through_h11(reads: list[bytes]) -> list[Event]:
    reader, buf, got = ChunkedReader(), ReceiveBuffer(), []
    for read in reads:
        buf += read
        got += _h11_events(reader, buf)
        if got and got[-1][0] != "data":
            break
    return got


def _through_relay(reads: list[bytes]) -> tuple[list[Event], int]:
    """As the relay runs a read (its pieces, then h11 for the rest), and how much it took."""
    reader, buf, got, taken = ChunkedReader(), ReceiveBuffer(), [], 0
    for read in reads:
        rest = read
        if not buf and not reader._reading_trailer:
            pieces, used, reader._bytes_in_chunk, reader._bytes_to_discard = split_chunked(
                read, reader._bytes_in_chunk, reader._bytes_to_discard
            )
            got += [("data", p) for p in pieces]
            taken += used
            rest = read[used:]
        if rest:
            buf += rest
            got += _h11_events(reader, buf)
        if got and got[-1][0] != "data":
            break
    return got, taken


@st.composite
def chunked_bodies(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A chunked body (hex in either case, leading zeros, extensions, spaces before the CRLF, the
    last chunk or not, sometimes a fault) and where the reads split it."""
    body = b""
    bounds = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=40), max_size=6)):
        size = f"{len(data):x}"
        size = draw(st.sampled_from([size, size.upper(), "0" + size, "0" * 19 + size]))
        ext = draw(st.sampled_from([b"", b"", b";a=1", b";x"]))
        ows = draw(st.sampled_from([b"", b"", b" ", b"\t"]))
        body += size.encode() + ext + ows + b"\r\n" + data + b"\r\n"
        bounds.append(len(body))
    if draw(st.booleans()):
        body += b"0\r\n" + draw(st.sampled_from([b"", b"x-trailer: 1\r\n"])) + b"\r\n"
    fault = draw(st.sampled_from([None, b"zz\r\n", b"5\r\nhelloXY", b"5\n", b"1\r\n\xff\r\r"]))
    if fault is not None:
        at = draw(st.integers(0, len(body)))
        body = body[:at] + fault + body[at:]
    if bounds and draw(st.booleans()):  # read by read as the chunks were written, the usual
        cuts = sorted(set(draw(st.lists(st.sampled_from(bounds), max_size=8))))
    else:
        cuts = sorted(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=8)))
    return body, cuts


@settings(max_examples=600, deadline=None)
@given(chunked_bodies())
def test_a_read_splits_into_h11s_pieces(case: tuple[bytes, list[int]]) -> None:
    """However a chunked body is cut into reads, the relay's pieces followed by h11's reading of
    what the relay left are exactly h11's own events, errors and end included."""
    body, cuts = case
    reads = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    reads = [r for r in reads if r]
    got, _ = _through_relay(reads)
    assert got == _through_h11(reads)


def test_the_relay_takes_data_and_leaves_the_end_and_faults_to_h11() -> None:
    """Whole chunks, a chunk cut inside its data and its CRLF are the relay's; the last chunk, an
    incomplete header and a header h11 rejects are left for h11."""
    assert split_chunked(b"5\r\nhello\r\n3\r\nabc\r\n", 0, b"") == ([b"hello", b"abc"], 18, 0, b"")
    assert split_chunked(b"a\r\nhello", 0, b"") == ([b"hello"], 8, 5, b"")
    assert split_chunked(b"world\r", 5, b"") == ([b"world"], 6, 0, b"\n")
    assert split_chunked(b"\n0\r\n\r\n", 0, b"\n") == ([], 1, 0, b"")
    assert split_chunked(b"5\r\nhello\r\n1", 0, b"") == ([b"hello"], 10, 0, b"")
    assert split_chunked(b"5\r\nhelloXY", 0, b"") == ([b"hello"], 8, 0, b"\r\n")
    assert split_chunked(b"zz\r\n", 0, b"") == ([], 0, 0, b"")
    # one whole chunk per read, the usual case, and its near misses
    assert split_chunked(b"0A\r\n0123456789\r\n", 0, b"") == ([b"0123456789"], 16, 0, b"")
    assert split_chunked(b"0x5\r\nhello\r\n", 0, b"") == ([], 0, 0, b"")
    assert split_chunked(b"+5\r\nhello\r\n", 0, b"") == ([], 0, 0, b"")
    assert split_chunked(b"5\r\nhelloXY", 0, b"") == ([b"hello"], 8, 0, b"\r\n")
    assert split_chunked(b"0\r\n\r\n", 0, b"") == ([], 0, 0, b"")
    assert split_chunked(b"0" * 21 + b"5\r\nhello\r\n", 0, b"") == ([], 0, 0, b"")
    taken = _through_relay([b"5\r\nhello\r\n", b"3\r\nabc\r\n0\r\n\r\n"])
    assert taken == ([("data", b"hello"), ("data", b"abc"), ("end", b"")], 18)


# -- real flows through `hopmeter run`, relay on and off -------------------------------------------

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
CHUNKED = HEAD + b"transfer-encoding: chunked\r\n\r\n"
PAUSE_S = 0.03  # between writes the reads must see apart: far above loopback delivery
_CRLF = b"\r\n"
END = b"0\r\n\r\n"  # the last chunk


def _event(n: int) -> bytes:
    return f'data: {{"choices": [{{"delta": {{"content": "tök {n} 🦙"}}}}]}}\n\n'.encode()


def _chunk(data: bytes, size: str | None = None) -> bytes:
    return (size or f"{len(data):x}").encode() + b"\r\n" + data + b"\r\n"


HALF_CLOSE = "half-close"  # in a script: the upstream shuts its side down (FIN) and keeps reading


def _script(name: str) -> list[bytes | str | None]:
    """What the upstream writes for scenario `name`, write by write; None closes the connection,
    HALF_CLOSE half-closes it."""
    events = [_event(n) for n in range(8)]
    every = b"".join(events)
    if name == "one-chunk-per-event":
        return [CHUNKED, *map(_chunk, events), b"0\r\n\r\n"]
    if name == "chunks-cut-across-reads":
        raw = b"".join(map(_chunk, events)) + b"0\r\n\r\n"
        return [CHUNKED, *(raw[i : i + 37] for i in range(0, len(raw), 37))]
    if name == "several-chunks-per-read":
        return [
            CHUNKED,
            b"".join(map(_chunk, events[:5])),
            b"".join(map(_chunk, events[5:])) + b"0\r\n\r\n",
        ]
    if name == "extensions-and-odd-hex":
        return [
            CHUNKED,
            *(_chunk(e, f"00{len(e):X};seq={i} ") for i, e in enumerate(events)),
            b"0\r\n\r\n",
        ]
    if name == "bad-chunk-footer":
        return [CHUNKED, _chunk(events[0]), _chunk(events[1])[:-2] + b"XY", b""]
    if name == "upstream-cut-mid-chunk":
        return [CHUNKED, _chunk(events[0]), _chunk(events[1])[:20], None]
    if name == "content-length":
        return [HEAD + b"content-length: %d\r\n\r\n" % len(every), *events]
    if name == "read-to-close":
        return [HEAD + b"connection: close\r\n\r\n", *events, None]
    if name == "read-to-half-close":
        return [HEAD + b"connection: close\r\n\r\n", *events, HALF_CLOSE]
    if name == "cut-inside-chunk-sizes":  # each read ends with the next chunk's first hex digit
        chunks = [*map(_chunk, events), b"0\r\n\r\n"]
        cuts = (a[1:] + b[:1] for a, b in itertools.pairwise(chunks))
        return [CHUNKED, chunks[0][:1], *cuts, chunks[-1][1:]]
    if name == "chunk-in-the-trailers":  # after the last chunk h11 reads trailer lines: these
        # are not field lines, so mitmproxy fails the body (with real trailers mitmproxy 12 stops
        # answering the client: "HTTP trailers are not implemented yet", both ways alike)
        return [CHUNKED, _chunk(events[0]), _chunk(events[1]), b"0\r\n", _chunk(b"hello") + _CRLF]
    raise AssertionError(name)


SCENARIOS = [
    "one-chunk-per-event",
    "chunks-cut-across-reads",
    "several-chunks-per-read",
    "extensions-and-odd-hex",
    "bad-chunk-footer",
    "upstream-cut-mid-chunk",
    "content-length",
    "read-to-close",
    "read-to-half-close",
    "cut-inside-chunk-sizes",
    "chunk-in-the-trailers",
]


# hopmeter run with the relay, without it, and with mitmproxy asked to keep streamed bodies
RUNS = {
    "relay": (),
    "off": ("--no-relay",),
    "store": ("--set", "store_streamed_bodies=true"),
}


async def _serve(ex: Exchange) -> None:
    await _write_script(ex, _script(ex.path.strip("/").split("/")[-1]))


async def _write_script(ex: Exchange, script: list[bytes | str | None]) -> None:
    """Write a scenario's script to the client: its bytes, each after a pause; None closes the
    connection, HALF_CLOSE ends the writing side."""
    for write in script:
        if write is None:
            ex.writer.close()
            return
        if write == HALF_CLOSE:
            ex.writer.write_eof()
            return
        assert isinstance(write, bytes)
        ex.writer.write(write)
        await ex.writer.drain()
        await asyncio.sleep(PAUSE_S)


def _raw_exchange(port: int, name: str) -> bytes:
    """Everything the client reads for one request that asks the proxy to close afterwards."""
    body = b'{"model": "m", "stream": true}'
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(
            b"POST /v1/chat/completions/%s HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (name.encode(), len(body), body)
        )
        got = b""
        while data := s.recv(65536):
            got += data
    return got


def _stable(rec: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between two runs of the same flow: times, ids."""
    return {
        "request": {k: rec["request"][k] for k in ("method", "path", "bytes")},
        "response": {k: v for k, v in rec["response"].items() if not k.startswith("t_")},
        "chunk_bytes": [c[1] for c in rec["chunks"]],
        "events": [e[1:] for e in rec["events"]],
        "chunks_out": len(rec["chunks_out"]),
        "figures": {
            k: v
            for k, v in rec["figures"].items()
            if not k.endswith("_s") and not k.startswith("tokens_per_s")
        },
        "stream": rec["stream"],
        "fingerprint": rec.get("fingerprint"),
        "delivery": {k: rec["delivery"][k] for k in ("measured", "reason", "http_version")},
        "rest": {k: rec[k] for k in ("ended", "api", "model")},
        "findings": sorted(f["kind"] for f in rec["findings"]),
    }


def _relayed(metrics_port: int) -> tuple[float, float, float]:
    """The relay's counters: responses armed, pieces moved, reads taken as they arrived."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    values = {}
    for line in text.splitlines():
        if line.startswith("hopmeter_relayed_"):
            name, value = line.split()
            values[name.removeprefix("hopmeter_relayed_").removesuffix("_total")] = float(value)
    return values["responses"], values["pieces"], values["direct_reads"]


def _declined(metrics_port: int) -> dict[str, float]:
    """Streamed responses the relay left to mitmproxy's layers, by reason."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line.startswith("hopmeter_relay_declined_total{"):
            labels, value = line.split()
            out[labels.split('reason="', 1)[1].split('"', 1)[0]] = float(value)
    return out


@pytest.mark.integration
def test_the_relay_changes_no_byte_and_no_record(tmp_path: Path) -> None:
    """Each scenario, through `hopmeter run` with the relay, without it and with streamed bodies
    kept: the client reads the same bytes, the records agree but for times; the relay moved the
    bodies it could, and none that mitmproxy was to keep."""
    runs: dict[str, tuple[list[bytes], dict[str, dict[str, Any]], tuple[float, ...]]] = {}
    with ScriptedUpstream(_serve) as up:
        for run, args in RUNS.items():
            metrics = free_port()
            (tmp_path / run).mkdir()
            with measuring(
                tmp_path / run,
                f"http://127.0.0.1:{up.port}",
                *("--metrics", f"127.0.0.1:{metrics}", *args),
                ports=(metrics,),
            ) as proxy:
                got = [_raw_exchange(proxy.port, name) for name in SCENARIOS]
                recs = read_records(proxy.records, len(SCENARIOS))
                runs[run] = got, {r["request"]["path"]: r for r in recs}, _relayed(metrics)
                # every response armed (or the relay off): none left to mitmproxy for a reason
                assert set(_declined(metrics).values()) == {0}, run
    on_bytes, on_recs, on_counts = runs["relay"]
    for run in ("off", "store"):
        bytes_, recs, _ = runs[run]
        for name, a, b in zip(SCENARIOS, on_bytes, bytes_, strict=True):
            assert a == b, (run, name)
            path = f"/v1/chat/completions/{name}"
            assert _stable(on_recs[path]) == _stable(recs[path]), (run, name)
    assert on_recs["/v1/chat/completions/one-chunk-per-event"]["figures"]["events"] == 8
    assert on_recs["/v1/chat/completions/upstream-cut-mid-chunk"]["ended"] != "complete"
    assert runs["off"][2] == (0, 0, 0)
    # armed for each response, and no piece moved: mitmproxy keeps the bodies it was asked to
    assert runs["store"][2] == (len(SCENARIOS), 0, 0)
    responses, pieces, direct = on_counts
    assert responses == len(SCENARIOS)
    # every event but those the headers' hook held back or the final read carried; most reads
    # taken as they arrived (mitmproxy's read loop was waiting with nothing buffered)
    assert pieces >= 30
    assert direct >= 20


@pytest.mark.integration
def test_a_kept_alive_connection_relays_each_response(tmp_path: Path) -> None:
    """Three requests on one client connection (and one upstream connection): each response's
    body is relayed and measured as its own flow."""

    async def serve(ex: Exchange) -> None:
        ex.writer.write(CHUNKED)
        for n in range(6):
            ex.writer.write(_chunk(_event(n)))
            await ex.writer.drain()
            await asyncio.sleep(0.01)
        ex.writer.write(b"0\r\n\r\n")
        await ex.writer.drain()

    metrics = free_port()
    with (
        ScriptedUpstream(serve) as up,
        measuring(
            tmp_path,
            f"http://127.0.0.1:{up.port}",
            "--metrics",
            f"127.0.0.1:{metrics}",
            ports=(metrics,),
        ) as proxy,
        httpx.Client(timeout=15) as client,
    ):
        bodies = [
            client.post(
                f"{proxy.url}/v1/chat/completions", json={"model": "m", "stream": True}
            ).content
            for _ in range(3)
        ]
        recs = read_records(proxy.records, 3)
        responses, pieces, _ = _relayed(metrics)
    assert bodies == [b"".join(_event(n) for n in range(6))] * 3
    assert [r["figures"]["events"] for r in recs] == [6, 6, 6]
    assert len({r["flow_id"] for r in recs}) == 3
    assert responses == 3 and pieces >= 9


def test_install_puts_the_relay_in_front_and_uninstall_takes_it_away() -> None:
    """Only `hopmeter run` installs it (hopmeter.proxy.fastpath.install); uninstall gives
    mitmproxy its own method back."""
    original = relay._MITMPROXY_SERVER_EVENT
    tls_own = dict(ServerTLSLayer.__dict__).get("event_to_child")
    try:
        relay.install()
        assert ConnectionHandler.server_event is relay.server_event and relay.installed()
        assert ServerTLSLayer.event_to_child is relay.tls_event_to_child
    finally:
        relay.uninstall()
    assert ConnectionHandler.server_event is original and not relay.installed()
    # the TLS layer's own method back where it had one (it swallows the upstream's
    # OpenConnection until the client's hello), nothing where it inherits TunnelLayer's
    assert dict(ServerTLSLayer.__dict__).get("event_to_child") is tls_own


# -- reads taken as they arrive, on mitmproxy's own connection handler ----------------------------


class _Mover:
    """Stands in for a flow's BodyRelay (tested above on real flows): moves every read it is
    given to the live client's writer, as the relay's delivery does."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.taken: list[bytes] = []
        self.dead = False

    def take(self, handler: Any, data: bytes) -> int:
        self.taken.append(data)
        self.writer.write(data)
        return len(data)

    def fail(self, exc: BaseException) -> None:
        raise AssertionError(exc)

    def cut(self, exc: BaseException) -> None:
        raise AssertionError(exc)


@pytest.mark.loopback
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_direct_read_that_fills_the_client_pauses_reading_until_drained(loop: str) -> None:
    """A read that comes while mitmproxy's read loop waits goes to the relay, not to the stream
    reader; once one fills the client's buffers (the client reads nothing), reading from the
    upstream pauses until mitmproxy's drain step has waited, as its read loop would have; a read
    as big as the loop's read size goes to the stream reader."""

    async def go() -> None:
        async with live_client(4096) as live:
            with socket.create_server(("127.0.0.1", 0)) as server:
                reader, writer = await asyncio.open_connection(*server.getsockname()[:2])
                upstream, _ = server.accept()
            with upstream:
                conn = Server(address=("127.0.0.1", 1))
                live.handler.transports[conn] = ConnectionIO(reader=reader, writer=writer)
                mover = _Mover(live.writer)
                conn.__dict__[relay._KEY] = mover
                relay._shortcut(live.handler, conn)
                assert type(writer.transport.get_protocol()) is relay.ReadShortcut
                read = asyncio.ensure_future(reader.read(65535))  # the read loop, waiting
                await asyncio.sleep(0)
                loop_ = asyncio.get_running_loop()
                deadline = loop_.time() + 10
                piece = b"x" * 16384
                while writer.transport.is_reading():
                    assert loop_.time() < deadline, "reading never paused"
                    upstream.sendall(piece)
                    await asyncio.sleep(0.005)
                assert not read.done() and mover.taken
                assert backpressure.may_wait(live.writer)
                # the client reads: the drain step ends, reading resumes
                while not writer.transport.is_reading():
                    assert loop_.time() < deadline, "reading never resumed"
                    unread(live.peer)
                    await asyncio.sleep(0.005)
                unread(live.peer)
                # reads as big as the loop's read size come when more is waiting: the stream
                # reader's, whatever the first segment was
                upstream.sendall(b"y" * 300000)
                got = await asyncio.wait_for(read, 10)
                assert set(got) == {ord("y")}
                writer.close()

    run(go, loop)


# -- faults at each step of a relayed read ---------------------------------------------------------

FAULTS_SCRIPT = Path(__file__).with_name("relay_faults.py")
FAULT_EVENTS = [_event(n) for n in range(12)]
# (path, step) pairs a fault is injected at: "rest" is a read split between the relay and
# mitmproxy's layers on mitmproxy's read loop; "drain" and "resume" follow a read taken as it
# arrives (on the read loop, mitmproxy's own drain step follows)
FAULT_CASES = [
    *(("direct", step) for step in relay.STEPS if step != "rest"),
    *(("server_event", step) for step in relay.STEPS if step not in ("drain", "resume")),
]


def _fault_writes() -> list[bytes]:
    """A chunk per event, each its own write; the sixth write also carries the first hex digit
    of the seventh chunk's size, so that one read is split between the relay and h11."""
    chunks = [_chunk(e) for e in FAULT_EVENTS]
    chunks[5] += chunks[6][:1]
    chunks[6] = chunks[6][1:]
    return [CHUNKED, *chunks, b"0\r\n\r\n"]


LONG_EVENTS = 24  # at LONG_PAUSE_S apart: twice TCP_TIMEOUT_S
LONG_PAUSE_S = 0.08
TCP_TIMEOUT_S = 1  # mitmproxy's idle timeout in the proxy of these tests (whole seconds)


def _writes_for(path: str) -> tuple[list[bytes], float]:
    """What the upstream writes for a request to `path`, and the pause after each write."""
    if "/to-close/" in path:  # a body that runs to the close: no length, no chunks
        return [HEAD + b"connection: close\r\n\r\n", *FAULT_EVENTS], PAUSE_S
    if path.endswith("/close-mid-read"):  # several chunks per read, for longer than LATE_NEWS_S
        chunks = [_chunk(e) for e in FAULT_EVENTS]
        return [CHUNKED, *(b"".join(chunks[i : i + 2]) for i in range(0, 12, 2)), END], PAUSE_S
    if path.endswith("/longer-than-tcp-timeout"):
        return [CHUNKED, *(_chunk(_event(n)) for n in range(LONG_EVENTS)), END], LONG_PAUSE_S
    if path.endswith("/slow-request-hook"):  # runs alongside the hook; a read in three cut
        # inside a chunk's size, the next one through mitmproxy's receive buffer
        chunks = [_chunk(e) for e in FAULT_EVENTS]
        for i in range(0, 12, 3):
            chunks[i] += chunks[i + 1][:1]
            chunks[i + 1] = chunks[i + 1][1:]
        return [CHUNKED, *chunks, END], 0.04
    return _fault_writes(), PAUSE_S


async def _serve_events(ex: Exchange) -> None:
    writes, pause_s = _writes_for(ex.path)
    for write in writes:
        ex.writer.write(write)
        await ex.writer.drain()
        await asyncio.sleep(pause_s)
    if "/to-close/" in ex.path:
        ex.writer.close()


class _HeadFirstUpstream(ScriptedUpstream):
    """A scripted upstream whose handler runs once a request's head is read: a content-length
    body is read first, a chunked one is left unread (the answer may come before it ends) and
    its connection closed after the answer."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                headers = dict(
                    (k.strip().lower(), v.strip())
                    for k, _, v in (line.partition(":") for line in head[1:] if ":" in line)
                )
                size = int(headers.get("content-length", "0"))
                body = await reader.readexactly(size) if size else b""
                await self.handler(Exchange(method, path, headers, body, writer))
                if headers.get("transfer-encoding") == "chunked":
                    break
        writer.close()


def _read_all(sock: socket.socket) -> tuple[bytes, bool]:
    """What the client reads until the connection ends, and whether it ended with a reset."""
    got = b""
    try:
        while data := sock.recv(65536):
            got += data
    except ConnectionResetError:
        return got, True
    return got, False


def _faulty_exchange(port: int, target: str) -> tuple[bytes, bool]:
    """One request for `target` asking the proxy to close afterwards: what the client reads,
    and whether the connection ended with a reset."""
    body = b'{"model": "m", "stream": true}'
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (target.encode(), len(body), body)
        )
        return _read_all(s)


def _record_of(proxy: Any, target: str) -> dict[str, Any]:
    """The record of the flow for `target`, once written."""
    return wait_for(
        lambda: next(
            (r for r in read_records(proxy.records, 1) if r["request"]["path"] == target), None
        ),
        what=f"the record of {target}",
    )


def _dechunk(raw: bytes) -> tuple[bytes, bool]:
    """A chunked response's body as the client can read it, and whether its last chunk came."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while True:
        size_line, sep, after = rest.partition(b"\r\n")
        if not sep:
            return body, False
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return body, after.startswith(b"\r\n")
        if len(after) < size + 2:
            return body, False  # a chunk cut short: not delivered as a chunk
        body += after[:size]
        rest = after[size + 2 :]


def _metric(port: int, name: str, label: str = "") -> float:
    """One sample of /metrics (a labelled one by `label`, e.g. 'outcome="cut"'), 0 if absent."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name or (label and sample.startswith(name + "{") and label in sample):
            return float(value)
    return 0.0


@contextlib.contextmanager
def side_by_side(
    tmp_path: Path,
    serve: Any,
    *flags: str,
    upstream_tls: ssl.SSLContext | None = None,
    upstream: Callable[..., Any] = ScriptedUpstream,
) -> Iterator[tuple[dict[str, int], Any, Any]]:
    """`hopmeter run` with the relay and without it (`--no-relay`), both with `flags`, in front
    of one upstream scripted by `serve` (`upstream`'s kind, in TLS with `upstream_tls`), each
    with its own records and metrics port: (the metrics ports, relay, off)."""
    ports = {side: free_port() for side in ("relay", "off")}
    for side in ports:
        (tmp_path / side).mkdir()
    scheme = "http" if upstream_tls is None else "https"
    with upstream(serve, upstream_tls) as up:
        url = f"{scheme}://127.0.0.1:{up.port}"
        with (
            measuring(
                tmp_path / "relay",
                url,
                *("--metrics", f"127.0.0.1:{ports['relay']}", *flags),
                ports=(ports["relay"],),
            ) as on,
            measuring(
                tmp_path / "off",
                url,
                *("--metrics", f"127.0.0.1:{ports['off']}", "--no-relay", *flags),
                ports=(ports["off"],),
            ) as off,
        ):
            yield ports, on, off


@contextlib.contextmanager
def faulty_proxy(
    tmp: Path,
    *flags: str,
    upstream_tls: ssl.SSLContext | None = None,
    upstream: Callable[..., Any] | None = None,
) -> Iterator[tuple[Any, int]]:
    """`hopmeter run` with the relay-breaking script loaded (tests/proxy/fastpath/
    relay_faults.py) and `flags`, in front of an upstream serving the fault paths (in TLS with
    `upstream_tls`: `flags` then say whose certificate to trust; `upstream`: another upstream
    than the HTTP/1 one, made with `upstream_tls`), and its metrics port."""
    metrics = free_port()
    scheme = "http" if upstream_tls is None else "https"
    if upstream is None:
        made = _HeadFirstUpstream(_serve_events, upstream_tls)
    else:
        made = upstream(upstream_tls)
    with (
        made as up,
        measuring(
            tmp,
            f"{scheme}://127.0.0.1:{up.port}",
            *("--metrics", f"127.0.0.1:{metrics}", "--set", f"scripts={FAULTS_SCRIPT}"),
            *flags,
            ports=(metrics,),
        ) as proxy,
    ):
        yield proxy, metrics


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int]]:
    """`faulty_proxy` with mitmproxy's idle timeout at TCP_TIMEOUT_S."""
    tmp = tmp_path_factory.mktemp("relay-faults")
    flags = ("--set", f"tcp_timeout={TCP_TIMEOUT_S}", "--read-timeout", "0.9")
    with faulty_proxy(tmp, *flags) as proxy_and_metrics:
        yield proxy_and_metrics


def check_fault(
    faulty: tuple[Any, int], path: str, step: str, body_of: Callable[[int, str], bytes]
) -> None:
    """Inject a fault at `step` of a relayed read (`path`: direct or through mitmproxy's read
    loop), read the stream with `body_of(port, target)` (the framed body), and check what the
    relay's contract says: every byte once and a complete record where the fault came before
    anything changed; else a cut (no last chunk, the stream's start, nothing repeated or
    missing) recorded as an error with the fault. Counted and logged either way."""
    proxy, metrics = faulty
    outcome = "left_to_mitmproxy" if step in relay.LEFT_STEPS else "cut"
    label = f'outcome="{outcome}"'
    before = _metric(metrics, "hopmeter_relay_faults_total", label)
    target = f"/v1/chat/completions/fault/{path}/{step}"
    got, whole = _dechunk(body_of(proxy.port, target))
    rec = _record_of(proxy, target)
    expected = b"".join(FAULT_EVENTS)
    assert f"injected relay fault at {step} ({path})" in proxy.proc.output()
    if step in relay.LEFT_STEPS:
        assert (got, whole) == (expected, True)
        assert rec["ended"] == "complete" and "relay_error" not in rec
    else:
        assert not whole, "a cut connection must not end its body as if whole"
        assert expected.startswith(got) and len(got) < len(expected)
        assert rec["ended"] == "error"
        assert rec["relay_error"].startswith("RuntimeError: injected relay fault at")
    assert wait_for(
        lambda: _metric(metrics, "hopmeter_relay_faults_total", label) == before + 1,
        what=f"the fault counted as {outcome}",
    )


@pytest.mark.integration
@pytest.mark.parametrize(("path", "step"), FAULT_CASES)
def test_a_fault_at_any_step_of_a_relayed_read_never_duplicates_or_drops_in_silence(
    faulty: tuple[Any, int], path: str, step: str
) -> None:
    """A fault in the checks or the split leaves the read to mitmproxy: the client gets every
    byte once and the record is complete; a fault from the reader's state on cuts the client's
    connection: no last chunk, what came is the stream's start with nothing repeated or missing,
    and the record says ended "error" with the relay's fault. Counted and logged either way."""
    check_fault(faulty, path, step, lambda port, target: _faulty_exchange(port, target)[0])


@pytest.mark.integration
def test_a_cut_body_that_runs_to_the_close_ends_with_a_reset(faulty: tuple[Any, int]) -> None:
    """A body with no length and no chunks ends where the connection ends: the relay's cut
    resets the connection, so the client can tell it from the body's end."""
    proxy, _ = faulty
    target = "/v1/chat/completions/to-close/fault/direct/write"
    raw, reset = _faulty_exchange(proxy.port, target)
    got = raw.partition(b"\r\n\r\n")[2]
    assert reset, "a clean close would pass for the end of the body"
    assert b"".join(FAULT_EVENTS).startswith(got)
    assert _record_of(proxy, target)["ended"] == "error"


# -- what the relay's guards are there for --------------------------------------------------------


@pytest.mark.integration
def test_a_relayed_stream_longer_than_mitmproxys_idle_timeout_goes_on(
    faulty: tuple[Any, int],
) -> None:
    """mitmproxy closes a connection idle for `tcp_timeout`; every read the relay moves counts
    as activity, as in mitmproxy's own path, so a stream twice that long is not cut."""
    proxy, metrics = faulty
    target = "/v1/chat/completions/longer-than-tcp-timeout"
    before = _metric(metrics, "hopmeter_relayed_direct_reads_total")
    got, whole = _dechunk(_faulty_exchange(proxy.port, target)[0])
    assert (got, whole) == (b"".join(_event(n) for n in range(LONG_EVENTS)), True)
    assert _record_of(proxy, target)["ended"] == "complete"
    assert _metric(metrics, "hopmeter_relayed_direct_reads_total") - before >= LONG_EVENTS // 2


@pytest.mark.integration
def test_a_closing_client_writer_gets_no_more_writes(faulty: tuple[Any, int]) -> None:
    """When the client's transport closes between two pieces of one read (as a reset found by a
    write closes it), the relay writes nothing more to it: no fault, the flow ends as one whose
    client went."""
    proxy, metrics = faulty
    target = "/v1/chat/completions/close-mid-read"
    cut_before = _metric(metrics, "hopmeter_relay_faults_total", 'outcome="cut"')
    errors_before = _metric(metrics, "hopmeter_internal_errors_total", 'where="relay"')
    got, whole = _dechunk(_faulty_exchange(proxy.port, target)[0])
    assert not whole and b"".join(FAULT_EVENTS).startswith(got)
    assert _record_of(proxy, target)["ended"] == "client_gone"
    assert _metric(metrics, "hopmeter_relay_faults_total", 'outcome="cut"') == cut_before
    assert _metric(metrics, "hopmeter_internal_errors_total", 'where="relay"') == errors_before
    assert "socket.send() raised exception" not in proxy.proc.output()


@pytest.mark.integration
def test_reads_while_a_hook_holds_the_stream_keep_their_order(faulty: tuple[Any, int]) -> None:
    """An upstream answers while the request body is still coming; the request's end starts an
    addon's slow `request` hook, which pauses the flow's HTTP stream while the response streams
    on. Reads mitmproxy queued meanwhile (a chunk size cut across reads goes through its receive
    buffer) and reads the relay could move come out in the upstream's order."""
    proxy, _ = faulty
    target = "/v1/chat/completions/slow-request-hook"
    first = b'{"model": "m", "stream": true}'
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=15) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n%s"
            % (target.encode(), _chunk(first))
        )
        raw = b""
        while b"data: " not in raw:  # the response streams before the request has ended
            raw += s.recv(65536)
        s.sendall(END)  # the request ends: the slow hook starts
        more, _ = _read_all(s)
    got, whole = _dechunk(raw + more)
    assert (got, whole) == (b"".join(FAULT_EVENTS), True)
    assert _record_of(proxy, target)["ended"] == "complete"


@pytest.mark.integration
def test_a_client_that_half_closes_mid_stream_is_let_go(faulty: tuple[Any, int]) -> None:
    """A client that shuts its sending side down mid-stream is taken as gone (mitmproxy's
    rule): the relay moves nothing after mitmproxy has let go of the stream, even while a slow
    `error` hook keeps the relay's own hook waiting; the client's body ends without its last
    chunk, nothing repeated, and the record says client_gone with the events the client got."""
    proxy, metrics = faulty
    target = "/v1/chat/completions/half-close"
    cut_before = _metric(metrics, "hopmeter_relay_faults_total", 'outcome="cut"')
    body = b'{"model": "m", "stream": true}'
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=15) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (target.encode(), len(body), body)
        )
        raw = b""
        while raw.count(b"data: ") < 2:
            raw += s.recv(65536)
        s.shutdown(socket.SHUT_WR)
        more, _ = _read_all(s)
    got, whole = _dechunk(raw + more)
    assert not whole and b"".join(FAULT_EVENTS).startswith(got)
    rec = _record_of(proxy, target)
    assert rec["ended"] == "client_gone"
    assert rec["figures"]["events"] == got.count(b"data: ")  # none measured past the client
    assert _metric(metrics, "hopmeter_relay_faults_total", 'outcome="cut"') == cut_before


# -- the addon: when it arms, and what it says ---------------------------------------------------


def _no_fault(flow: Any, exc: BaseException, cut: bool) -> None:
    raise AssertionError(exc)


def test_fast_paths_off_by_the_version_gate_are_said_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the fast paths kept off by the version gate, the gate's line is logged once when the
    proxy runs, and each response that would have been armed counts under reason="version";
    with the relay option off nothing is counted."""
    addon = relay.Relay(_no_fault)
    addon.started("hopmeter: the relay and the other fast paths are off: h11 0.17.0 is new")
    before = relay.STATS.declined[relay.VERSION]
    with taddons.context(addon) as tctx, caplog.at_level(logging.WARNING):
        addon.running()
        for _ in range(2):
            addon.responseheaders(tflow.tflow(resp=True))
        tctx.options.update(hopmeter_relay=False)
        addon.responseheaders(tflow.tflow(resp=True))
    assert caplog.text.count("h11 0.17.0 is new") == 1
    assert relay.STATS.declined[relay.VERSION] == before + 2


def test_fast_paths_not_installed_arm_nothing_and_count_nothing() -> None:
    """Before `started` (--no-relay: never), the addon arms no relay and counts no decline."""
    addon = relay.Relay(_no_fault)
    declined, armed = dict(relay.STATS.declined), relay.STATS.armed
    with taddons.context(addon):
        addon.running()
        flow = tflow.tflow(resp=True)
        addon.responseheaders(flow)
    assert relay._KEY not in flow.server_conn.__dict__
    assert (dict(relay.STATS.declined), relay.STATS.armed) == (declined, armed)


# -- behind an upstream in TLS (relay.tls_event_to_child) ----------------------------------------

# asyncio's TLS transport cannot half-close (write_eof): that scenario is plain HTTP's alone
TLS_NAMES = [name for name in SCENARIOS if name != "read-to-half-close"]
UP_TLS_ATTEMPTS = 3  # a scenario's reads may coalesce apart in two runs on a busy machine


@pytest.fixture(scope="module")
def upstream_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server context for the scripted upstreams, and the certificate the proxy trusts."""
    cert, key = make_self_signed(tmp_path_factory.mktemp("upstream-tls"), ("127.0.0.1",))
    return server_context(cert, key), cert


@pytest.mark.integration
def test_from_a_tls_upstream_the_relay_changes_no_byte_and_no_record(
    tmp_path: Path, upstream_tls: tuple[ssl.SSLContext, Path]
) -> None:
    """Each scenario from an upstream in TLS, through `hopmeter run` with the relay and, side
    by side, without it: the client reads the same bytes and the records agree
    but for times (a pair cut apart by timing alone is run again); the relay armed for every
    response, left none to mitmproxy and took no read before mitmproxy's TLS layer did."""
    context, cert = upstream_tls
    trust = ("--set", f"ssl_verify_upstream_trusted_ca={cert}")
    with side_by_side(tmp_path, _serve, *trust, upstream_tls=context) as (ports, on, off):
        flows = alike(on, off, TLS_NAMES, "/v1/chat/completions/up-tls", _faulty_exchange)
        for side, port in ports.items():
            assert set(_declined(port).values()) == {0}, (side, _declined(port))
        responses, pieces, direct = _relayed(ports["relay"])
        assert _relayed(ports["off"]) == (0, 0, 0)
    assert responses == flows and pieces >= 30 and direct == 0


def alike(on: Any, off: Any, names: list[str], prefix: str, ask: Callable[[int, str], Any]) -> int:
    """Ask both proxies for `prefix/<attempt>/<name>` of every scenario name, with `ask(port,
    target)` (what the client reads): what the clients read and the records must agree but for
    times; a pair that differs is asked again, up to UP_TLS_ATTEMPTS times (its reads may
    coalesce apart on a busy machine). How many flows each proxy had."""
    flows = 0
    for name in names:
        differences = []
        for attempt in range(UP_TLS_ATTEMPTS):
            target = f"{prefix}/{attempt}/{name}"
            got = [ask(p.port, target) for p in (on, off)]
            recs = [_stable(_record_of(p, target)) for p in (on, off)]
            flows += 1
            if got[0] == got[1] and recs[0] == recs[1]:
                break
            differences.append((got, recs))
        else:
            raise AssertionError((name, differences[-1]))
    return flows


UPSTREAM_TLS_FAULT_CASES = [step for step in relay.STEPS if step not in ("drain", "resume")]


@pytest.fixture(scope="module")
def faulty_up_tls(
    tmp_path_factory: pytest.TempPathFactory, upstream_tls: tuple[ssl.SSLContext, Path]
) -> Iterator[tuple[Any, int]]:
    """`faulty_proxy` in front of an upstream in TLS."""
    context, cert = upstream_tls
    tmp = tmp_path_factory.mktemp("relay-up-tls-faults")
    trust = ("--set", f"ssl_verify_upstream_trusted_ca={cert}")
    with faulty_proxy(tmp, *trust, upstream_tls=context) as proxy_and_metrics:
        yield proxy_and_metrics


@pytest.mark.integration
@pytest.mark.parametrize("step", UPSTREAM_TLS_FAULT_CASES)
def test_a_fault_in_a_read_from_a_tls_upstream_never_duplicates_or_drops_in_silence(
    faulty_up_tls: tuple[Any, int], step: str
) -> None:
    """Behind an upstream in TLS as behind a plain one: a fault in the checks or the split leaves
    the plaintext to mitmproxy's layers (every byte once, the record complete); from the reader's
    state on it cuts the client's connection (the stream's start, nothing repeated or missing,
    the record ended "error" with the fault). Its reads come through mitmproxy's read loop."""
    check_fault(
        faulty_up_tls,
        "server_event",
        step,
        lambda port, target: _faulty_exchange(port, target)[0],
    )
