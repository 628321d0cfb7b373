"""Tests for hopmeter.proxy.delivery.conn on real loopback sockets and mitmproxy's own handler
(tests.harness.live_client): the peer is a plain socket the test reads, or does not read. Every
test runs on both of `hopmeter run`'s loops: asyncio's selector transports and uvloop's compiled
ones are followed through the same writer."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import h2.config
import h2.connection
import h2.exceptions
import pytest
from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection

from hopmeter.core.ledger import END, GONE, OUT, SENT, T_WRITE, new_chunk
from hopmeter.proxy.delivery import conn as client_conn
from hopmeter.proxy.delivery.conn import ConnTracker, locate
from tests.harness.live_client import Live, flow_of, live_client, run, unread

pytestmark = pytest.mark.loopback  # every test serves or connects on 127.0.0.1, in this process

LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


def tracker_of(live: Live, failures: list[str] | None = None) -> ConnTracker:
    """A tracker on the live connection's writer; its poller wishes are ignored."""
    found = locate(flow_of(live))
    assert not isinstance(found, str), found
    _, writer, sock = found
    failed = failures if failures is not None else []
    return ConnTracker(writer, sock, lambda *a: None, lambda where, exc: failed.append(where))


class TestLocate:
    @LOOPS
    def test_a_live_client_gives_its_writer_and_socket(self, loop: str) -> None:
        """The handler mitmproxy registered for the client leads to its writer and socket."""

        async def test() -> None:
            async with live_client() as live:
                found = locate(flow_of(live))
                assert not isinstance(found, str)
                handler, writer, sock = found
                assert handler is live.handler and writer is live.writer
                assert sock.fileno() == live.writer.get_extra_info("socket").fileno()

        run(test, loop)

    def test_a_client_not_registered_is_not_measured_and_says_why(self) -> None:
        """A flow whose client has no live handler gets a reason, not a guess."""

        async def test() -> None:
            async with live_client() as live:
                live.proxyserver.connections.clear()
                assert locate(flow_of(live)) == "no live connection handler for this client"

        run(test)

    def test_a_writer_someone_else_wrapped_is_left_alone(self) -> None:
        """A write already shadowed by another tool is not wrapped a second time."""

        async def test() -> None:
            async with live_client() as live:
                live.writer.write = lambda data: None  # type: ignore[method-assign]
                why = locate(flow_of(live))
                assert why == "the client's writer.write is already wrapped by something else"

        run(test)

    def test_a_mitmproxy_whose_internals_were_not_read_is_not_measured(
        self, monkeypatch: Any
    ) -> None:
        """A major version outside the ones whose path was read gives a reason."""
        monkeypatch.setattr(client_conn, "mitmproxy_major", lambda: 99)

        async def test() -> None:
            async with live_client() as live:
                why = locate(flow_of(live))
                assert isinstance(why, str) and "were not read yet" in why

        run(test)


def h2_server_with_streams(*sids: int) -> BufferedH2Connection:
    """mitmproxy's server side of an HTTP/2 connection (sans-I/O) whose client opened `sids`."""
    server = BufferedH2Connection(h2.config.H2Configuration(client_side=False))
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    for sid in sids:
        head = [(":method", "GET"), (":path", "/"), (":scheme", "https"), (":authority", "a")]
        client.send_headers(sid, head)
    server.receive_data(client.data_to_send())
    return server


class TestHttp2Chunks:
    def test_a_chunk_is_armed_while_both_windows_cover_it_and_held_otherwise(self) -> None:
        """An HTTP/2 chunk is armed for the next write when its stream has nothing buffered and
        the smaller of the connection's and the stream's send windows covers it (mitmproxy
        frames it at once then); otherwise it is held until the buffer releases it."""

        async def test() -> None:
            async with live_client() as live:
                tracker = tracker_of(live)
                h2c = h2_server_with_streams(1, 3)
                tracker.h2conn = h2c
                led = tracker.ledger
                first = new_chunk(100, 1.0)
                tracker.h2_chunk(first, 1)
                assert led.armed is first and not led.held
                led.disarm()
                # stream 1 takes all but 10 bytes of the connection's window; stream 3's own
                # window stays whole, so the connection's is the smaller one for both
                h2c.send_data(1, b"x" * (h2c.local_flow_control_window(1) - 10))
                assert h2c.local_flow_control_window(3) == 10
                fits = new_chunk(10, 2.0)
                tracker.h2_chunk(fits, 3)
                assert led.armed is fits and not led.held
                led.disarm()
                over = new_chunk(11, 3.0)
                tracker.h2_chunk(over, 3)
                assert led.armed is None and led.held == {3: [over]}
                behind = new_chunk(1, 4.0)  # the stream holds a chunk: the next one waits too
                tracker.h2_chunk(behind, 3)
                assert led.held == {3: [over, behind]}
                assert tracker.handed == {1: 100, 3: 22}

        run(test)

    def test_a_chunk_of_a_stream_h2_does_not_know_raises_as_h2_does(self) -> None:
        """A stream h2 never opened raises h2's error (FlowOut.chunk then stops following the
        flow), as h2's own window lookup does."""

        async def test() -> None:
            async with live_client() as live:
                tracker = tracker_of(live)
                tracker.h2conn = h2_server_with_streams(1)
                with pytest.raises(h2.exceptions.NoSuchStreamError):
                    tracker.h2_chunk(new_chunk(5, 1.0), 5)

        run(test)


