"""Tests for hopmeter.export.outlets: outputs sharing a destination, the loss said at most once a
minute, reopening files, and the flush at exit that counts and says what it could not write."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from hopmeter.export.outlets import (
    JOIN_S,
    REPORT_EVERY_S,
    SAY_GRACE_S,
    STDOUT,
    LineLogHandler,
    Outlets,
)
from hopmeter.export.spool import QUEUE_FULL, SHUTDOWN
from tests.harness.procs import wait_for

F_SETPIPE_SZ = 1031


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A named pipe (its path, and a read end nobody reads until the test does): a destination
    that stalls."""
    path = tmp_path / "stalled.fifo"
    os.mkfifo(path)
    r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(r, F_SETPIPE_SZ, 4096)
    yield str(path), r
    os.close(r)


def test_records_and_console_on_stdout_share_one_writer(capfd: pytest.CaptureFixture[str]) -> None:
    """Two outputs to "-" are one destination: their lines come out whole, in the order put,
    each output counted apart."""
    outlets = Outlets()
    records, console = outlets.open("records", STDOUT), outlets.open("console", STDOUT)
    assert records.spool is console.spool
    for n in range(50):
        (records if n % 2 else console).put(orjson.dumps({"n": n}) + b"\n")
    outlets.close(time.monotonic() + 10)
    got = [orjson.loads(ln)["n"] for ln in capfd.readouterr().out.splitlines()]
    assert got == list(range(50))
    states = {s.output: s for s in outlets.states()}
    assert states["records"].written == states["console"].written == 25


def test_a_released_destination_is_finished_and_a_reopen_names_the_files(tmp_path: Path) -> None:
    """Releasing the last outlet of a file finishes it (its lines still written); only files
    are reopened, standard streams are not."""
    outlets = Outlets()
    first = outlets.open("records", str(tmp_path / "a.jsonl"))
    first.put(b"{}\n")
    outlets.release(first)
    second = outlets.open("records", str(tmp_path / "b.jsonl"))
    outlets.open("log", STDOUT)
    assert outlets.reopen() == [str(tmp_path / "b.jsonl")]
    second.put(b"{}\n")
    outlets.close(time.monotonic() + 10)
    assert (tmp_path / "a.jsonl").read_bytes() == b"{}\n" == (tmp_path / "b.jsonl").read_bytes()
    (state,) = [s for s in outlets.states() if s.output == "records"]
    assert state.written == 2  # one output's counts span its files


def test_an_unopenable_path_raises_at_open(tmp_path: Path) -> None:
    """A path that cannot be opened is an OSError at open, where the option reports it."""
    with pytest.raises(FileNotFoundError):
        Outlets().open("records", str(tmp_path / "missing" / "r.jsonl"))


