"""A bounded queue of finished lines and the thread that writes them to one file or stream.

The event loop hands a whole line to `Spool.put` and goes on: the call appends to a queue under a
lock held for a few instructions, never for a write. A writer thread (one per destination) takes
the lines in order, a batch of whole lines per write(2), so a stalled pipe, a slow disk or an NFS
hiccup holds that thread, never a stream. What cannot be written is counted per output and
reason (`Counts.lost`), never said once and forgotten:

- a line that would take an output's queue past its bound is dropped: `queue_full` while the
  destination is only slow (a reader that stalls), or the reason of its last failed write while
  it fails (`enospc`: the disk is full);
- a write that fails loses the lines of its batch it did not write, under the error's reason
  (`enospc`, `epipe`, `eio`, ...); the writer tries again after a pause (FIRST_RETRY_S, doubling
  to MAX_RETRY_S), so a disk that frees up is written again without a restart;
- a line torn by a short write before the error is cut off a regular file again (when nothing was
  appended after it), so readers never see half a record;
- lines still queued when the process must exit are `shutdown`.

`reopen` (SIGHUP, after a rotation) makes the writer open the same path again and write there
from the next batch: each line lands in exactly one of the two files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

# An output's queue holds at most this many bytes of lines unless told otherwise
# (`hopmeter_output_queue`): ~8 s of records at 500 flows/s of ~2 KiB each, the length of a disk
# or log agent's hiccup worth riding out; a stalled output costs at most this much memory.
DEFAULT_QUEUE_BYTES = 8 * 1024 * 1024
# Lines go out in batches of at most this many bytes (at least one line), each in one write(2):
# few syscalls under load, and a batch of whole lines is one append, whole, next to another
# process appending to the same file (`--workers`). A pipe's default capacity (64 KiB): a write
# into a stalled pipe blocks with at most this much of it unknown (counted `shutdown` if the
# process must exit then).
BATCH_BYTES = 64 * 1024
# Once woken by a line, the writer waits this long for more before it writes: under load one
# wake-up (a context switch onto the loop's core) and one write carry many lines, not one each
# (a soak of 5-event flows, each a record and a console line, paid ~+5% CPU per flow for a
# wake-up per line). A line reaches its file at most this much later; an idle writer sleeps.
LINGER_S = 0.01
# After a failed write the writer waits this long before trying again, doubling up to the most:
# a full disk costs a failed write a second, and records flow again within a second of space.
FIRST_RETRY_S = 0.05
MAX_RETRY_S = 1.0
# How long one wait for a non-blocking descriptor to take more lasts before the writer looks
# whether it has been abandoned.
WRITABLE_POLL_S = 0.5
OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC

QUEUE_FULL = "queue_full"
SHUTDOWN = "shutdown"
OTHER_ERROR = "error"
# errno -> the reason a lost line is counted under; any other error is OTHER_ERROR. A fixed
# table keeps the `reason` label bounded.
ERRNO_REASONS: Mapping[int, str] = {
    errno.ENOSPC: "enospc",
    errno.EDQUOT: "edquot",
    errno.EFBIG: "efbig",
    errno.EIO: "eio",
    errno.EPIPE: "epipe",
    errno.ECONNRESET: "econnreset",
    errno.EBADF: "ebadf",
    errno.EROFS: "erofs",
    errno.EACCES: "eacces",
    errno.EPERM: "eperm",
    errno.ESTALE: "estale",
}
REASONS = (QUEUE_FULL, *ERRNO_REASONS.values(), OTHER_ERROR, SHUTDOWN)


def reason_of(exc: OSError) -> str:
    """The `reason` label of a failed write."""
    return ERRNO_REASONS.get(exc.errno or 0, OTHER_ERROR)


@dataclass(slots=True)
class Counts:
    """One output's lines: its bound, what it has queued now, written and lost so far.

    Changed under its spool's lock; read without it (a scrape reads plain ints, and `lost` never
    changes size: every reason is there from the start).
    """

    output: str
    limit_bytes: int
    queued_bytes: int = 0
    queued_lines: int = 0
    written: int = 0
    lost: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))

    def lost_total(self) -> int:
        """Lines lost, every reason."""
        return sum(self.lost.values())


class Spool:
    """One destination (a file descriptor, reopenable by path), its queue and its writer."""

    def __init__(self, fd: int, *, path: str | None = None, owned: bool = False) -> None:
        self.path = path  # reopened at this path on `reopen`; None: a standard stream
        self.owned = owned  # the writer closes the descriptor when done
        self._fd = fd  # the writer's once started: only its thread uses it
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[tuple[Counts, bytes]] = deque()
        self._in_flight: list[tuple[Counts, bytes]] = []
        self._idle = False  # the writer waits for lines: a put wakes it
        self._reopen = False
        self._finishing = False
        self._abandoned = False
        self._torn = False  # the last write left half a line that could not be cut off
        self._broken = False  # the writer died of a bug: every line from now on is lost
        self.failing: str | None = None  # reason of the last failed write, until one succeeds
        self.reopens = 0
        self.reopen_error: str | None = None  # why the last reopen failed (the old file is kept)
        self._thread = threading.Thread(
            target=self._run, name=f"hopmeter-spool-{path or fd}", daemon=True
        )
        self._thread.start()

    @classmethod
    def open_path(cls, path: str) -> Spool:
        """A spool appending to `path` (created if missing); OSError if it cannot be opened."""
        return cls(os.open(path, OPEN_FLAGS, 0o666), path=path, owned=True)

    # --- the loop's side: none of these waits for a write -----------------------------------
    def put(self, counts: Counts, line: bytes) -> bool:
        """Queue one whole line (ending in a newline) for `counts`' output; False when dropped
        (counted)."""
        size = len(line)
        with self._lock:
            if self._broken:
                counts.lost[OTHER_ERROR] += 1
                return False
            if self._finishing or self._abandoned:
                counts.lost[SHUTDOWN] += 1
                return False
            if counts.queued_bytes + size > counts.limit_bytes:
                counts.lost[self.failing or QUEUE_FULL] += 1
                return False
            counts.queued_bytes += size
            counts.queued_lines += 1
            self._queue.append((counts, line))
            if self._idle:
                self._wake.notify()
        return True

    def reopen(self) -> bool:
        """Ask the writer to open the path again before its next batch; False for a stream."""
        if self.path is None:
            return False
        with self._lock:
            self._reopen = True
            self._wake.notify_all()
        return True

    def finish(self) -> None:
        """Take no more lines; the writer writes what is queued, closes what it owns and ends."""
        with self._lock:
            self._finishing = True
            self._wake.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the writer to end (after `finish`); whether it did."""
        self._thread.join(max(0.0, timeout_s))
        return not self._thread.is_alive()

    def drained(self) -> bool:
        """Nothing queued and nothing being written."""
        with self._lock:
            return not self._queue and not self._in_flight

    def abandon(self) -> int:
        """Give up on every line not written yet (counted `shutdown`); how many there were.

        The writer may be stuck in a write that never returns (a pipe nobody reads): it is a
        daemon thread, and what it was writing is counted here, not when the write returns.
        """
        with self._lock:
            if self._abandoned:
                return 0
            self._abandoned = True
            left = [*self._in_flight, *self._queue]
            for counts, line in left:
                counts.queued_bytes -= len(line)
                counts.queued_lines -= 1
                counts.lost[SHUTDOWN] += 1
            self._in_flight = []
            self._queue.clear()
            self._wake.notify_all()
        return len(left)

    # --- the writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except Exception:  # a bug here must not leave lines queued for ever, uncounted
            with self._lock:
                self._broken = True
                for counts, line in [*self._in_flight, *self._queue]:
                    counts.queued_bytes -= len(line)
                    counts.queued_lines -= 1
                    counts.lost[OTHER_ERROR] += 1
                self._in_flight = []
                self._queue.clear()
        finally:
            if self.owned:
                with contextlib.suppress(OSError):
                    os.close(self._fd)

    def _serve(self) -> None:
        pause = 0.0
        while True:
            with self._lock:
                if pause:  # after a failed write; a reopen, finish or abandon ends it early
                    self._wake.wait(pause)
                if not (self._queue or self._reopen or self._finishing or self._abandoned):
                    while not (self._queue or self._reopen or self._finishing or self._abandoned):
                        self._idle = True
                        self._wake.wait()
                        self._idle = False
                    if not (self._reopen or self._finishing or self._abandoned):
                        self._wake.wait(LINGER_S)  # more lines come meanwhile, without a wake-up
                if self._abandoned:
                    return
                reopen, self._reopen = self._reopen, False
                if not self._queue and not reopen:
                    return  # finishing, and everything is written
                batch = self._take()
            if reopen:
                self._reopen_path()
            if batch:
                ok = self._write(batch)
                pause = 0.0 if ok else min(max(pause * 2, FIRST_RETRY_S), MAX_RETRY_S)

    def _take(self) -> list[tuple[Counts, bytes]]:
        """The next batch of whole lines (under the lock): kept as in flight until written."""
        batch: list[tuple[Counts, bytes]] = []
        size = 0
        queue = self._queue
        while queue and (not batch or size + len(queue[0][1]) <= BATCH_BYTES):
            item = queue.popleft()
            size += len(item[1])
            batch.append(item)
        self._in_flight = batch
        return batch

    def _write(self, batch: list[tuple[Counts, bytes]]) -> bool:
        """Write one batch; count each line written or lost; whether every line went out."""
        data = b"".join(line for _, line in batch)
        if self._torn:  # end the half line a failed write left, so the next line starts anew
            data = b"\n" + data
        lead = len(data) - sum(len(line) for _, line in batch)
        view = memoryview(data)
        done = 0
        error: OSError | None = None
        try:
            while done < len(data):
                try:
                    done += os.write(self._fd, view[done:])
                except BlockingIOError:  # a non-blocking descriptor another process shares
                    if not self._wait_writable():
                        break
        except OSError as exc:
            error = exc
        if done >= lead:
            self._torn = False
        kept = done - lead
        if error is not None and kept > 0:
            kept = self._cut_torn(batch, kept)
        with self._lock:
            if self._abandoned:
                return error is None  # counted by abandon()
            reason = reason_of(error) if error is not None else SHUTDOWN
            end = 0
            for counts, line in batch:
                end += len(line)
                counts.queued_bytes -= len(line)
                counts.queued_lines -= 1
                if end <= kept:
                    counts.written += 1
                else:
                    counts.lost[reason] += 1
            self._in_flight = []
            self.failing = reason if error is not None else None
        return error is None

    def _cut_torn(self, batch: list[tuple[Counts, bytes]], kept: int) -> int:
        """After a short write and an error: remove the half line at the end of a regular file
        (unless another writer appended since); the bytes of whole lines written."""
        whole = 0
        for _, line in batch:
            if whole + len(line) > kept:
                break
            whole += len(line)
        torn = kept - whole
        if not torn:
            return whole
        try:
            info = os.fstat(self._fd)
            end = os.lseek(self._fd, 0, os.SEEK_CUR)
            if stat.S_ISREG(info.st_mode) and info.st_size == end:
                os.ftruncate(self._fd, end - torn)
                os.lseek(self._fd, end - torn, os.SEEK_SET)  # for a descriptor without O_APPEND
                return whole
        except OSError:
            pass
        self._torn = True  # a pipe, or a file another writer appended to: end the line later
        return whole

    def _wait_writable(self) -> bool:
        """Wait until the descriptor takes more bytes; False once abandoned."""
        while not self._abandoned:
            _, ready, _ = select.select([], [self._fd], [], WRITABLE_POLL_S)
            if ready:
                return True
        return False

    def _reopen_path(self) -> None:
        """Open the path again and write there from now on; on failure keep the old file."""
        assert self.path is not None
        try:
            fd = os.open(self.path, OPEN_FLAGS, 0o666)
        except OSError as exc:
            self.reopen_error = f"{self.path}: {exc.strerror}"
            return
        old, self._fd = self._fd, fd
        with contextlib.suppress(OSError):
            os.close(old)
        self._torn = False
        self.reopens += 1
        self.reopen_error = None
