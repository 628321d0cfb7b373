"""Tests for hopmeter.probe.http: the strict client reads each body framing and stamps each read."""

from __future__ import annotations

import asyncio

import pytest

from hopmeter.errors import HopmeterError
from hopmeter.probe import http
from tests.harness.scripted import Exchange, ScriptedUpstream


async def _chunked(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream", "X-Twice": "first"})
    for piece in (b"data: a\r\n", b"\r\n", b"data: \xf0\x9f", b"\xa6\x99\n\n"):
        await ex.chunk(piece)
        await asyncio.sleep(0.02)
    await ex.end()


async def _sized(ex: Exchange) -> None:
    ex.writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
    await ex.writer.drain()


async def _close_delimited(ex: Exchange) -> None:
    ex.writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
    await ex.writer.drain()
    ex.writer.write(b"the end")
    ex.writer.close()


async def _not_http(ex: Exchange) -> None:
    ex.writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
    await ex.writer.drain()


def test_chunked_reads_arrive_in_order_each_stamped() -> None:
    """Each HTTP chunk is one read, unchanged (split characters included), times rising."""
    with ScriptedUpstream(_chunked) as up:
        got = asyncio.run(http.request(f"http://127.0.0.1:{up.port}/x", "POST", b"{}"))
    assert got.status == 200 and got.complete
    assert [d for _, d in got.chunks] == [
        b"data: a\r\n",
        b"\r\n",
        b"data: \xf0\x9f",
        b"\xa6\x99\n\n",
    ]
    times = [t for t, _ in got.chunks]
    assert times == sorted(times) and times[-1] - times[0] >= 0.05
    assert got.t_headers_s is not None and got.t_headers_s <= times[0]
    assert got.headers["x-twice"] == "first" and up.requests[0].body == b"{}"


def test_sized_and_close_delimited_bodies_are_read_whole() -> None:
    """A Content-Length body and one that ends when the connection does."""
    with ScriptedUpstream(_sized) as sized:
        assert asyncio.run(http.request(f"http://127.0.0.1:{sized.port}/")).body == b"hello"
    with ScriptedUpstream(_close_delimited) as closing:
        got = asyncio.run(http.request(f"http://127.0.0.1:{closing.port}/"))
    assert got.body == b"until the end" and got.complete


def test_a_reply_that_is_not_http_is_one_clear_error() -> None:
    """Something else on the port is named, not parsed."""
    with ScriptedUpstream(_not_http) as up, pytest.raises(HopmeterError, match=r"not an HTTP/1\.1"):
        asyncio.run(http.request(f"http://127.0.0.1:{up.port}/"))


def test_post_stream_sends_json_for_the_demo() -> None:
    """The demo's POST sends its document as JSON and gets every read back."""
    with ScriptedUpstream(_chunked) as up:
        got = asyncio.run(http.post_stream(f"http://127.0.0.1:{up.port}/v1", {"stream": True}))
    assert up.requests[0].body == b'{"stream":true}' and len(got.chunks) == 4
