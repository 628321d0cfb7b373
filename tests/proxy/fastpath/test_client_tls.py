"""Tests for hopmeter.proxy.fastpath.client_tls, the relay's way through mitmproxy's client TLS
layer (hopmeter.proxy.fastpath.relay with a client in TLS to the proxy): a real TLS client
through `hopmeter run` reads the same bytes, chunk for chunk, and the flows give the same records
with the relay on as through mitmproxy's layers (`--no-relay`), and the relay moved the bodies
through the client's TLS connection itself; the same for a client that speaks HTTP/2 (DATA frame
for DATA frame, with the client's flow-control window open or nearly shut); a fault at any step
of such a read leaves it to mitmproxy or cuts the client's connection, never more."""

from __future__ import annotations

import random
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from hopmeter.proxy.fastpath import relay
from tests.harness.scripted import Exchange
from tests.proxy.fastpath.test_relay import (
    CHUNKED,
    END,
    HEAD,
    SCENARIOS,
    _chunk,
    _declined,
    _event,
    _metric,
    _record_of,
    _relayed,
    _script,
    _stable,
    _write_script,
    check_fault,
    faulty_proxy,
    side_by_side,
)

SEEDS = range(6)  # random bodies: events of random sizes, cut into reads at random


def _random_script(seed: int) -> list[bytes | str | None]:
    """A body of events of random sizes, framed as chunks, a length or to the close, written in
    random cuts (whole chunks, several at once, or across chunk boundaries)."""
    rng = random.Random(seed)
    events = [_event(n) * rng.randint(1, 120) for n in range(rng.randint(3, 10))]
    framing = rng.choice(["chunked", "length", "close"])
    if framing == "chunked":
        head, raw, tail = CHUNKED, b"".join(map(_chunk, events)) + END, []
    elif framing == "length":
        raw = b"".join(events)
        head, tail = HEAD + b"content-length: %d\r\n\r\n" % len(raw), []
    else:
        head, raw, tail = HEAD + b"connection: close\r\n\r\n", b"".join(events), [None]
    writes: list[bytes | str | None] = [head]
    pos = 0
    while pos < len(raw):
        n = rng.choice([1, 7, 64, 500, 4000, 20000])
        writes.append(raw[pos : pos + n])
        pos += n
    return [*writes, *tail]


def _names() -> list[str]:
    return [*SCENARIOS, *(f"random-{seed}" for seed in SEEDS)]


async def _serve(ex: Exchange) -> None:
    name = ex.path.split("?", 1)[0].strip("/").split("/")[-1]
    script = _random_script(int(name[7:])) if name.startswith("random-") else _script(name)
    await _write_script(ex, script)


def _client_tls(alpn: str = "http/1.1") -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the proxy's certificate, made up by mitmproxy
    context.set_alpn_protocols([alpn])
    context.options |= ssl.OP_IGNORE_UNEXPECTED_EOF  # mitmproxy closes without close_notify
    return context


def _tls_exchange(port: int, target: str) -> tuple[list[bytes], bool]:
    """One request in TLS asking the proxy to close afterwards: what the client reads, read by
    read, and whether the connection ended with a reset."""
    body = b'{"model": "m", "stream": true}'
    got: list[bytes] = []
    raw = socket.create_connection(("127.0.0.1", port), timeout=15)
    with _client_tls().wrap_socket(raw, server_hostname="example.com") as s:
        assert s.selected_alpn_protocol() in (None, "http/1.1")
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (target.encode(), len(body), body)
        )
        try:
            while data := s.recv(65536):
                got.append(data)
        except (ConnectionResetError, ssl.SSLError):
            return got, True
    return got, False


def _tls_metrics(port: int) -> tuple[float, float]:
    """Relayed pieces in all, and those sent through a client's TLS connection."""
    return (
        _metric(port, "hopmeter_relayed_pieces_total"),
        _metric(port, "hopmeter_relayed_tls_pieces_total"),
    )


ATTEMPTS = 3  # a scenario's reads may coalesce apart in two runs on a busy machine: run again


