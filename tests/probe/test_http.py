"""post_stream against a real HTTP/1.1 server on loopback: the request, body framings, stamps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import pytest

from hopmeter.probe.http import Received, post_stream

DOC = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hé"}]}
# The pause the server leaves between two pieces of a body: the later piece cannot arrive sooner.
PAUSE_S = 0.05

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Seen:
    """What the server read: the request head's lines and the body."""

    head: list[str] = field(default_factory=list)
    body: bytes = b""


async def _exchange(reply: Reply, **kwargs: object) -> tuple[Received, Seen]:
    """Serve one request on 127.0.0.1:0 with `reply`, and POST DOC to it with post_stream."""
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
            f"http://127.0.0.1:{port}/v1/chat/completions?x=1",
            DOC,
            {"x-hopmeter-scenario": "tokens=2"},
            **kwargs,  # type: ignore[arg-type]
        )
    return got, seen


def _serve(reply: Reply, **kwargs: object) -> tuple[Received, Seen]:
    return asyncio.run(_exchange(reply, **kwargs))


async def _chunked(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
    _got, seen = _serve(_chunked)
    request_line, *headers = seen.head
    assert request_line == "POST /v1/chat/completions?x=1 HTTP/1.1"
    assert headers[0].startswith("host: 127.0.0.1:")
    assert headers[1:] == [
        "content-type: application/json",
        f"content-length: {len(seen.body)}",
        "connection: close",
        "x-hopmeter-scenario: tokens=2",
    ]
    assert orjson.loads(seen.body) == DOC


def test_a_chunked_body_is_one_stamped_chunk_per_chunk() -> None:
    """Each chunk of a chunked body is kept as sent (extensions dropped), stamped when read, and
    the terminal chunk makes the response complete."""
    got, _seen = _serve(_chunked)
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
