"""`hopmeter run`'s fast paths through mitmproxy, and every private name of it they reach.

- `relay`: a streamed HTTP/1 body's reads moved from upstream to client past mitmproxy's layers;
- `h2_upstream`: the same for the DATA frames of an HTTP/2 upstream in TLS;
- `client_tls`: the relay's way through mitmproxy's TLS layer to a client in TLS to the proxy;
- `h2_frames`: an HTTP/2 DATA frame's steps in h2 taken without h2's generic machinery, for the
  frames the relay moves;
- `backpressure`: mitmproxy's per-read drain step run only when a writer could need it;
- `framing`: mitmproxy's HTTP/1 framing decision kept per response instead of per chunk;
- `connections`: the upstream connections a client connection has done with let go of (not a
  fast path: mitmproxy kept them all, and a failed connect's error, for the client's lifetime);
- `internals`: the private parts of mitmproxy, h11 and h2 they (and hopmeter's delivery lane) read;
- `gate`: whether the installed mitmproxy, h11, h2 and Python are those they were read against.

`install()` (`hopmeter run` only, before its proxy starts) asks the gate and then puts the fast
paths' own methods in place of some of mitmproxy's (each module's `install` assigns the ones it
replaces; `installed()` says which stand in front now); `hopmeter run --no-relay` (or
`--set hopmeter_relay=false` at start) never calls it. `mend()` (`hopmeter run`, with the relay
or without it) asks the gate and installs `connections`; a plain mitmdump with hopmeter's addons
calls neither, and mitmproxy's classes stay as they are there. Each fast path fails closed: a
fault leaves the bytes to mitmproxy untouched, or ends the client's connection so that it can
tell (docs/reliability.md, "The relay").
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


def mend(on_error: OnError) -> str | None:
    """Install what mends mitmproxy rather than shortens its path (`connections`), with the
    relay or without it: None when installed, else the gate's line saying why not."""
    from hopmeter.proxy.fastpath import connections, gate  # noqa: PLC0415

    off = gate.check()
    if off is not None:
        return off
    connections.install(on_error)
    return None


def installed() -> list[str]:
    """The fast paths whose method stands in front of mitmproxy's now."""
    from hopmeter.proxy.fastpath import backpressure, connections, framing, relay  # noqa: PLC0415

    parts = (backpressure, framing, connections, relay)
    return [m.__name__.rsplit(".", 1)[1] for m in parts if m.installed()]


def uninstall() -> None:
    """Give mitmproxy all its own methods back (tests)."""
    from hopmeter.proxy.fastpath import backpressure, connections, framing, relay  # noqa: PLC0415

    backpressure.uninstall()
    framing.uninstall()
    connections.uninstall()
    relay.uninstall()