@pytest.mark.integration
def test_over_tls_the_relay_changes_no_byte_and_no_record(tmp_path: Path) -> None:
    """Each scenario and random body, from a TLS client through `hopmeter run` with the relay
    and, side by side, without it: the client reads the same bytes and the records agree but
    for times (a pair whose upstream reads were cut apart by timing alone is run again); the
    relay armed for every response and moved its pieces through the client's TLS connection."""
    names = _names()
    with side_by_side(tmp_path, _serve, "--set", f"confdir={tmp_path / 'mitmproxy'}") as (
        ports,
        on,
        off,
    ):
        flows = 0
        for name in names:
            differences = []
            for attempt in range(ATTEMPTS):
                target = f"/v1/chat/completions/{attempt}/{name}"
                got = [b"".join(_tls_exchange(p.port, target)[0]) for p in (on, off)]
                flows += 1
                recs = [_record_of(p, target) for p in (on, off)]
                if got[0] == got[1] and _stable(recs[0]) == _stable(recs[1]):
                    break
                differences.append((got, [_stable(r) for r in recs]))
            else:
                raise AssertionError((name, differences[-1]))
        for run, port in ports.items():
            assert set(_declined(port).values()) == {0}, run
        assert _relayed(ports["relay"])[0] == flows
        pieces, tls_pieces = _tls_metrics(ports["relay"])
        assert _tls_metrics(ports["off"]) == (0, 0)
    assert pieces >= 30 and tls_pieces == pieces  # every piece moved went through TLS


def _h2_exchange(port: int, target: str, window: int | None = None) -> tuple[list[bytes], str]:
    """One request for `target` over HTTP/2 in TLS (offered alone), on a connection of its own:
    the DATA payloads read, frame by frame, and how the stream ended: "end", "reset" (the proxy
    reset the stream) or "cut" (the connection ended first). With `window`, each stream's window
    starts at that many bytes and a frame is credited only once read, so the proxy's bytes wait
    in its HTTP/2 connection's buffer for the client's WINDOW_UPDATE."""
    body = b'{"model": "m", "stream": true}'
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    if window is not None:
        conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    head = [(":method", "POST"), (":path", target), (":scheme", "https")]
    conn.send_headers(sid, [*head, (":authority", "example.com"), ("content-length", "30")])
    conn.send_data(sid, body, end_stream=True)
    payloads: list[bytes] = []
    raw = socket.create_connection(("127.0.0.1", port), timeout=15)
    with _client_tls("h2").wrap_socket(raw, server_hostname="example.com") as s:
        assert s.selected_alpn_protocol() == "h2"
        s.sendall(conn.data_to_send())
        try:
            while data := s.recv(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                        payloads.append(event.data)
                        conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                        return payloads, "end"
                    elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                        return payloads, "reset"
                s.sendall(conn.data_to_send())
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            pass
    return payloads, "cut"


# the scenarios read over HTTP/2 with a stream window this small too (a few events' worth)
SMALL_WINDOW = 100
SMALL_WINDOW_NAMES = ["one-chunk-per-event", "several-chunks-per-read", "random-0", "random-1"]


@pytest.mark.integration
def test_over_h2_the_relay_changes_no_byte_and_no_record(tmp_path: Path) -> None:
    """Each scenario and random body, from an HTTP/2 client in TLS through `hopmeter run` with
    the relay and, side by side, without it: the client reads the same DATA frames and the same
    end of its stream, and the records agree but for times (a pair cut apart by timing alone is
    run again); with a small stream window the same bytes and end (the frames' cuts follow the
    client's WINDOW_UPDATEs, and whether the client was slow enough to be found slow, which
    timing decides). The relay armed for every response and sent
    every piece it moved as HTTP/2, through the client's TLS connection."""
    cases = [(name, None) for name in _names()]
    cases += [(name, SMALL_WINDOW) for name in SMALL_WINDOW_NAMES]
    with side_by_side(tmp_path, _serve, "--set", f"confdir={tmp_path / 'mitmproxy'}") as (
        ports,
        on,
        off,
    ):
        flows = 0
        for name, window in cases:
            differences = []
            for attempt in range(ATTEMPTS):
                target = f"/v1/chat/completions/h2-{window}/{attempt}/{name}"
                got = [_h2_exchange(p.port, target, window) for p in (on, off)]
                recs = [_stable(_record_of(p, target)) for p in (on, off)]
                if window is not None:  # the bytes, not their frames; waits timing decides
                    got = [(b"".join(payloads), end) for payloads, end in got]
                    for rec in recs:
                        rec["findings"] = [f for f in rec["findings"] if f != "slow_client"]
                flows += 1
                if got[0] == got[1] and recs[0] == recs[1]:
                    break
                differences.append((got, recs))
            else:
                raise AssertionError((name, window, differences[-1]))
        for run, port in ports.items():
            assert set(_declined(port).values()) == {0}, run
        assert _relayed(ports["relay"])[0] == flows
        pieces, tls_pieces = _tls_metrics(ports["relay"])
        h2_pieces = _metric(ports["relay"], "hopmeter_relayed_h2_pieces_total")
        own = _metric(ports["relay"], "hopmeter_relayed_h2_own_frames_total")
        assert _tls_metrics(ports["off"]) == (0, 0)
    assert pieces >= 30 and tls_pieces == pieces and h2_pieces == pieces
    assert 30 <= own <= h2_pieces  # sent by h2_frames' steps: all but pieces h2 split or held


# -- faults at each step of a read relayed through the client's TLS connection --------------------

TLS_STEPS = (*relay.STEPS, "sendall", "bio_read")  # the last two: the TLS part of "write"
TLS_FAULT_CASES = [
    *(("direct", step) for step in TLS_STEPS if step != "rest"),
    *(("server_event", step) for step in TLS_STEPS if step not in ("drain", "resume")),
]


@pytest.fixture(scope="module")
def faulty_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int]]:
    """`faulty_proxy` for TLS clients (its own mitmproxy confdir: its CA)."""
    tmp = tmp_path_factory.mktemp("relay-tls-faults")
    with faulty_proxy(tmp, "--set", f"confdir={tmp / 'mitmproxy'}") as proxy_and_metrics:
        yield proxy_and_metrics