class TestTracker:
    @LOOPS
    def test_writes_pass_through_and_are_counted(self, loop: str) -> None:
        """The client gets exactly the bytes written; the armed chunk's end is its write's end."""

        async def test() -> None:
            async with live_client() as live:
                tracker = tracker_of(live)
                live.writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
                c = new_chunk(5, 1.0)
                tracker.ledger.arm(c)
                live.writer.write(b"5\r\nhello\r\n")
                assert unread(live.peer) == b"HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n"
                assert c[END] == 19 + 10 and c[OUT] == c[T_WRITE] is not None
                assert tracker.poll(c[T_WRITE] + 0.001) is False  # sent: nothing pending
                assert c[SENT] is not None

        run(test, loop)

    @LOOPS
    def test_a_client_that_does_not_read_leaves_the_chunk_waiting(self, loop: str) -> None:
        """With the client's window full, a look finds the chunk unsent; reading releases it."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                tracker = tracker_of(live)
                c = new_chunk(256 * 1024, 1.0)
                tracker.ledger.arm(c)
                live.writer.write(b"x" * (256 * 1024))
                now = asyncio.get_running_loop().time()
                assert tracker.poll(now) is True and c[SENT] is None
                got = 0
                while tracker.poll(asyncio.get_running_loop().time()):
                    got += len(unread(live.peer))
                    await asyncio.sleep(0.001)
                assert c[SENT] is not None and got + len(unread(live.peer)) == 256 * 1024

        run(test, loop)

    @LOOPS
    def test_a_failing_count_gives_the_writer_back_and_says_so(self, loop: str) -> None:
        """A bug in the count never costs a byte: the real write ran, the wrapper is removed."""

        async def test() -> None:
            async with live_client() as live:
                failures: list[str] = []
                tracker = tracker_of(live, failures)
                tracker.ledger = None  # type: ignore[assignment]  # the next count raises
                live.writer.write(b"still delivered")
                assert unread(live.peer) == b"still delivered"
                assert failures == ["delivery"] and tracker.broken is not None
                assert "write" not in live.writer.__dict__

        run(test, loop)

    @LOOPS
    def test_close_takes_a_last_look_and_counts_what_was_left(self, loop: str) -> None:
        """Closing with bytes unsent: a last look first, and the bytes still queued are counted."""

        async def test() -> None:
            async with live_client(rcvbuf=4096) as live:
                tracker = tracker_of(live)
                c = new_chunk(512 * 1024, 1.0)
                tracker.ledger.arm(c)
                live.writer.write(b"y" * (512 * 1024))
                live.writer.close()
                assert tracker.queued_at_close is not None and tracker.queued_at_close > 0
                assert tracker.last_poll > c[T_WRITE] and c[SENT] is None
                tracker.give_up("closed", tracker.last_poll)
                assert c[GONE] == "closed" and c[SENT] is None

        run(test, loop)

    @LOOPS
    def test_a_closed_connection_is_not_taken_for_the_next_one(self, loop: str) -> None:
        """Once the socket is closed, a tracker reads it as closed even when the next connection
        gets the same descriptor number (uvloop's socket object keeps the old number)."""

        async def test() -> None:
            async with live_client() as live:
                tracker = tracker_of(live)
                fd = tracker.sock.fileno()
                assert tracker.is_open()
                live.writer.close()
                await live.writer.wait_closed()  # connection_lost ran: the socket is closed
                with socket.socket() as other:
                    if other.fileno() != fd:  # the number went elsewhere: take it on purpose
                        os.dup2(other.fileno(), fd)
                    assert not tracker.is_open()
                    if other.fileno() != fd:
                        os.close(fd)

        run(test, loop)
