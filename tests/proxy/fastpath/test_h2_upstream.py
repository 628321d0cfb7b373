"""hopmeter.proxy.fastpath.h2_upstream: behind an HTTP/2 upstream in TLS, the relay moves the
DATA frames mitmproxy's layers would only move, and nothing a client reads or a record says
changes; a fault at any step never repeats or drops a byte in silence.

The clients speak HTTP/2 in TLS: mitmproxy offers the upstream the client's own protocols
(ALPN), so a client speaking HTTP/1 has its upstream speak HTTP/1 too.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hopmeter.proxy.fastpath import relay
from hopmeter.upstream.tls import make_self_signed, server_context
from tests.harness.h2client import exchange
from tests.harness.h2upstream import H2Exchange, H2ScriptedUpstream
from tests.proxy.fastpath.test_relay import (
    FAULT_EVENTS,
    PAUSE_S,
    _declined,
    _event,
    _metric,
    alike,
    check_fault,
    faulty_proxy,
    side_by_side,
)

EVENTS = [_event(n) for n in range(8)]
BIG = [b"data: " + bytes([65 + n]) * 40_000 + b"\n\n" for n in range(3)]  # frames over records
STREAMS = 3  # the streams of one client connection, answered interleaved


async def _paced(ex: H2Exchange, frames: list[bytes], **last: Any) -> None:
    """The head, then each frame in its own write, PAUSE_S apart; the stream's end after."""
    ex.head()
    await ex.flush()
    for frame in frames:
        ex.data(frame)
        await ex.flush()
        await asyncio.sleep(PAUSE_S)
    ex.data(b"", end=True, **last)
    await ex.flush()


async def _serve(ex: H2Exchange) -> None:
    """What the upstream answers for the scenario named last in the path."""
    name = ex.path.rstrip("/").rsplit("/", 1)[-1]
    if name == "one-frame-per-event":
        await _paced(ex, EVENTS)
    elif name == "frames-together":
        ex.head()
        for e in EVENTS[:4]:
            ex.data(e)
        await ex.flush()
        await asyncio.sleep(PAUSE_S)
        for e in EVENTS[4:7]:
            ex.data(e)
        ex.data(EVENTS[7], end=True)
        await ex.flush()
    elif name == "padded":
        ex.head()
        await ex.flush()
        for i, e in enumerate(EVENTS):
            ex.data(e, pad=7 if i % 3 == 1 else None)
            if i % 2:
                await ex.flush()
                await asyncio.sleep(PAUSE_S)
        ex.data(b"", end=True)
        await ex.flush()
    elif name == "empty-frames":
        ex.head()
        for e in EVENTS:
            ex.data(b"")
            ex.data(e)
            await ex.flush()
            await asyncio.sleep(PAUSE_S)
        ex.data(b"", end=True)
        await ex.flush()
    elif name == "content-length":
        ex.head({"content-length": str(sum(map(len, EVENTS)))})
        await ex.flush()
        for e in EVENTS[:-1]:
            ex.data(e)
            await ex.flush()
            await asyncio.sleep(PAUSE_S)
        ex.data(EVENTS[-1], end=True)
        await ex.flush()
    elif name == "trailers":
        ex.head()
        for e in EVENTS:
            ex.data(e)
            await ex.flush()
            await asyncio.sleep(PAUSE_S)
        ex.trailers({"x-sum": "8"})
        await ex.flush()
    elif name == "reset-mid-body":
        ex.head()
        for e in EVENTS[:3]:
            ex.data(e)
            await ex.flush()
            await asyncio.sleep(PAUSE_S)
        ex.reset()
        await ex.flush()
    elif name == "frames-cut-across-writes":
        ex.head()
        await ex.flush()
        for e in EVENTS:
            ex.data(e)
        ex.data(b"", end=True)
        raw = ex.conn.h2.data_to_send()
        for i in range(0, len(raw), 37):
            ex.conn.writer.write(raw[i : i + 37])
            await ex.conn.writer.drain()
            await asyncio.sleep(PAUSE_S / 3)
    elif name == "big-frames":
        await _paced(ex, BIG)
    elif name.startswith("interleaved-"):
        await _interleaved(ex)
    elif name in ("fault-events",):
        await _fault_events(ex)
    else:
        raise AssertionError(name)