@pytest.mark.integration
@pytest.mark.parametrize(("path", "step"), TLS_FAULT_CASES)
def test_a_fault_in_a_tls_relayed_read_never_duplicates_or_drops_in_silence(
    faulty_tls: tuple[Any, int], path: str, step: str
) -> None:
    """Over TLS as in plain HTTP/1: a fault in the checks or the split leaves the read to
    mitmproxy (every byte once, the record complete); from the reader's state on, through the
    TLS connection's sendall and bio_read, it cuts the client's connection: no last chunk, the
    stream's start with nothing repeated or missing, the record ended "error" with the fault."""
    _, metrics = faulty_tls
    tls_before = _metric(metrics, "hopmeter_relayed_tls_pieces_total")
    check_fault(
        faulty_tls, path, step, lambda port, target: b"".join(_tls_exchange(port, target)[0])
    )
    assert _metric(metrics, "hopmeter_relayed_tls_pieces_total") > tls_before  # relayed in TLS


def _h2_as_chunked(port: int, target: str) -> bytes:
    """An HTTP/2 exchange's DATA frames as the chunked body `check_fault` reads: a chunk per
    frame, and the last chunk only if the stream ended as it should."""
    payloads, end = _h2_exchange(port, target)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)
    return b"HTTP/1.1 200 OK\r\n\r\n" + chunks + (END if end == "end" else b"")


@pytest.mark.integration
@pytest.mark.parametrize(("path", "step"), TLS_FAULT_CASES)
def test_a_fault_in_an_h2_relayed_read_never_duplicates_or_drops_in_silence(
    faulty_tls: tuple[Any, int], path: str, step: str
) -> None:
    """Over HTTP/2 as over HTTP/1: a fault in the checks or the split leaves the read to
    mitmproxy (every byte once, the stream ended, the record complete); from the reader's state
    on, through the HTTP/2 connection's framing and the TLS connection, it cuts the client's
    connection: the stream's start with nothing repeated or missing and no end of stream, the
    record ended "error" with the fault."""
    _, metrics = faulty_tls
    h2_before = _metric(metrics, "hopmeter_relayed_h2_pieces_total")
    check_fault(faulty_tls, path, step, _h2_as_chunked)
    assert _metric(metrics, "hopmeter_relayed_h2_pieces_total") > h2_before  # relayed as h2
