"""The event loop `hopmeter run` runs on: uvloop's where it is installed, else asyncio's (`--loop`).

uvloop (libuv, a well-kept library; a dependency on Linux and macOS) spends ~18-25% fewer CPU
instructions per streamed event than asyncio's selector loop under mitmproxy (callgrind,
bench/README.md "cost"), so it is the default where it is installed. Everything a record says is
the same on both loops, the client delivery lane included: hopmeter follows the client's bytes
through mitmproxy's `asyncio.StreamWriter`, which both loops use (hopmeter.proxy.client_conn).
Windows has no uvloop: there, and with `--loop asyncio`, the standard library's loop runs.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Callable

from hopmeter.core.vocab import EventLoop
from hopmeter.errors import UsageError


def default_loop() -> EventLoop:
    """uvloop where it is installed, else asyncio."""
    return EventLoop.UVLOOP if importlib.util.find_spec("uvloop") is not None else EventLoop.ASYNCIO


def loop_factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What `asyncio.run(..., loop_factory=)` takes for `loop` (None: asyncio's own)."""
    if loop is EventLoop.ASYNCIO:
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        raise UsageError(
            "--loop uvloop: uvloop is not installed; pip install uvloop (Linux and macOS), or "
            "run on --loop asyncio"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