def test_states_always_have_queue_full_and_other_reasons_once_they_happened() -> None:
    """Each output opened shows `queue_full` (0 until a drop) and its bytes held; an error's
    reason appears once a line was lost to it."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    outlets = Outlets()
    outlet = outlets.open("records", "/dev/full")
    (state,) = outlets.states()
    assert state.lost == {QUEUE_FULL: 0} and state.queued_bytes == 0 and state.written == 0
    outlet.put(b"{}\n")
    wait_for(lambda: outlets.states()[0].lost.get("enospc") == 1, what="the failed write")
    outlets.close(time.monotonic() + 1)


def test_a_loss_is_said_at_once_then_at_most_once_a_minute(fifo: tuple[str, int]) -> None:
    """The first report after a loss says it with its reason; losses within the next minute wait
    for the report a minute after, which gives the count since; no loss, no line."""
    path, _r = fifo
    outlets = Outlets(queue_bytes=100)
    outlet = outlets.open("log", path)
    assert outlets.report(0.0) == []
    for _ in range(200):
        outlet.put(b"x" * 99 + b"\n")
    lost = outlets.states()[0].lost[QUEUE_FULL]
    assert lost > 100
    (line,) = outlets.report(1.0)
    assert line.startswith("hopmeter: WARNING outputs could not write every line (since start)")
    assert f"log {lost} lines (queue_full {lost})" in line
    outlet.put(b"y" * 99 + b"\n")
    assert outlets.report(1.0 + REPORT_EVERY_S - 1) == []
    (line,) = outlets.report(1.0 + REPORT_EVERY_S)
    assert "(since 60s ago): log 1 lines (queue_full 1)" in line
    assert outlets.report(1.0 + 3 * REPORT_EVERY_S) == []
    outlets.close(time.monotonic())


def test_a_failed_reopen_is_said_once(tmp_path: Path) -> None:
    """A reopen that cannot open the path again is reported once, naming the path and why."""
    folder = tmp_path / "logs"
    folder.mkdir()
    outlets = Outlets()
    outlets.open("records", str(folder / "r.jsonl"))
    folder.rename(tmp_path / "gone")
    outlets.reopen()
    (line,) = wait_for(lambda: outlets.report(0.0), what="the failed reopen")
    assert line == (
        f"hopmeter: ERROR cannot reopen {folder / 'r.jsonl'}: No such file or directory; "
        f"still writing to the file opened before"
    )
    assert outlets.report(1.0) == []
    outlets.close(time.monotonic() + 10)


class Ticking:
    """A clock that moves STEP_S each time it is read: deadlines without waiting for them."""

    STEP_S = 0.05

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.STEP_S
        return self.now


def test_close_writes_what_it_can_by_the_deadline_and_says_the_rest(
    fifo: tuple[str, int], tmp_path: Path
) -> None:
    """At exit a stalled destination is given up at the deadline: its lines are counted
    `shutdown`, the line that says so names them, and a healthy file is written whole."""
    path, _r = fifo
    outlets = Outlets()
    stalled = outlets.open("log", path)
    records = outlets.open("records", str(tmp_path / "r.jsonl"))
    for _ in range(100):
        stalled.put(b"z" * 999 + b"\n")
        records.put(b"{}\n")
    said: list[str] = []
    clock = Ticking()
    left = outlets.close(0.2, say=said.append, clock=clock)
    # on its clock it waited for the deadline, then the saying's grace and the writers' join
    assert 0.2 <= clock.now <= 0.2 + SAY_GRACE_S + JOIN_S + 2 * Ticking.STEP_S
    assert left > 50
    states = {s.output: s for s in outlets.states()}
    assert states["log"].lost[SHUTDOWN] == left and states["log"].queued_bytes == 0
    assert states["records"].written == 100
    assert (tmp_path / "r.jsonl").read_bytes() == b"{}\n" * 100
    (line,) = said
    assert line == (
        f"hopmeter: ERROR outputs could not write every line over this run: log {left} lines "
        f"(shutdown {left}) (shutdown: still queued when the process had to stop)"
    )


def test_close_says_nothing_when_nothing_was_lost(tmp_path: Path) -> None:
    """A run that lost no line says nothing at exit."""
    outlets = Outlets()
    outlets.open("records", str(tmp_path / "r.jsonl")).put(b"{}\n")
    said: list[str] = []
    assert outlets.close(time.monotonic() + 10, say=said.append) == 0
    assert said == []


def test_close_is_done_once(fifo: tuple[str, int]) -> None:
    """A second close (the runner's, after the addon's) neither waits nor says the losses again."""
    path, _r = fifo
    outlets = Outlets(queue_bytes=100)
    outlet = outlets.open("log", path)
    for _ in range(10):
        outlet.put(b"x" * 99 + b"\n")
    said: list[str] = []
    outlets.close(time.monotonic(), say=said.append)
    assert len(said) == 1
    assert outlets.close(time.monotonic() + 60, say=said.append) == 0
    assert len(said) == 1


def test_a_new_bound_applies_to_every_output(fifo: tuple[str, int]) -> None:
    """Changing the bound changes it for the outputs open and for those opened later."""
    path, _r = fifo
    outlets = Outlets()
    first = outlets.open("records", path)
    outlets.set_queue_bytes(1000)
    outlets.open("log", path)
    assert first.counts.limit_bytes == 1000 == outlets.open("console", path).counts.limit_bytes
    outlets.close(time.monotonic())


def test_the_log_handler_puts_each_formatted_record_on_its_outlet(tmp_path: Path) -> None:
    """A stdlib log record becomes one formatted line on the outlet, written by its thread."""
    outlets = Outlets()
    handler = LineLogHandler(outlets.open("log", str(tmp_path / "log")))
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tests.outlets")
    logger.addHandler(handler)
    try:
        logger.warning("hopmeter: a line é")
    finally:
        logger.removeHandler(handler)
    outlets.close(time.monotonic() + 10)
    assert (tmp_path / "log").read_text(encoding="utf-8") == "WARNING hopmeter: a line é\n"