async def _interleaved(ex: H2Exchange) -> None:
    """STREAMS requests of one connection: the last to arrive answers them all, each write a
    DATA frame of every stream."""
    conn = ex.conn
    while len([e for e in conn.exchanges.values() if "interleaved-" in e.path]) < STREAMS:
        conn.arrived.clear()
        await asyncio.wait_for(conn.arrived.wait(), 10)
    ours = sorted(e.stream_id for e in conn.exchanges.values() if "interleaved-" in e.path)
    if ex.stream_id != ours[-1]:
        return
    group = [conn.exchanges[sid] for sid in ours]
    for each in group:
        each.head()
    await conn.flush()
    for e in EVENTS:
        for each in group:
            each.data(e)
        await conn.flush()
        await asyncio.sleep(PAUSE_S)
    for each in group:
        each.data(b"", end=True)
    await conn.flush()


H2_SCENARIOS = [
    "one-frame-per-event",
    "frames-together",
    "padded",
    "empty-frames",
    "content-length",
    "trailers",
    "reset-mid-body",
    "frames-cut-across-writes",
    "big-frames",
]


@pytest.fixture(scope="module")
def h2_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server context offering h2 alone, and the certificate the proxy trusts."""
    cert, key = make_self_signed(tmp_path_factory.mktemp("h2-upstream"), ("127.0.0.1",))
    context = server_context(cert, key)
    context.set_alpn_protocols(["h2"])
    return context, cert


def _relayed_h2(port: int) -> tuple[float, float]:
    """Responses a relay was armed for, and pieces moved from an HTTP/2 upstream (each taken in
    by h2_frames' steps: the relayed DATA frames to the client, HTTP/2 too, are counted with
    them when they fit at once)."""
    pieces = _metric(port, "hopmeter_relayed_h2_upstream_pieces_total")
    own = _metric(port, "hopmeter_relayed_h2_own_frames_total")
    assert pieces <= own <= 2 * pieces
    return _metric(port, "hopmeter_relayed_responses_total"), pieces


def _h2_client(port: int, paths: list[str]) -> dict[str, list[tuple[str, Any]]]:
    return exchange("127.0.0.1", port, paths)


@pytest.mark.integration
def test_from_an_http2_upstream_the_relay_changes_no_byte_and_no_record(
    tmp_path: Path, h2_tls: tuple[ssl.SSLContext, Path]
) -> None:
    """Each scenario from an HTTP/2 upstream in TLS through `hopmeter run` with the relay and,
    side by side, without it: the client reads the same frames, and the records agree but for
    times (a pair cut apart by timing alone is run again); the relay armed for every response,
    left none to mitmproxy, and moved DATA frames from the upstream."""
    context, cert = h2_tls
    trust = ("--set", f"ssl_verify_upstream_trusted_ca={cert}")
    with side_by_side(
        tmp_path, _serve, *trust, upstream_tls=context, upstream=H2ScriptedUpstream
    ) as (ports, on, off):
        flows = alike(
            on, off, H2_SCENARIOS, "/v1/chat/completions", lambda port, t: _h2_client(port, [t])
        )
        for side, port in ports.items():
            assert set(_declined(port).values()) == {0}, (side, _declined(port))
        responses, pieces = _relayed_h2(ports["relay"])
        assert _relayed_h2(ports["off"]) == (0, 0)
    assert responses == flows
    assert pieces >= 30  # most DATA frames of the paced scenarios


@pytest.mark.integration
def test_streams_interleaved_on_one_upstream_connection_are_each_relayed(
    tmp_path: Path, h2_tls: tuple[ssl.SSLContext, Path]
) -> None:
    """STREAMS streams of one HTTP/2 client, carried on one upstream connection whose every
    read holds a DATA frame of each: each stream gets its own events, in order, as without the
    relay, and the relay moved them."""
    context, cert = h2_tls
    trust = ("--set", f"ssl_verify_upstream_trusted_ca={cert}")
    with side_by_side(
        tmp_path, _serve, *trust, upstream_tls=context, upstream=H2ScriptedUpstream
    ) as (ports, on, off):
        seen = []
        for proxy in (on, off):
            paths = [f"/v1/chat/completions/interleaved-{i}" for i in range(STREAMS)]
            seen.append(_h2_client(proxy.port, paths))
        _, pieces = _relayed_h2(ports["relay"])
    assert seen[0] == seen[1]
    for frames in seen[0].values():
        assert b"".join(p for kind, p in frames if kind == "data") == b"".join(EVENTS)
        assert frames[-1] == ("end", None)
    assert pieces >= STREAMS * (len(EVENTS) - 2)


# -- faults --------------------------------------------------------------------------------------

H2_FAULT_CASES = [step for step in relay.STEPS if step not in ("drain", "resume")]


async def _fault_events(ex: H2Exchange) -> None:
    """FAULT_EVENTS a DATA frame per write; the sixth write also carries the seventh event,
    padded, so that one read is split between the relay and mitmproxy's HTTP/2 client."""
    ex.head()
    await ex.flush()
    for i, e in enumerate(FAULT_EVENTS):
        if i == 6:
            continue
        ex.data(e)
        if i == 5:
            ex.data(FAULT_EVENTS[6], pad=3)
        await ex.flush()
        await asyncio.sleep(PAUSE_S)
    ex.data(b"", end=True)
    await ex.flush()


