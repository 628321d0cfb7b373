"""`hopmeter run`'s shortcut through mitmproxy's backpressure step, taken after every read.

After each read, mitmproxy's `ConnectionHandler` awaits `drain_writers()`: under a lock it awaits
`StreamWriter.drain()` on every connection of the client's context, so that it reads no more
while a peer cannot take what was written. Nearly always no writer is paused and every drain
returns at once; the lock and the awaits still cost 10-13 kIr per streamed event, ~3% of
`hopmeter run`'s instructions (bench/README.md, callgrind). `install()` puts a method in front
of mitmproxy's that first asks, without awaiting, whether any drain could wait or raise, by the
conditions `StreamWriter.drain` checks itself (the reader's exception, a closing transport, a
lost or paused protocol); only then, or while another drain holds the lock, or for a writer that
is not an asyncio StreamWriter (mitmproxy_rs streams), does mitmproxy's own method run. So a
slow client still stops the reads from its upstream exactly as before
(tests/proxy/fastpath/test_backpressure.py and the slow-client test of the real proxy).

A fault in the shortcut's check (a bug, an asyncio whose writers changed) sends the step to
mitmproxy's own method, which then waits as it always did; the fault is counted and logged
(`on_error`). The check only reads: there is nothing to undo.

The drain step was also where a cancelled read loop usually heard its cancel; without its
awaits nearly every cancel lands in mitmproxy's `server_event`, past which mitmproxy's read loop
does not close its connection: `hopmeter.proxy.fastpath.connections` makes that end sure (with
the shortcut or without it).

It changes a class of the interpreter's mitmproxy, so only `hopmeter run` installs it
(hopmeter.proxy.fastpath); the addons a user loads into a plain mitmdump leave mitmproxy as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from hopmeter.proxy.fastpath.internals import ConnectionHandler

OnError = Callable[[str, BaseException], None]
Drain = Callable[[ConnectionHandler], Coroutine[Any, Any, None]]

_MITMPROXY_DRAIN: Drain = ConnectionHandler.drain_writers
_STREAM_WRITER = asyncio.StreamWriter


def may_wait(writer: Any) -> bool:
    """Whether `writer.drain()` could do anything but return at once: wait, yield or raise.

    Reads asyncio's own state of the writer (private names, as of Python 3.12-3.14); a writer
    that lacks any of them is treated as one that may wait. `needs_drain` reads the same inline.
    """
    if type(writer) is not asyncio.StreamWriter:
        return True
    try:
        reader = writer._reader  # type: ignore[attr-defined]
        protocol = writer._protocol  # type: ignore[attr-defined]
        if reader is not None and reader._exception is not None:  # reader.exception()
            return True
        return bool(
            writer._transport.is_closing()  # type: ignore[attr-defined]  # writer.transport
            or protocol._connection_lost
            or protocol._paused
        )
    except AttributeError:
        return True


def needs_drain(handler: ConnectionHandler) -> bool:
    """Whether mitmproxy's drain step for `handler` could do anything but return at once: one of
    its writers may wait, another drain holds the lock, or the lock is not where it was read."""
    lock = getattr(handler, "_drain_lock", None)  # mitmproxy's, private: absent = the slow path
    if lock is None or lock.locked():
        return True
    # may_wait(writer) for each writer, inlined: this runs after every read of every connection,
    # and nearly always reads four attributes per writer and finds nothing that could wait
    for io in handler.transports.values():
        writer = io.writer
        if writer is None:
            continue
        if type(writer) is not _STREAM_WRITER:
            return True
        try:
            reader = writer._reader  # type: ignore[attr-defined]
            protocol = writer._protocol  # type: ignore[attr-defined]
            if (
                (reader is not None and reader._exception is not None)
                or writer._transport.is_closing()  # type: ignore[attr-defined]
                or protocol._connection_lost
                or protocol._paused
            ):
                return True
        except AttributeError:
            return True
    return False


def make_drain_writers(on_error: OnError) -> Drain:
    """mitmproxy's `drain_writers`, run only when one of the writers could need it (or when the
    check fails: then it runs, and the fault goes to `on_error`)."""

    async def drain_writers(self: ConnectionHandler) -> None:
        try:
            needed = needs_drain(self)
        except Exception as exc:  # mitmproxy's own step decides, as without the shortcut
            on_error("backpressure", exc)
            needed = True
        if needed:
            await _MITMPROXY_DRAIN(self)

    return drain_writers


def install(on_error: OnError) -> None:
    """Put the shortcut in front of mitmproxy's method (`hopmeter run` only)."""
    ConnectionHandler.drain_writers = make_drain_writers(on_error)  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `drain_writers` is not mitmproxy's own."""
    return ConnectionHandler.drain_writers is not _MITMPROXY_DRAIN


def uninstall() -> None:
    """mitmproxy's own methods again (tests)."""
    ConnectionHandler.drain_writers = _MITMPROXY_DRAIN  # type: ignore[method-assign]
