"""`hopmeter run`'s fast paths through mitmproxy, and every private name of it they reach.

- `relay`: a streamed HTTP/1 body's reads moved from upstream to client past mitmproxy's layers;
- `h2_upstream`: the same for the DATA frames of an HTTP/2 upstream in TLS;
- `client_tls`: the relay's way through mitmproxy's TLS layer to a client in TLS to the proxy;
- `backpressure`: mitmproxy's per-read drain step run only when a writer could need it;
- `framing`: mitmproxy's HTTP/1 framing decision kept per response instead of per chunk;
- `internals`: the private parts of mitmproxy, h11 and h2 they (and hopmeter's delivery lane) read;
- `gate`: whether the installed mitmproxy, h11, h2 and Python are those they were read against.

`install()` (`hopmeter run` only, before its proxy starts) asks the gate and then replaces three
of mitmproxy's methods; `hopmeter run --no-relay` (or `--set hopmeter_relay=false` at start)
never calls it, and mitmproxy's classes stay as they are. Each fast path fails closed: a fault
leaves the bytes to mitmproxy untouched, or ends the client's connection so that it can tell
(docs/reliability.md, "The relay").
"""

from __future__ import annotations

from collections.abc import Callable

OnError = Callable[[str, BaseException], None]


def install(on_error: OnError) -> str | None:
    """Install every fast path, or none: None when installed, else the gate's line saying why
    not. `on_error` counts and logs a fault that a fast path left to mitmproxy's own method."""
    from hopmeter.proxy.fastpath import backpressure, framing, gate, relay  # noqa: PLC0415

    off = gate.check()
    if off is not None:
        return off
    backpressure.install(on_error)
    framing.install(on_error)
    relay.install()
    return None


def installed() -> list[str]:
    """The fast paths whose method stands in front of mitmproxy's now."""
    from hopmeter.proxy.fastpath import backpressure, framing, relay  # noqa: PLC0415

    return [m.__name__.rsplit(".", 1)[1] for m in (backpressure, framing, relay) if m.installed()]


def uninstall() -> None:
    """Give mitmproxy all its own methods back (tests)."""
    from hopmeter.proxy.fastpath import backpressure, framing, relay  # noqa: PLC0415

    backpressure.uninstall()
    framing.uninstall()
    relay.uninstall()
