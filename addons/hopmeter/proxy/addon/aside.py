"""A link of a flow's end whose work for a long flow runs beside the loop, on a worker thread.

Building a record counts every event's tokens and computes the figures, the delivery summary and
the findings over every event: ~5 µs an event and ~0.3 µs a character of new text. On the loop
every stream shares, an 8,000-event reply's record held every other stream for 40-50 ms, and a
reply of long diverse text for 80-115 ms (bench/README.md, "The end of a long flow").

`Aside` runs that work on one worker thread for the flows whose record would take longer than
the worker could hold the loop (`big`: hopmeter.proxy.addon.ending's `_long`), in the order they
came, and hands each result back to the loop (`call_soon_threadsafe`), where the rest of the
chain goes on as one of hopmeter's timed steps. The worker holds the interpreter lock while it
computes, so the loop can still wait for it, but only as long as the interpreter's switch
interval (`sys.getswitchinterval`: 5 ms by default, 1 ms under `hopmeter run`), not the whole
record. A shorter flow's record is built at once on the loop, as before: the worker's share of
the lock could hold the loop longer than the record itself.

At most `max_waiting` flows wait for the worker (each holds what was measured of it); past that
a long flow's record is built on the loop, as before. With no running loop (offline tools,
tests) everything is built at once. `drain` (the proxy stops) waits for the worker and hands on
every result, in order. A failure in the work is counted under the link's site and stops that
flow there, as it does on the loop; the worker goes on with the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

# Flows waiting for the worker, at most: past this a long flow's record is built on the loop.
MAX_WAITING = 16
# The longest `drain` waits for the worker's next result (a record takes well under a second).
DRAIN_WAIT_S = 10.0

_Job = tuple[Any, Callable[[Any], None]]
_Done = tuple[Callable[[Any], None], Any, BaseException | None]


class Aside:
    """A chain link (`ending.Wait`) doing `fn(item)` on a worker thread when `big(item)`.

    The loop and the worker share two queues and nothing else: the loop never takes a lock the
    worker could hold (`queue.SimpleQueue.put` never waits)."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        *,
        big: Callable[[Any], bool],
        failed: Callable[[BaseException], None],
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self.fn = fn
        self.big = big
        self.failed = failed  # counts a failure of `fn` or of handing on (the item stops there)
        self.max_waiting = max_waiting
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()  # loop -> worker
        self._done: queue.SimpleQueue[_Done] = queue.SimpleQueue()  # worker -> loop
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waiting = 0  # sent to the worker, not yet handed on (read and written by the loop)
        self.aside = 0  # flows whose work ran on the worker (tests, the bench)

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        """Hand `fn(item)` to `then`: now, or from the worker once done (on the loop)."""
        if not self.big(item) or not self._send(item, then):
            then(self.fn(item))

    def _send(self, item: Any, then: Callable[[Any], None]) -> bool:
        """Queue `item` for the worker; False when it must be done here instead."""
        if self.waiting >= self.max_waiting:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop (offline tools, tests)
            return False
        if self._thread is None:
            thread = threading.Thread(target=self._work, name="hopmeter-records", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no thread can be started: the loop does the work
                return False
            self._thread = thread
        self._loop = loop
        self.waiting += 1
        self.aside += 1
        self._jobs.put((item, then))
        return True

    def _work(self) -> None:
        """The worker: each job's `fn` in order, its result handed back to the loop."""
        while True:
            item, then = self._jobs.get()
            result: Any = None
            error: BaseException | None = None
            try:
                result = self.fn(item)
            except Exception as exc:  # counted on the loop; the worker goes on
                error = exc
            del item
            self._done.put((then, result, error))
            loop = self._loop
            if loop is not None:
                # a loop that closed meanwhile has no one to hand on to: `drain` does it
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._hand_on)

    def _hand_on(self) -> None:
        """On the loop: hand on every result done so far, in order."""
        while True:
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return
            self._finish(done)

    def _finish(self, done: _Done) -> None:
        then, result, error = done
        self.waiting -= 1
        if error is not None:
            self.failed(error)
            return
        try:
            then(result)
        except Exception as exc:
            self.failed(exc)

    def drain(self) -> None:
        """Wait for the worker's jobs (the proxy stops), then hand on every result, in order;
        what it has not done within DRAIN_WAIT_S is counted as failed."""
        while self.waiting:
            try:
                done = self._done.get(timeout=DRAIN_WAIT_S)
            except queue.Empty:
                for _ in range(self.waiting):
                    self.failed(TimeoutError(f"no record within {DRAIN_WAIT_S:g} s of stopping"))
                self.waiting = 0
                return
            self._finish(done)
