"""The addons' outputs, off the event loop: the owner of their `Outlets`, and the runner's log.

`OutputQueues` is an addon (in `hopmeter run` and in a user's own mitmdump alike): it owns the
outputs' queue bound (`hopmeter_output_queue`), says each loss at most once a minute through the
log, and at `done` writes what is queued until the drain's deadline (hopmeter.proxy.run.drain sets
it; else FLUSH_S), counting and saying what it could not. It touches nothing process-wide:
`hopmeter run`'s runner is what routes mitmproxy's log lines through it (`QueuedTermLog`) and
what turns SIGHUP into `reopen`.

Its clock (the losses' times, the flush deadline) and timers (the looks) are the constructor's
(hopmeter.clock); the flush deadline's clock must be the one the drain hands its deadline on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader
from mitmproxy.addons import termlog

from hopmeter.clock import MONOTONIC, Clock, Timers, sleep
from hopmeter.errors import UsageError
from hopmeter.export.outlets import STDOUT, Outlet, Outlets
from hopmeter.log import get_logger
from hopmeter.proxy import options

log = get_logger()

# How often the losses are looked at (they are said at most once a minute: REPORT_EVERY_S).
LOOK_EVERY_S = 1.0
# Without a drain's deadline (a user's mitmdump, an error at start), `done` writes what is queued
# for at most this long; a deadline passed already still gets FLUSH_FLOOR_S, so that the records
# of the flows a drain timeout ended have their chance (Kubernetes' timeline leaves 5 s for it,
# deploy/kubernetes/sidecar.yaml).
FLUSH_S = 5.0
FLUSH_FLOOR_S = 1.0


class OutputQueues:
    """Owns the outputs' `Outlets`: their bound, the loss reports, the flush at exit."""

    def __init__(self, *, clock: Clock = MONOTONIC, timers: Timers | None = None) -> None:
        self.outlets = Outlets()
        self.clock = clock
        self.timers = timers  # the looks at the losses; None: the running loop's
        self._task: asyncio.Task[None] | None = None

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.QUEUES)

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_output_queue" in updated:
            try:
                limit = options.read(ctx.options, "hopmeter_output_queue")
            except UsageError as exc:
                raise exceptions.OptionsError(str(exc)) from None
            self.outlets.set_queue_bytes(limit)

    def running(self) -> None:
        with contextlib.suppress(RuntimeError):  # no loop: nothing to report from
            self._task = asyncio.get_running_loop().create_task(self._look())

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.say_losses()
        now = self.clock()
        flush_by = self.outlets.flush_by
        deadline = now + FLUSH_S if flush_by is None else max(flush_by, now + FLUSH_FLOOR_S)
        self.outlets.close(deadline, say=log.error, clock=self.clock)

    def reopen(self) -> None:
        """Open every records file again at its path (SIGHUP or SIGUSR1, after a rotation);
        never stops."""
        paths = self.outlets.reopen()
        if paths:
            log.info(f"hopmeter: reopening {', '.join(paths)} (SIGHUP or SIGUSR1)")

    def say_losses(self) -> None:
        """Log the losses not said yet (at most once a minute) and any failed reopen."""
        for line in self.outlets.report(self.clock()):
            log.warning(line)

    async def _look(self) -> None:
        while True:
            await sleep(LOOK_EVERY_S, self.timers)
            self.say_losses()


class QueuedTermLogHandler(termlog.TermLogHandler):
    """mitmproxy's terminal log handler (its format, its colours on a terminal), whose lines go
    on an outlet instead of being printed: a log line never waits for standard output."""

    def __init__(self, outlet: Outlet) -> None:
        super().__init__(sys.stdout)  # for its formatter: colours when stdout is a terminal
        self.outlet = outlet

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.outlet.put(line.encode("utf-8", "replace") + b"\n")


class QueuedTermLog(termlog.TermLog):
    """mitmproxy's TermLog addon (its `termlog_verbosity` option) with `QueuedTermLogHandler`:
    what `hopmeter run`'s master logs through the `log` output, to standard output unless
    `target` says otherwise (STDERR when standard output carries the flows' JSON lines)."""

    def __init__(self, outlets: Outlets, target: str = STDOUT) -> None:  # not TermLog's
        self.logger = QueuedTermLogHandler(outlets.open("log", target))
        self.logger.install()
