"""How hopmeter's listening sockets are opened: a deep accept queue, and SO_REUSEPORT for workers.

mitmproxy opens its listeners with `asyncio.start_server` and asyncio's default backlog, 100
connections. A burst of clients connecting at once (a batch job, every client reconnecting after
a deploy) can outrun it while the event loop is busy with streams already open; past the queue
the kernel drops the SYNs, and each dropped client waits a full second, TCP's initial
retransmission timeout, before it tries again. 200 streams opened together through hopmeter
overflowed it (bench/README.md, "What the runs say"). nginx listens with 511; hopmeter
asks for 4,096 and the kernel caps that at `net.core.somaxconn`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

LISTEN_BACKLOG = 4096

_start_server = asyncio.start_server  # asyncio's own, taken before tune_listeners replaces it


def tune_listeners(*, reuse_port: bool) -> None:
    """Make every TCP server this process starts from now on listen with `LISTEN_BACKLOG`, and
    bind with SO_REUSEPORT when `reuse_port` (a worker sharing its ports with the others)."""

    @functools.wraps(_start_server)
    async def start_server(*args: Any, **kwargs: Any) -> asyncio.Server:
        kwargs.setdefault("backlog", LISTEN_BACKLOG)
        if reuse_port:
            kwargs.setdefault("reuse_port", True)
        return await _start_server(*args, **kwargs)

    asyncio.start_server = start_server
