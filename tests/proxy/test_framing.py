"""Tests for hopmeter.proxy.framing: the same commands as mitmproxy's Http1Server.send."""

from __future__ import annotations

from typing import Any

import pytest
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import (
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
)
from mitmproxy.test import tflow, tutils

from hopmeter.proxy import framing


class Server:
    """What Http1Server.send reads of itself for response events."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.stream_id = 1
        self.conn = tflow.tclient_conn()
        self.request = tutils.treq()
        self.response = tutils.tresp(headers=[(k.encode(), v.encode()) for k, v in headers.items()])

    def mark_done(self, **kwargs: Any) -> Any:
        yield from ()


def sent(method: Any, server: Server, event: Any) -> list[tuple[type, bytes | None]]:
    return [
        (type(c), c.data if isinstance(c, commands.SendData) else None)
        for c in method(server, event)
    ]


MITMPROXY = framing._MITMPROXY_SEND
CHUNKED = {"transfer-encoding": "chunked"}


@pytest.mark.parametrize(
    "headers",
    [
        {"transfer-encoding": "chunked", "content-type": "text/event-stream"},
        {"Transfer-Encoding": "gzip, Chunked"},
        {"content-length": "11"},
        {},
    ],
    ids=["chunked", "chunked-last", "length", "neither"],
)
def test_data_is_framed_as_mitmproxy_frames_it(headers: dict[str, str]) -> None:
    ours, theirs = Server(headers), Server(headers)
    for data in (b"data: a\n\n", b"", b"x" * 300, b"data: b\n\n"):
        event = ResponseData(1, data)
        assert sent(framing.send, ours, event) == sent(MITMPROXY, theirs, event)


def test_a_change_to_the_headers_between_chunks_is_seen() -> None:
    """The decision is kept per header tuple: an addon that changes the headers mid-body (they
    were sent already, but mitmproxy reads them again) gets mitmproxy's answer."""
    ours, theirs = Server(CHUNKED), Server(CHUNKED)
    for server in (ours, theirs):
        list(framing.send(server, ResponseData(1, b"one")))
    for server in (ours, theirs):
        del server.response.headers["transfer-encoding"]
    event = ResponseData(1, b"two")
    assert (
        sent(framing.send, ours, event)
        == sent(MITMPROXY, theirs, event)
        == [(commands.SendData, b"two")]
    )
    for server in (ours, theirs):
        server.response.headers["transfer-encoding"] = "chunked"
    assert sent(framing.send, ours, event) == [(commands.SendData, b"3\r\ntwo\r\n")]


def test_other_events_go_to_mitmproxys_method() -> None:
    ours, theirs = Server(CHUNKED), Server(CHUNKED)
    for event in (
        ResponseHeaders(1, ours.response, end_stream=False),
        ResponseEndOfMessage(1),
    ):
        assert sent(framing.send, ours, event) == sent(MITMPROXY, theirs, event)
    ours.response = None  # type: ignore[assignment]
    with pytest.raises(AssertionError):  # mitmproxy's own check, as before
        list(framing.send(ours, ResponseData(1, b"x")))


def test_install_puts_the_method_in_front_and_uninstall_takes_it_away() -> None:
    """Only `hopmeter run` installs it (run_proxy); installing twice is the same as once."""
    try:
        framing.install()
        framing.install()
        assert _http1.Http1Server.send is framing.send
    finally:
        framing.uninstall()
    assert _http1.Http1Server.send is MITMPROXY
