"""hopmeter.proxy.fastpath.h2_frames: the relay's own steps for an HTTP/2 DATA frame leave every
connection as h2's steps leave it, and put the same bytes on the wire.

Each test drives two connections set up alike through one sequence of steps, h2's on one and
h2_frames' on the other (h2's wherever h2_frames declines, as the relay does), and compares the
bytes each gives to send and the state that decides what comes next: the windows (their sizes
and the bytes processed towards a WINDOW_UPDATE), each stream's received length and state, and
mitmproxy's buffer of what a window held back. The peers are plain h2 connections, so the bytes
are also read back as HTTP/2 by a real implementation.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from h2.settings import SettingCodes
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.proxy.layers.http._http_h2 import SendH2Data

from hopmeter.proxy.fastpath import gate, h2_frames
from hopmeter.proxy.fastpath.internals import BufferedH2Connection
from tests.harness.h2pair import shake

HEAD = [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "https")]
HEAD += [(":authority", "upstream.test")]
STREAMS = (1, 3, 5)
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = SettingCodes.INITIAL_WINDOW_SIZE, SettingCodes.MAX_FRAME_SIZE


def _config(client_side: bool) -> h2.config.H2Configuration:
    return h2.config.H2Configuration(client_side=client_side, header_encoding="utf-8")


def _to_client(window: int, frame_size: int) -> tuple[Any, Any]:
    """mitmproxy's connection to an HTTP/2 client (server side), with the client's streams open
    and their responses' headers sent; the client announces `window` and `frame_size`."""
    proxy = BufferedH2Connection(_config(client_side=False))
    client = h2.connection.H2Connection(_config(client_side=True))
    client.initiate_connection()
    client.update_settings({INITIAL_WINDOW_SIZE: window, MAX_FRAME_SIZE: frame_size})
    proxy.initiate_connection()
    shake(client, proxy)
    for sid in STREAMS:
        client.send_headers(sid, HEAD, end_stream=sid != 5)  # stream 5 stays open both ways
    shake(client, proxy)
    for sid in STREAMS:
        proxy.send_headers(sid, [(":status", "200")])
    shake(client, proxy)
    return proxy, client


def _from_upstream(buffered: bool, window: int) -> tuple[Any, Any]:
    """The proxy's connection to an HTTP/2 upstream (client side; mitmproxy's, or h2's with its
    default windows when not `buffered`), its streams' requests sent and responses' headers
    received; the proxy announces `window` (mitmproxy's own: the largest)."""
    make = BufferedH2Connection if buffered else h2.connection.H2Connection
    proxy = make(_config(client_side=True))
    upstream = h2.connection.H2Connection(_config(client_side=False))
    proxy.initiate_connection()
    if not buffered:
        proxy.update_settings({INITIAL_WINDOW_SIZE: window})
    upstream.initiate_connection()
    shake(proxy, upstream)
    for sid in STREAMS:
        proxy.send_headers(sid, HEAD, end_stream=sid != 5)
    shake(proxy, upstream)
    for sid in STREAMS:
        upstream.send_headers(sid, [(":status", "200")])
    shake(proxy, upstream)
    return proxy, upstream


def _windows(conn: Any) -> tuple[Any, ...]:
    """What decides a connection's next frames: its windows both ways, its window managers'
    counts, each stream's state, windows, received length, and mitmproxy's held-back data."""
    whole = conn._inbound_flow_control_window_manager
    streams = tuple(
        (
            sid,
            s.state_machine.state,
            s.outbound_flow_control_window,
            s._inbound_window_manager.current_window_size,
            s._inbound_window_manager._bytes_processed,
            s._inbound_window_manager.max_window_size,
            s._actual_content_length,
        )
        for sid, s in sorted(conn.streams.items())
    )
    held = {
        sid: [(b.data, b.end_stream) for b in q]
        for sid, q in getattr(conn, "stream_buffers", {}).items()
        if q
    }
    return (
        conn.state_machine.state,
        conn.outbound_flow_control_window,
        whole.current_window_size,
        whole._bytes_processed,
        whole.max_window_size,
        streams,
        held,
        bytes(conn._data_to_send),
    )


def test_the_gate_lets_the_installed_h2_take_its_own_steps() -> None:
    """The h2 installed here is one whose code h2_frames was read against (else the relay's
    HTTP/2 frames go to h2, and these tests would hold a path nothing takes)."""
    assert gate.check_h2_frames() is None
    assert h2_frames.check() is None


def test_a_changed_state_machine_turns_the_own_steps_off(monkeypatch: pytest.MonkeyPatch) -> None:
    table = h2_frames.h2_stream_transitions
    key = (h2_frames.H2StreamState.OPEN, h2_frames.H2StreamInputs.RECV_DATA)
    monkeypatch.setitem(table, key, (None, h2_frames.H2StreamState.CLOSED))
    why = gate.check_h2_frames()
    assert why is not None and "state machines" in why and "h2 takes every frame" in why


