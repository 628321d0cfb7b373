"""Every per-flow line a process writes, off its event loop: records, console lines, log lines.

An *output* (`records`, `console`, `log`) is a kind of line with its own bounded queue and its own
counts; a *destination* (a path, standard output, standard error) is one `Spool`, one writer
thread, shared by the outputs that write there, so that records on `-` and log lines on standard
output never interleave inside a line. `Outlets` is one process's set of them: what /metrics
reads (`states`), what SIGHUP reopens (`reopen`), what says a loss at most once a minute
(`report`), and what flushes at exit within a deadline (`close`).

Nothing here is process-wide: each `Outlets` is owned by whoever built it (the addons'
`OutputQueues`, `hopmeter join --serve`'s service).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hopmeter.export.spool import DEFAULT_QUEUE_BYTES, QUEUE_FULL, SHUTDOWN, Counts, Spool

STDOUT = "-"  # a target: standard output
STDERR = "stderr"  # a target: standard error (never a path: a file named so is "./stderr")
OUTPUTS = ("records", "console", "log")  # the `output` label: what kind of line was lost
# A loss is said at most this often (with the count since it was last said): under a stalled
# log reader, saying each loss would itself be a line per flow, lost too.
REPORT_EVERY_S = 60.0
# After the deadline, a line that says what was lost gets this much more time to go out.
SAY_GRACE_S = 0.5
# Threads not stuck in a write end within this after being abandoned (their files closed).
JOIN_S = 0.2
POLL_S = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputState:
    """What one output has written and lost so far, and what it holds now (for /metrics)."""

    output: str
    written: int
    lost: Mapping[str, int]  # reason -> lines: queue_full always, others once they happened
    queued_bytes: int


class Outlet:
    """One output's way into its destination: `put` a whole line, never waiting."""

    __slots__ = ("counts", "key", "output", "spool", "target")

    def __init__(self, output: str, target: str, key: str, spool: Spool, counts: Counts) -> None:
        self.output = output
        self.target = target
        self.key = key
        self.spool = spool
        self.counts = counts

    def put(self, line: bytes) -> None:
        """Queue one line ending in a newline; dropped and counted when its queue is full."""
        self.spool.put(self.counts, line)


