"""The event loop `hopmeter run` runs on: asyncio's own, or uvloop's (`--loop`).

uvloop (libuv, a well-kept library) spends ~18% fewer CPU instructions per streamed event than
asyncio's selector loop under mitmproxy (callgrind, bench/README.md "cost"). Its transports are
compiled types without an instance dict, so hopmeter cannot follow the bytes written to the
client there (hopmeter.proxy.client_conn): under uvloop every record's delivery lane says "not
measured" with that reason. Everything else a record says is the same on both loops. asyncio
stays the default for that reason.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable

from hopmeter.core.vocab import EventLoop
from hopmeter.errors import UsageError


def loop_factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What `asyncio.run(..., loop_factory=)` takes for `loop` (None: asyncio's own)."""
    if loop is EventLoop.ASYNCIO:
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        raise UsageError(
            "--loop uvloop: uvloop is not installed; pip install 'hopmeter[fast]' (Linux and "
            "macOS), or run on --loop asyncio"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
