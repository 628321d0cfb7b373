"""Tests for hopmeter.export.spool: lines queued without waiting, written whole and in order by a
thread, dropped and counted when the queue is full or a write fails, written again once the
destination recovers, and written to a new file after a reopen. Real descriptors throughout:
pipes nobody reads, /dev/full, a tmpfs that fills up."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hopmeter.export.spool import QUEUE_FULL, SHUTDOWN, Counts, Spool
from tests.harness.devices import small_tmpfs
from tests.harness.procs import wait_for

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ on Linux (Python 3.10+ names it; mypy's stubs may not)


def line(n: int, size: int = 100) -> bytes:
    """A line of `size` bytes carrying its number."""
    head = f'{{"n":{n},"pad":"'.encode()
    return head + b"x" * (size - len(head) - 3) + b'"}\n'


def numbers(data: bytes) -> list[int]:
    """The numbers of the whole lines in `data` (a torn line would fail to parse)."""
    return [int(ln.split(b",")[0].removeprefix(b'{"n":')) for ln in data.splitlines()]


@pytest.fixture
def stalled_pipe() -> Iterator[tuple[int, int]]:
    """(read end, write end) of a one-page pipe that nobody reads until the test does."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


def read_all(fd: int, until: int) -> bytes:
    """Read a pipe until `until` lines have come (the writer keeps writing meanwhile)."""
    data = b""
    deadline = time.monotonic() + 10
    while data.count(b"\n") < until and time.monotonic() < deadline:
        data += os.read(fd, 65536)
    return data


def test_lines_are_written_whole_and_in_order_to_a_file(tmp_path: Path) -> None:
    """Lines of two outputs sharing a destination reach it in the order they were put, each
    whole, each output counting its own."""
    path = tmp_path / "out.jsonl"
    spool = Spool.open_path(str(path))
    records, log = Counts("records", 1 << 20), Counts("log", 1 << 20)
    for n in range(200):
        assert spool.put(records if n % 3 else log, line(n))
    spool.finish()
    assert spool.wait(10)
    assert numbers(path.read_bytes()) == list(range(200))
    assert (records.written, log.written) == (133, 67)
    assert records.queued_bytes == log.queued_bytes == 0


def test_a_stalled_reader_costs_lines_not_waits(stalled_pipe: tuple[int, int]) -> None:
    """With nobody reading, put returns at once; past the queue's bound lines are dropped as
    queue_full; once the reader reads again what was queued arrives, in order, and new lines
    are written again."""
    r, w = stalled_pipe
    spool = Spool(w)
    counts = Counts("records", 2000)
    # the pipe holds ~40 lines: a put that waited for room would never return (the suite's
    # per-test timeout fails it)
    accepted = [n for n in range(1000) if spool.put(counts, line(n))]
    assert counts.lost[QUEUE_FULL] == 1000 - len(accepted) > 900
    assert counts.queued_bytes <= 2000
    got = numbers(read_all(r, len(accepted)))
    assert got == accepted  # every line queued arrives, in order
    wait_for(lambda: counts.queued_bytes == 0, what="the queue to empty")
    assert spool.put(counts, line(5000))
    assert numbers(read_all(r, 1)) == [5000]
    spool.finish()
    assert spool.wait(10)
    assert counts.written == len(accepted) + 1