def _send_both(a: Any, b: Any, sid: int, piece: bytes) -> tuple[bytes, bytes]:
    a.send_data(sid, piece)
    sent_a = a.data_to_send()
    sent_b = h2_frames.send(b, sid, piece)
    if sent_b is None:
        b.send_data(sid, piece)
        sent_b = b.data_to_send()
    return sent_a, sent_b


# a step towards the client: a piece on a stream, or the client reading what it got (its
# acknowledgement opens the windows again), or a ping the proxy answers without sending it yet
SEND_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("piece"), st.sampled_from(STREAMS), st.integers(0, 40_000)),
        st.tuples(st.just("read"), st.just(0), st.just(0)),
        st.tuples(st.just("ping"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    steps=SEND_STEPS,
    window=st.sampled_from([100, 1_000, 65_535, 2**20]),
    frame_size=st.sampled_from([16_384, 20_000]),
)
def test_sending_leaves_the_connection_as_h2_does(
    steps: list[tuple[str, int, int]], window: int, frame_size: int
) -> None:
    (a, client_a), (b, client_b) = _to_client(window, frame_size), _to_client(window, frame_size)
    assert _windows(a) == _windows(b)
    for n, (kind, sid, size) in enumerate(steps):
        if kind == "piece":
            piece = bytes([65 + n % 26]) * size
            sent_a, sent_b = _send_both(a, b, sid, piece)
            assert sent_a == sent_b
            # the client reads them as the same frames (and acknowledges them alike)
            got = []
            for client, sent in ((client_a, sent_a), (client_b, sent_b)):
                events = client.receive_data(sent)
                for e in events:
                    if isinstance(e, h2.events.DataReceived):
                        client.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                got.append([(type(e), getattr(e, "data", None)) for e in events])
            assert got[0] == got[1]
        elif kind == "read":  # the client's window updates reach the proxy: held data leaves
            for client, proxy in ((client_a, a), (client_b, b)):
                out = client.data_to_send()
                if out:
                    proxy.receive_data(out)
            assert a.data_to_send() == b.data_to_send()
        else:  # a PING answered into the proxy's send buffer: a piece must go after it
            client_a.ping(b"12345678")
            client_b.ping(b"12345678")
            a.receive_data(client_a.data_to_send())
            b.receive_data(client_b.data_to_send())
        assert _windows(a) == _windows(b)


def test_a_piece_that_does_not_fit_at_once_is_left_to_h2() -> None:
    proxy, _ = _to_client(100, 16_384)
    before = _windows(proxy)
    assert h2_frames.send(proxy, 1, b"x" * 101) is None  # over the stream's window
    assert h2_frames.send(proxy, 1, b"") is None  # an empty piece: h2's own frame
    assert h2_frames.send(proxy, 7, b"x") is None  # no such stream
    big, _ = _to_client(2**20, 16_384)
    assert h2_frames.send(big, 1, b"x" * 16_385) is None  # over the frame size
    assert _windows(proxy) == before
    proxy.send_data(1, b"x" * 150)  # 100 sent, 50 held back for the window
    assert h2_frames.send(proxy, 1, b"y") is None  # after held-back data: h2 queues it too
    # held-back data goes first even with room in the windows (mitmproxy's order)
    big.stream_buffers[3].append(SendH2Data(b"z", False))
    before = _windows(big)
    assert h2_frames.send(big, 3, b"y") is None
    assert _windows(big) == before
    assert h2_frames.send(big, 1, b"y") is not None  # another stream's is its own


# a read from the upstream: the DATA frames of one read, each (stream, length)
READS = st.lists(
    st.lists(st.tuples(st.sampled_from(STREAMS), st.integers(1, 9_000)), min_size=1, max_size=6),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(reads=READS, buffered=st.booleans(), window=st.sampled_from([20_000, 65_535, 2**20]))
def test_receiving_leaves_the_connection_as_h2_does(
    reads: list[list[tuple[int, int]]], buffered: bool, window: int
) -> None:
    (a, up_a), (b, up_b) = _from_upstream(buffered, window), _from_upstream(buffered, window)
    for read in reads:
        fits = []  # the frames the relay's checks pass: each within its windows
        for sid, size in read:
            room = min(up_a.local_flow_control_window(sid), up_a.max_outbound_frame_size)
            if size <= room:
                up_a.send_data(sid, b"d" * size)
                up_b.send_data(sid, b"d" * size)
                fits.append((sid, size))
        raw = up_a.data_to_send()
        assert raw == up_b.data_to_send()
        if not fits:
            continue
        # h2's steps, as mitmproxy's HTTP/2 client takes them: the read, then each event acked
        events = a.receive_data(raw)
        assert [(e.stream_id, len(e.data)) for e in events] == fits
        for e in events:
            a.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        h2_frames.received(b, [(b.streams[sid], size) for sid, size in fits])
        assert _windows(a) == _windows(b)
        out = a.data_to_send()
        assert out == b.data_to_send()
        # the upstream reads the same window updates, and its windows open alike
        up_a.receive_data(out)
        up_b.receive_data(out)