@pytest.fixture(scope="module")
def faulty_h2(
    tmp_path_factory: pytest.TempPathFactory, h2_tls: tuple[ssl.SSLContext, Path]
) -> Iterator[tuple[Any, int]]:
    """`faulty_proxy` in front of an HTTP/2 upstream in TLS."""
    context, cert = h2_tls
    tmp = tmp_path_factory.mktemp("relay-h2-faults")
    trust = ("--set", f"ssl_verify_upstream_trusted_ca={cert}")
    with faulty_proxy(
        tmp,
        *trust,
        upstream_tls=context,
        upstream=lambda tls: H2ScriptedUpstream(_fault_events, tls),
    ) as proxy_and_metrics:
        yield proxy_and_metrics


@pytest.mark.integration
@pytest.mark.parametrize("step", H2_FAULT_CASES)
def test_a_fault_in_a_read_from_an_http2_upstream_never_duplicates_or_drops_in_silence(
    faulty_h2: tuple[Any, int], step: str
) -> None:
    """Behind an HTTP/2 upstream as behind an HTTP/1 one: a fault in the checks or the frames'
    scan leaves the read to mitmproxy's layers (every byte once, the record complete); from
    feeding the frames to the connection's h2 on it cuts the client's connection (the stream's
    start, nothing repeated or missing, the record ended "error" with the fault)."""
    check_fault(faulty_h2, "server_event", step, _as_chunked)


def _as_chunked(port: int, target: str) -> bytes:
    """What an HTTP/2 client reads of `target`, as the HTTP/1 response it stands for: each DATA
    frame a chunk, the last chunk only if the stream ended."""
    seen = _h2_client(port, [target])[target]
    chunks = [b"%x\r\n%s\r\n" % (len(p), p) for kind, p in seen if kind == "data"]
    end = b"0\r\n\r\n" if seen[-1] == ("end", None) else b""
    return b"HTTP/1.1 200 OK\r\n\r\n" + b"".join(chunks) + end
