"""The event loop `hopmeter run` runs on: asyncio's, or uvloop's with `--loop uvloop`.

The standard library's selector loop is the default, as mitmdump runs (declared with the flag, in
hopmeter.proxy.options.declared). uvloop (libuv, a well-kept library; installed on Linux and
macOS) spent ~18-25% fewer CPU instructions per streamed event while mitmproxy's layers moved
every body; with the relay moving the response bodies (hopmeter.proxy.fastpath) the two loops
cost the same CPU per event in bench/cost.py, and uvloop's extension module adds ~2 MiB to the
idle RSS (bench/README.md "cost", "idle memory"). Everything a record says is the same on both
loops, the client delivery lane included: hopmeter follows the client's bytes through
mitmproxy's `asyncio.StreamWriter`, which both loops use (hopmeter.proxy.delivery.conn).

mitmproxy runs with asyncio's eager task factory. uvloop 0.22 and newer call a task factory on
Python 3.13 with an `eager_start` keyword, which the factory of Python 3.13.0 does not take
(`TypeError` at the first task: `hopmeter run` did not start); `_Loop` gives such a factory the
call it was written for. Python 3.12 and later 3.13 releases never reach the adapter.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

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
            "--loop uvloop: uvloop is not installed; pip install uvloop (Linux and macOS), or "
            "run on --loop asyncio"
        ) from None
    return _uvloop_class(uvloop.Loop)


def takes_eager_start(factory: Callable[..., Any]) -> bool:
    """Whether a task factory can be called with the `eager_start` keyword."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): leave it as it is
        return True
    return any(p.name == "eager_start" or p.kind is p.VAR_KEYWORD for p in params)


def _uvloop_class(base: type[asyncio.AbstractEventLoop]) -> type[asyncio.AbstractEventLoop]:
    """uvloop's loop, with task factories that lack `eager_start` adapted (module doc)."""

    class _Loop(base):  # type: ignore[valid-type,misc]
        def set_task_factory(self, factory: Callable[..., Any] | None) -> None:
            if factory is not None and not takes_eager_start(factory):
                factory = _without_eager_start(factory)
            super().set_task_factory(factory)

    return _Loop


def _without_eager_start(factory: Callable[..., Any]) -> Callable[..., Any]:
    """`factory` called without an `eager_start` left at its default (None)."""

    def adapted(loop: Any, coro: Any, *, eager_start: bool | None = None, **kwargs: Any) -> Any:
        if eager_start is not None:  # asked for by a caller: only the factory can say no
            kwargs["eager_start"] = eager_start
        return factory(loop, coro, **kwargs)

    return adapted
