"""`--lazy-tokenizer`: the default tokenizer made when the first flow starts, off the loop.

By default `hopmeter run` maps the default encoding's rank table (hopmeter.core.bpe) at
start-up, which costs ~1 ms and no memory until counting touches its pages, or ~0.35 s the first
time on a host, when the table is built into the cache. With the option
(`hopmeter_lazy_tokenizer`) that happens only when the first flow starts, in a worker thread.
It was the way to idle without tiktoken's ~47 MiB encoder, whose build held the GIL for
0.2-1 s; the table made it unnecessary, and the option is kept for the deployments that set it.
The thread still waits for a moment when no flow is in flight before it loads
(`QUIET_WAIT_MAX_S`), as it did for that build.
Tokens are counted only when a record is built, so a flow that ends before the tokenizer is
ready has its record built later, unchanged: everything the record says was taken when the flow
ended; only the counting and what follows it (pairing, outputs, metrics) wait, in the order the
flows ended, one per loop turn (`Vocabulary` is that wait in a flow's end,
hopmeter.proxy.addon.ending; without the option it lets every record through at once). A
`--tokenizer` named on the command line is loaded at start-up (it is checked there). Under
steady traffic records (and the metrics made from them) can come up to `QUIET_WAIT_MAX_S` late,
and a beacon may come before its record.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from hopmeter.proxy.addon import tokenizers
from hopmeter.proxy.addon.tokenizers import Counters

# Longest the loading thread waits for no flow to be in flight before loading anyway: under
# steady traffic there may never be such a moment, and records wait meanwhile. (Chosen for
# tiktoken's build, which paused every stream in flight; a table's build does not.)
QUIET_WAIT_MAX_S = 60.0
QUIET_POLL_S = 0.01
# Records waiting for the vocabulary, at most: each holds its flow and what was measured of it
# (~30-60 KiB at a few hundred events: ~15 MiB at most). Past this the loop waits for the load
# instead (the pause the thread avoids), so memory stays bounded under steady traffic.
MAX_PARKED = 256


def wait_for_quiet(quiet: Callable[[], bool], max_s: float = QUIET_WAIT_MAX_S) -> None:
    """Sleep in this (non-loop) thread until `quiet()` or for `max_s`, whichever comes first."""
    deadline = time.monotonic() + max_s
    while not quiet() and time.monotonic() < deadline:
        time.sleep(QUIET_POLL_S)


class Vocabulary:
    """The tokenizers records count with and, with `hopmeter_lazy_tokenizer`, the wait of a
    flow's end for their default vocabulary (a `TokenizerLoad`); without it, no wait."""

    def __init__(
        self, quiet: Callable[[], bool], on_error: Callable[[str, Exception], None]
    ) -> None:
        self.counters: Counters | None = None  # set by the addon's configure, before any flow
        self.load: TokenizerLoad | None = None
        self.quiet = quiet  # True while no flow is in flight
        self.on_error = on_error

    def use(self, counters: Counters, *, lazy: bool) -> None:
        """Count with `counters` from now on (the records waiting for the old ones first)."""
        self.drain()
        self.counters = counters
        self.load = TokenizerLoad(counters, self.quiet, self.on_error) if lazy else None

    def preload(self) -> None:
        """Load the default vocabulary now, unless it is to be loaded at the first flow."""
        if self.counters is not None and self.load is None:
            self.counters.preload()

    def flow_started(self) -> None:
        """A flow started: the lazy load begins (once; at once after the first time)."""
        if self.load is not None:
            self.load.start()

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        """Hand `item` on now, or once the vocabulary is loaded (TokenizerLoad.take)."""
        if self.load is None:
            then(item)
        else:
            self.load.take(item, then)

    def drain(self) -> None:
        """Wait for the load here and hand on every waiting item (stopping, or a new tokenizer)."""
        if self.load is not None:
            self.load.drain()


class TokenizerLoad:
    """Starts the load at the first flow; hands on each record's item once the load is done."""

    def __init__(
        self,
        counters: Counters,
        quiet: Callable[[], bool],
        on_error: Callable[[str, Exception], None],
        max_parked: int = MAX_PARKED,
    ) -> None:
        self.counters = counters
        self.max_parked = max_parked
        self.quiet = quiet  # True while no flow is in flight (read from the loading thread)
        self.on_error = on_error
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._parked: deque[Callable[[], None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hurry = False  # the loop waits for the load: build at once

    @property
    def ready(self) -> bool:
        """Whether the default vocabulary is loaded (or failed to: the estimate counts then)."""
        return self._ready.is_set()

    @property
    def parked(self) -> int:
        """Completions waiting for the vocabulary."""
        return len(self._parked)

    def start(self) -> None:
        """Start loading in a worker thread, once; from the loop (it is called back there)."""
        if self._thread is not None or self.ready:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (offline tools, tests): load now, in this thread
            self.drain()
            return
        self._thread = threading.Thread(target=self._load, name="hopmeter-tokenizer", daemon=True)
        self._thread.start()

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        """Hand `item` to `then` now if the vocabulary is ready and nothing waits, else after
        those; past `max_parked` waiting, the loop waits for the load (drain) instead."""
        if self.ready and not self._parked:
            then(item)
            return
        if len(self._parked) >= self.max_parked:
            self.drain()
            then(item)
            return
        self._parked.append(partial(then, item))
        self.start()

    def drain(self) -> None:
        """Wait for the load here, then hand on every waiting item (stopping, or a flood)."""
        if not self._parked:
            return  # nothing waits: a load under way goes on in its thread
        if not self.ready:
            self._hurry = True
            if self._thread is None:
                self._load()
            else:
                self._thread.join()
        while self._parked:
            self._run_one()

    def _load(self) -> None:
        tokenizers.BUILD_GATE.wait = self._wait_quiet  # this thread's own (a threading.local)
        try:
            self.counters.for_model(None)
        except Exception as exc:  # make_counter falls back itself; this is a bug: say so
            self.on_error("tokenizer", exc)
        finally:
            self._ready.set()
            if self._loop is not None and threading.current_thread() is self._thread:
                with contextlib.suppress(RuntimeError):  # the loop closed: drain() runs them
                    self._loop.call_soon_threadsafe(self._next)

    def _wait_quiet(self) -> None:
        wait_for_quiet(lambda: self._hurry or self.quiet())

    def _next(self) -> None:
        """Run the oldest waiting completion, and the next on the following loop turn."""
        if not self._parked:
            return
        self._run_one()
        if self._parked:
            asyncio.get_running_loop().call_soon(self._next)

    def _run_one(self) -> None:
        complete = self._parked.popleft()
        try:
            complete()
        except Exception as exc:  # the completion guards itself; this is the last line
            self.on_error("finish", exc)