def test_a_full_device_loses_lines_under_its_errno() -> None:
    """/dev/full: each write fails with ENOSPC; its lines are counted `enospc`, and while it
    fails, lines dropped at a full queue are counted `enospc` too, not `queue_full`."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    spool = Spool.open_path("/dev/full")
    counts = Counts("records", 300)
    assert spool.put(counts, line(0))
    wait_for(lambda: spool.failing == "enospc", what="the first write to fail")
    for n in range(1, 50):
        spool.put(counts, line(n))
    spool.finish()
    assert spool.abandon() >= 0
    assert counts.written == 0 and counts.lost[QUEUE_FULL] == 0
    assert counts.lost["enospc"] + counts.lost[SHUTDOWN] == 50
    assert counts.lost["enospc"] > 40


@pytest.mark.integration
def test_a_full_disk_keeps_only_whole_lines_and_is_written_again_once_freed(
    tmp_path: Path,
) -> None:
    """On a tmpfs that fills up, what was written is whole lines only (a line torn by a short
    write is cut off again), every line is either written or counted lost, and once space is
    freed the same file is written again, without a reopen."""
    with small_tmpfs(tmp_path / "disk", 64) as disk:
        filler = disk / "filler"
        filler.write_bytes(b"\0" * 32 * 1024)  # half the disk, freed later
        path = disk / "records.jsonl"
        spool = Spool.open_path(str(path))
        counts = Counts("records", 1 << 20)
        for n in range(1000):  # 1000 lines of 100 bytes: more than the 32 KiB left
            spool.put(counts, line(n))
        wait_for(lambda: counts.queued_bytes == 0, what="every line written or lost")
        written = numbers(path.read_bytes())
        assert written == list(range(len(written)))
        assert counts.written == len(written) > 0
        assert counts.lost["enospc"] == 1000 - len(written) > 0
        assert len(path.read_bytes()) == 100 * len(written)  # no half line at the end
        filler.unlink()
        assert spool.put(counts, line(3000))
        wait_for(lambda: counts.written > len(written), what="a write after space was freed")
        spool.finish()
        assert spool.wait(10)
        assert numbers(path.read_bytes()) == [*written, 3000]


def test_reopen_writes_the_next_lines_to_a_new_file_at_the_path(tmp_path: Path) -> None:
    """After the file is moved away, reopen makes the writer create it again at its path: the
    lines before are in the moved file, the lines after in the new one, each exactly once."""
    path = tmp_path / "records.jsonl"
    spool = Spool.open_path(str(path))
    counts = Counts("records", 1 << 20)
    for n in range(10):
        spool.put(counts, line(n))
    wait_for(lambda: counts.written == 10, what="the first lines")
    path.rename(tmp_path / "records.jsonl.1")
    assert spool.reopen()
    for n in range(10, 20):
        spool.put(counts, line(n))
    spool.finish()
    assert spool.wait(10)
    old, new = numbers((tmp_path / "records.jsonl.1").read_bytes()), numbers(path.read_bytes())
    assert sorted(old + new) == list(range(20))
    assert new and old[:10] == list(range(10))
    assert spool.reopens == 1 and spool.reopen_error is None


def test_a_reopen_that_fails_keeps_the_file_it_had(tmp_path: Path) -> None:
    """When the path cannot be opened again (its folder is gone), the writer says why and goes on
    writing to the file it had open; a standard stream has no path and is not reopened."""
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "records.jsonl"
    spool = Spool.open_path(str(path))
    counts = Counts("records", 1 << 20)
    moved = tmp_path / "moved"
    folder.rename(moved)
    assert spool.reopen()
    spool.put(counts, line(1))
    spool.finish()
    assert spool.wait(10)
    assert spool.reopen_error == f"{path}: No such file or directory"
    assert numbers((moved / "records.jsonl").read_bytes()) == [1]
    assert counts.written == 1
    r, w = os.pipe()
    stream = Spool(w)
    assert not stream.reopen()
    stream.finish()
    assert stream.wait(10)
    os.close(r)
    os.close(w)


def test_a_reader_gone_is_counted_epipe_and_never_raised() -> None:
    """A pipe whose reader closed: every line is lost `epipe`, nothing raises, and the writer
    keeps trying (a closed stdout never stops the process)."""
    r, w = os.pipe()
    os.close(r)
    spool = Spool(w)
    counts = Counts("log", 1 << 20)
    spool.put(counts, line(1))
    wait_for(lambda: counts.lost["epipe"] == 1, what="the failed write")
    spool.put(counts, line(2))
    wait_for(lambda: counts.lost["epipe"] == 2, what="the retry")
    spool.finish()
    assert spool.wait(10)
    os.close(w)


def test_a_non_blocking_descriptor_is_waited_on_by_the_writer(
    stalled_pipe: tuple[int, int],
) -> None:
    """A descriptor set non-blocking by someone else (EAGAIN when full) loses nothing: the
    writer waits until it takes more."""
    r, w = stalled_pipe
    os.set_blocking(w, False)
    spool = Spool(w)
    counts = Counts("records", 1 << 20)
    for n in range(300):  # ~30 KiB into a 4 KiB pipe
        spool.put(counts, line(n))
    assert numbers(read_all(r, 300)) == list(range(300))
    spool.finish()
    assert spool.wait(10)
    assert counts.written == 300 and counts.lost_total() == 0


def test_abandon_counts_what_could_not_be_written_as_shutdown(
    stalled_pipe: tuple[int, int],
) -> None:
    """Giving up on a stalled destination counts every line not written (the one in a write
    that never returns included) as `shutdown`, and so does a line put after finishing."""
    r, w = stalled_pipe
    spool = Spool(w)
    counts = Counts("records", 1 << 20)
    for n in range(200):
        spool.put(counts, line(n))
    assert select.select([r], [], [], 10)[0], "the writer never wrote"  # a write is under way
    spool.finish()
    assert not spool.put(counts, line(999))
    left = spool.abandon()
    assert left == 200 and counts.lost[SHUTDOWN] == 201
    assert counts.queued_bytes == 0 and counts.queued_lines == 0 and counts.written == 0
    assert spool.abandon() == 0


def test_a_writer_that_dies_of_a_bug_counts_every_line_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the writer thread fails for a reason of its own, what it held and every line after are
    counted lost (`error`) instead of waiting in a queue nobody empties."""
    spool = Spool.open_path(str(tmp_path / "r.jsonl"))

    def broken(batch: object) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr(spool, "_write", broken)
    counts = Counts("records", 1 << 20)
    spool.put(counts, line(1))
    assert spool.wait(10)  # the thread ended
    assert not spool.put(counts, line(2))
    assert counts.lost["error"] == 2 and counts.queued_bytes == 0 and counts.queued_lines == 0
