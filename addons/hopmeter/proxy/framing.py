"""`hopmeter run`'s shortcut through mitmproxy's HTTP/1 framing of each response body chunk.

For every chunk of a response body it sends to an HTTP/1 client, mitmproxy's `Http1Server.send`
looks up the response's Transfer-Encoding (a scan of every header field, each name lower-cased)
to choose between chunked framing and the bytes as they are: ~2.5% of `hopmeter run`'s CPU on a
stream (perf, `_MultiDict.get_all`, `Headers.get_all`, `always_bytes`). The answer depends only
on the response's header fields, and mitmproxy's `Headers` replaces its `fields` tuple on every
change, never altering one in place; `install()` puts a method in front of mitmproxy's that keeps
the answer with the tuple it was computed from and computes it again only when the response's
fields are another tuple. Every other event, and a chunk with no response, goes to mitmproxy's
own method. The bytes sent are mitmproxy's (tests/proxy/test_framing.py holds the two methods to
the same commands).

It changes a class of the interpreter's mitmproxy, so only `hopmeter run` installs it; the addons a
user loads into a plain mitmdump leave mitmproxy as it is.
"""

from __future__ import annotations

from typing import Any

from mitmproxy import http
from mitmproxy.proxy import commands, layer
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import HttpEvent, ResponseData

_MITMPROXY_SEND = _http1.Http1Server.send


def send(self: _http1.Http1Server, event: HttpEvent) -> layer.CommandGenerator[None]:
    """mitmproxy's `Http1Server.send`, its framing decision kept per header tuple for data."""
    response = self.response
    if type(event) is not ResponseData or response is None:
        yield from _MITMPROXY_SEND(self, event)
        return
    assert event.stream_id == self.stream_id
    raw = b"%x\r\n%s\r\n" % (len(event.data), event.data) if chunked(self, response) else event.data
    if raw:
        yield commands.SendData(self.conn, raw)


def chunked(server: _http1.Http1Server, response: http.Response) -> bool:
    """Whether `server` frames `response`'s body chunks as HTTP/1 chunks, as mitmproxy's `send`
    decides it, remembered with the header tuple the answer came from."""
    fields = response.headers.fields
    seen: Any = server.__dict__.get("_hopmeter_framing")
    if seen is not None and seen[0] is fields:
        return bool(seen[1])
    answer = "chunked" in response.headers.get("transfer-encoding", "").lower()
    server.__dict__["_hopmeter_framing"] = (fields, answer)
    return answer


def install() -> None:
    """Put `send` in front of mitmproxy's (idempotent; `hopmeter run` only)."""
    _http1.Http1Server.send = send  # type: ignore[method-assign]


def uninstall() -> None:
    """Give mitmproxy its own method back (tests)."""
    _http1.Http1Server.send = _MITMPROXY_SEND  # type: ignore[method-assign]
