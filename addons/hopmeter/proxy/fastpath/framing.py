"""`hopmeter run`'s shortcut through mitmproxy's HTTP/1 framing of each response body chunk.

For every chunk of a response body it sends to an HTTP/1 client, mitmproxy's `Http1Server.send`
looks up the response's Transfer-Encoding (a scan of every header field, each name lower-cased)
to choose between chunked framing and the bytes as they are: ~2.5% of `hopmeter run`'s CPU on a
stream (perf, `_MultiDict.get_all`, `Headers.get_all`, `always_bytes`). The answer depends only
on the response's header fields, and mitmproxy's `Headers` replaces its `fields` tuple on every
change, never altering one in place; `install()` puts a method in front of mitmproxy's that keeps
the answer with the tuple it was computed from and computes it again only when the response's
fields are another tuple. Every other event, and a chunk with no response, goes to mitmproxy's
own method. The bytes sent are mitmproxy's (tests/proxy/fastpath/test_framing.py holds the two
methods to the same commands).

A fault in the shortcut (a bug here, a mitmproxy whose objects changed) happens before anything
is sent: the chunk goes to mitmproxy's own method, untouched, and the fault is counted and
logged (`on_error`).

It changes a class of the interpreter's mitmproxy, so only `hopmeter run` installs it
(hopmeter.proxy.fastpath); the addons a user loads into a plain mitmdump leave mitmproxy as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mitmproxy import http

from hopmeter.proxy.fastpath.internals import (
    CommandGenerator,
    Http1Server,
    HttpEvent,
    ResponseData,
    SendData,
)

OnError = Callable[[str, BaseException], None]
Send = Callable[[Http1Server, HttpEvent], CommandGenerator[None]]

_MITMPROXY_SEND: Send = Http1Server.send
# where a server keeps (the response's header fields, whether they frame the body as chunks)
_KEPT = "_hopmeter_framing"


def make_send(on_error: OnError) -> Send:
    """mitmproxy's `Http1Server.send` with its framing decision kept per header tuple for data;
    a fault before the chunk is sent leaves it to mitmproxy's method and goes to `on_error`."""

    def send(self: Http1Server, event: HttpEvent) -> CommandGenerator[None]:
        response = self.response
        if type(event) is not ResponseData or response is None:
            yield from _MITMPROXY_SEND(self, event)
            return
        assert event.stream_id == self.stream_id
        try:
            data = event.data
            # chunked(self, response), its remembered answer read inline: once per chunk
            seen = self.__dict__.get(_KEPT)
            if seen is not None and seen[0] is response.data.headers.fields:
                framed = seen[1]
            else:
                framed = chunked(self, response)
            raw = b"%x\r\n%s\r\n" % (len(data), data) if framed else data
        except Exception as exc:  # nothing sent yet: mitmproxy's own method sends this chunk
            on_error("framing", exc)
            yield from _MITMPROXY_SEND(self, event)
            return
        if raw:
            yield SendData(self.conn, raw)

    return send


def chunked(server: Http1Server, response: http.Response) -> bool:
    """Whether `server` frames `response`'s body chunks as HTTP/1 chunks, as mitmproxy's `send`
    decides it, remembered with the header tuple the answer came from."""
    fields = response.data.headers.fields  # response.headers is a property over data.headers
    seen: Any = server.__dict__.get(_KEPT)
    if seen is not None and seen[0] is fields:
        return bool(seen[1])
    answer = "chunked" in response.headers.get("transfer-encoding", "").lower()
    server.__dict__[_KEPT] = (fields, answer)
    return answer


def install(on_error: OnError) -> None:
    """Put the shortcut in front of mitmproxy's `send` (`hopmeter run` only)."""
    Http1Server.send = make_send(on_error)  # type: ignore[method-assign,assignment]


def installed() -> bool:
    """Whether `Http1Server.send` is not mitmproxy's own."""
    return Http1Server.send is not _MITMPROXY_SEND


def uninstall() -> None:
    """Give mitmproxy its own method back (tests)."""
    Http1Server.send = _MITMPROXY_SEND  # type: ignore[method-assign,assignment]