class Outlets:
    """One process's outputs and the spools they write through."""

    def __init__(self, queue_bytes: int = DEFAULT_QUEUE_BYTES) -> None:
        self.queue_bytes = queue_bytes
        self.flush_by: float | None = None  # a drain's deadline: `close` flushes until then
        self._spools: dict[str, Spool] = {}
        self._users: dict[str, int] = {}
        self._retired: list[Spool] = []  # released spools still writing what they hold
        self._counts: dict[str, Counts] = {}
        self._said_lost: dict[tuple[str, str], int] = {}
        self._said_at: float | None = None
        self._said_reopen: dict[str, str | None] = {}
        self.closed = False

    def open(self, output: str, target: str) -> Outlet:
        """An outlet for `output` to `target` ("-" standard output, STDERR, else a path opened
        for appending now: OSError if it cannot be)."""
        key = _key(target)
        spool = self._spools.get(key)
        if spool is None:
            if target == STDOUT:
                spool = Spool(1)
            elif target == STDERR:
                spool = Spool(2)
            else:
                spool = Spool.open_path(target)
            self._spools[key] = spool
        self._users[key] = self._users.get(key, 0) + 1
        counts = self._counts.get(output)
        if counts is None:
            counts = self._counts[output] = Counts(output, self.queue_bytes)
        return Outlet(output, target, key, spool, counts)

    def release(self, outlet: Outlet) -> None:
        """An output stops writing there; a destination nobody writes to any more is finished
        (its writer writes what it holds, then closes it) without waiting for it."""
        left = self._users.get(outlet.key, 0) - 1
        if left > 0:
            self._users[outlet.key] = left
            return
        self._users.pop(outlet.key, None)
        spool = self._spools.pop(outlet.key, None)
        if spool is not None:
            spool.finish()
            self._retired = [s for s in self._retired if not s.wait(0)]
            self._retired.append(spool)

    def set_queue_bytes(self, limit: int) -> None:
        """Each output's bound, now and for outputs opened later."""
        self.queue_bytes = limit
        for counts in self._counts.values():
            counts.limit_bytes = limit

    def reopen(self) -> list[str]:
        """Open every file again at its path (after a rotation); the paths asked to."""
        return [s.path for s in self._spools.values() if s.reopen() and s.path is not None]

    def states(self) -> list[OutputState]:
        """Every output opened so far (read by the metrics endpoint's thread)."""
        out = []
        for counts in list(self._counts.values()):
            lost = {k: n for k, n in counts.lost.items() if n or k == QUEUE_FULL}
            out.append(
                OutputState(
                    output=counts.output,
                    written=counts.written,
                    lost=lost,
                    queued_bytes=counts.queued_bytes,
                )
            )
        return out

    def report(self, now: float) -> list[str]:
        """Lines to log now: the losses since they were last said (at most once every
        REPORT_EVERY_S), and any reopen that failed since the last look."""
        lines = []
        for key, spool in self._spools.items():
            error = spool.reopen_error
            if error != self._said_reopen.get(key):
                self._said_reopen[key] = error
                if error is not None:
                    lines.append(
                        f"hopmeter: ERROR cannot reopen {error}; still writing to the file "
                        f"opened before"
                    )
        if self._said_at is not None and now - self._said_at < REPORT_EVERY_S:
            return lines
        now_lost = {
            (c.output, reason): n for c in self._counts.values() for reason, n in c.lost.items()
        }
        new = {k: n - self._said_lost.get(k, 0) for k, n in now_lost.items()}
        new = {k: n for k, n in new.items() if n > 0}
        if not new:
            return lines
        since = "start" if self._said_at is None else f"{now - self._said_at:.0f}s ago"
        self._said_lost = now_lost
        self._said_at = now
        lines.append(
            f"hopmeter: WARNING outputs could not write every line (since {since}): "
            f"{_by_output(new)}; a full queue means its reader or disk is slower than the "
            f"traffic (hopmeter_output_lost_lines_total on /metrics)"
        )
        return lines

    def close(
        self,
        deadline: float,
        say: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> int:
        """Write what is queued until `deadline` (on `clock`), give up on the rest (counted
        `shutdown`), and `say` what was lost over the run if anything was; the lines given up.
        Once only: a second call does nothing."""
        if self.closed:
            return 0
        self.closed = True
        spools = [*self._spools.values(), *self._retired]
        _wait(lambda: all(s.drained() for s in spools), deadline, clock)
        lost = {
            (c.output, reason): n for c in self._counts.values() for reason, n in c.lost.items()
        }
        for c in self._counts.values():
            if c.queued_lines:
                lost[c.output, SHUTDOWN] += c.queued_lines
        lost = {k: n for k, n in lost.items() if n > 0}
        if lost and say is not None:
            why = ""
            if any(reason == SHUTDOWN for _, reason in lost):
                why = " (shutdown: still queued when the process had to stop)"
            say(
                f"hopmeter: ERROR outputs could not write every line over this run: "
                f"{_by_output(lost)}{why}"
            )
            _wait(lambda: all(s.drained() for s in spools), clock() + SAY_GRACE_S, clock)
        left = 0
        for spool in spools:
            spool.finish()
            left += spool.abandon()
        join_by = clock() + JOIN_S
        for spool in spools:
            spool.wait(join_by - clock())
        self._spools.clear()
        self._users.clear()
        self._retired = []
        return left


class LineLogHandler(logging.Handler):
    """A stdlib logging handler that puts each formatted record on an outlet (never writes)."""

    def __init__(self, outlet: Outlet, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.outlet = outlet

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.outlet.put(line.encode("utf-8", "replace") + b"\n")


def _key(target: str) -> str:
    if target in (STDOUT, STDERR):
        return target
    return os.path.abspath(target)


def _by_output(lost: Mapping[tuple[str, str], int]) -> str:
    """`records 12 lines (enospc 12), log 3 lines (queue_full 3)`."""
    outputs: dict[str, dict[str, int]] = {}
    for (output, reason), n in sorted(lost.items()):
        outputs.setdefault(output, {})[reason] = n
    return ", ".join(
        f"{output} {sum(reasons.values())} lines ("
        + ", ".join(f"{r} {n}" for r, n in reasons.items())
        + ")"
        for output, reasons in outputs.items()
    )


def _wait(done: Callable[[], bool], deadline: float, clock: Callable[[], float]) -> None:
    """Poll `done` until it holds or `deadline` passes (at exit, with nothing else to run)."""
    while not done() and clock() < deadline:
        time.sleep(POLL_S)
