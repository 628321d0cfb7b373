"""Tests for hopmeter.proxy.fastpath.framing: on mitmproxy's own Http1Server, the commands its
send gives; a fault leaves the chunk to mitmproxy's own method."""

from __future__ import annotations

from typing import Any

import pytest
from mitmproxy import options
from mitmproxy.proxy import commands, context
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import (
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
)
from mitmproxy.test import tflow, tutils

from hopmeter.proxy.fastpath import framing


def server(headers: dict[str, str]) -> _http1.Http1Server:
    """mitmproxy's own HTTP/1 server layer, in the middle of answering a request."""
    layer = _http1.Http1Server(context.Context(tflow.tclient_conn(), options.Options()))
    layer.stream_id = 1
    layer.request = tutils.treq()
    layer.response = tutils.tresp(headers=[(k.encode(), v.encode()) for k, v in headers.items()])
    return layer


def sent(method: Any, layer: _http1.Http1Server, event: Any) -> list[tuple[type, bytes | None]]:
    return [
        (type(c), c.data if isinstance(c, commands.SendData) else None)
        for c in method(layer, event)
    ]


MITMPROXY = framing._MITMPROXY_SEND
CHUNKED = {"transfer-encoding": "chunked"}


def _unexpected(where: str, exc: BaseException) -> None:
    raise AssertionError(f"a fault in {where}: {exc!r}")


send = framing.make_send(_unexpected)


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
    ours, theirs = server(headers), server(headers)
    for data in (b"data: a\n\n", b"", b"x" * 300, b"data: b\n\n"):
        event = ResponseData(1, data)
        assert sent(send, ours, event) == sent(MITMPROXY, theirs, event)


def test_a_change_to_the_headers_between_chunks_is_seen() -> None:
    """The decision is kept per header tuple: an addon that changes the headers mid-body (they
    were sent already, but mitmproxy reads them again) gets mitmproxy's answer."""
    ours, theirs = server(CHUNKED), server(CHUNKED)
    for layer in (ours, theirs):
        list(send(layer, ResponseData(1, b"one")))
    for layer in (ours, theirs):
        assert layer.response is not None
        del layer.response.headers["transfer-encoding"]
    event = ResponseData(1, b"two")
    assert (
        sent(send, ours, event) == sent(MITMPROXY, theirs, event) == [(commands.SendData, b"two")]
    )
    for layer in (ours, theirs):
        assert layer.response is not None
        layer.response.headers["transfer-encoding"] = "chunked"
    assert sent(send, ours, event) == [(commands.SendData, b"3\r\ntwo\r\n")]


def test_other_events_go_to_mitmproxys_method() -> None:
    ours, theirs = server(CHUNKED), server(CHUNKED)
    for event in (
        ResponseHeaders(1, tutils.tresp(), end_stream=False),
        ResponseEndOfMessage(1),
    ):
        assert sent(send, ours, event) == sent(MITMPROXY, theirs, event)
    ours.response = None
    with pytest.raises(AssertionError):  # mitmproxy's own check, as before
        list(send(ours, ResponseData(1, b"x")))


@pytest.mark.parametrize("headers", [CHUNKED, {"content-length": "3"}], ids=["chunked", "length"])
def test_a_fault_in_the_shortcut_leaves_the_chunk_to_mitmproxy(
    headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault before the chunk is sent (here in the framing decision) is told to `on_error` and
    mitmproxy's own method sends the chunk: the same commands, once."""
    faults: list[tuple[str, BaseException]] = []

    def broken(server: Any, response: Any) -> bool:
        raise RuntimeError("injected")

    monkeypatch.setattr(framing, "chunked", broken)
    guarded = framing.make_send(lambda where, exc: faults.append((where, exc)))
    event = ResponseData(1, b"two")
    assert sent(guarded, server(headers), event) == sent(MITMPROXY, server(headers), event)
    assert [(where, str(exc)) for where, exc in faults] == [("framing", "injected")]


def test_install_puts_the_method_in_front_and_uninstall_takes_it_away() -> None:
    """Only `hopmeter run` installs it (hopmeter.proxy.fastpath.install); uninstall gives
    mitmproxy its own method back."""
    try:
        framing.install(_unexpected)
        assert framing.installed()
        assert _http1.Http1Server.send is not MITMPROXY
    finally:
        framing.uninstall()
    assert _http1.Http1Server.send is MITMPROXY
    assert not framing.installed()
