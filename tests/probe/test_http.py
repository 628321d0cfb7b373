"""Tests for hopmeter.probe.http: the strict client reads each body framing and stamps each read."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import pytest

from hopmeter.errors import HopmeterError
from hopmeter.probe import http
from hopmeter.probe.http import Received, post_stream
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.loopback  # every test serves or connects on 127.0.0.1, in this process


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


# -- post_stream against a server written by hand ------------------------------------------

DOC = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hé"}]}
# The pause the server leaves between two pieces of a body: the later piece cannot arrive sooner.
PAUSE_S = 0.05

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Seen:
    """What the server read: the request head's lines and the body."""

    head: list[str] = field(default_factory=list)
    body: bytes = b""


async def _exchange(reply: Reply, userinfo: str = "", **kwargs: object) -> tuple[Received, Seen]:
    """Serve one request on 127.0.0.1:0 with `reply`, and POST DOC to it with post_stream (the
    URL with `userinfo` when given)."""
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        seen.head = head.split("\r\n")[:-2]
        length = next(
            int(line.split(":", 1)[1]) for line in seen.head if line.startswith("content-length:")
        )
        seen.body = await reader.readexactly(length)
        try:
            await reply(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        got = await post_stream(
            f"http://{userinfo}127.0.0.1:{port}/v1/chat/completions?x=1",
            DOC,
            {"x-hopmeter-scenario": "tokens=2"},
            **kwargs,  # type: ignore[arg-type]
        )
    return got, seen


def _serve(reply: Reply, userinfo: str = "", **kwargs: object) -> tuple[Received, Seen]:
    return asyncio.run(_exchange(reply, userinfo, **kwargs))


async def _raw_chunked(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type:  text/event-stream \r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    writer.write(b"9\r\ndata: a\n\n\r\n")
    await writer.drain()
    await asyncio.sleep(PAUSE_S)
    writer.write(b"a;name=value\r\ndata: bb\n\n\r\n0\r\n\r\n")
    await writer.drain()


def test_the_request_is_a_json_post_with_the_callers_headers() -> None:
    """The server gets POST of the path and query, the host, a JSON body of the stated length,
    `connection: close` and the extra headers."""
    _got, seen = _serve(_raw_chunked)
    request_line, *headers = seen.head
    assert request_line == "POST /v1/chat/completions?x=1 HTTP/1.1"
    assert headers[0].startswith("host: 127.0.0.1:")
    assert sorted(headers[1:]) == sorted(
        [
            "content-type: application/json",
            f"content-length: {len(seen.body)}",
            "connection: close",
            "x-hopmeter-scenario: tokens=2",
        ]
    )
    assert orjson.loads(seen.body) == DOC


def test_a_user_and_password_in_the_url_are_basic_auth_never_the_host() -> None:
    """http://user:pass@host/: the Host header names the host alone (a password there reached
    the upstream, and its logs, in the clear); the pair is sent as Basic auth."""
    _got, seen = _serve(_raw_chunked, "me:p%40ss@")
    headers = seen.head[1:]
    assert headers[0].startswith("host: 127.0.0.1:") and "p%40ss" not in headers[0]
    assert f"authorization: Basic {base64.b64encode(b'me:p@ss').decode()}" in headers


def test_a_chunked_body_is_one_stamped_chunk_per_chunk() -> None:
    """Each chunk of a chunked body is kept as sent (extensions dropped), stamped when read, and
    the terminal chunk makes the response complete."""
    got, _seen = _serve(_raw_chunked)
    assert got.status == 200
    assert got.headers["content-type"] == "text/event-stream"  # names lower-cased, values stripped
    assert [data for _, data in got.chunks] == [b"data: a\n\n", b"data: bb\n\n"]
    (t1, _), (t2, _) = got.chunks
    assert t1 >= 0 and t2 - t1 >= PAUSE_S  # the second was stamped when it came, not before
    assert got.complete
    assert got.body == b"data: a\n\ndata: bb\n\n"


def test_a_sized_body_is_read_to_its_length() -> None:
    """A body with Content-Length is read to exactly that length, as one chunk, complete."""

    async def sized(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 12\r\n\r\n")
        writer.write(b'{"error":1}\n')
        await writer.drain()

    got, _ = _serve(sized)
    assert got.status == 429
    assert [data for _, data in got.chunks] == [b'{"error":1}\n']
    assert got.complete


def test_a_close_delimited_body_is_read_to_the_end_of_the_connection() -> None:
    """A body with neither length nor chunking is every byte until the server closes, stamped
    per read, in order."""

    async def until_close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
        writer.write(b'{"n":1}\n')
        await writer.drain()
        await asyncio.sleep(PAUSE_S)
        writer.write(b'{"n":2}\n')
        await writer.drain()

    got, _ = _serve(until_close)
    assert got.body == b'{"n":1}\n{"n":2}\n'
    times = [t for t, _ in got.chunks]
    assert len(times) >= 2 and times == sorted(times)
    assert times[-1] - times[0] >= PAUSE_S
    assert got.complete


def test_a_chunked_body_cut_short_is_an_error_not_a_complete_reply() -> None:
    """A connection closed before the terminal chunk raises instead of returning a reply."""

    async def cut(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n")
        await writer.drain()

    with pytest.raises(asyncio.IncompleteReadError):
        _serve(cut)


def test_a_server_that_never_answers_times_out() -> None:
    """With no response head within `timeout_s`, post_stream gives up with TimeoutError."""

    async def silent(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await reader.read()  # send nothing; the client gives up and hangs up

    with pytest.raises(TimeoutError):
        _serve(silent, timeout_s=0.2)
