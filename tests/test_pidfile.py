"""Tests for hopmeter.pidfile: the pid file a rotation reads to signal the right process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from hopmeter.errors import UsageError
from hopmeter.pidfile import REOPEN_SIGNALS, ignore_hangup, pid_file


def test_the_pid_is_there_while_the_block_runs_and_gone_after(tmp_path: Path) -> None:
    """The file holds this process's id and a newline while the command runs, written whole
    (no temporary file left beside it), and is removed when it ends."""
    path = tmp_path / "run.pid"
    with pid_file(str(path)):
        assert path.read_text() == f"{os.getpid()}\n"
        assert [p.name for p in tmp_path.iterdir()] == ["run.pid"]
    assert not path.exists()


def test_a_pid_file_another_process_took_over_is_left_alone(tmp_path: Path) -> None:
    """If the file names another process by the end (a newer hopmeter started on the same path),
    it is not removed."""
    path = tmp_path / "run.pid"
    with pid_file(str(path)):
        path.write_text("999999\n")
    assert path.read_text() == "999999\n"


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    """Without --pid-file nothing is written."""
    with pid_file(""):
        pass
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_pid_file_is_one_clear_error(tmp_path: Path) -> None:
    """A path in a folder that does not exist names the flag, the path and the fix."""
    path = tmp_path / "missing" / "run.pid"
    with (
        pytest.raises(UsageError, match=rf"^--pid-file {path}: cannot write it .*writable path$"),
        pid_file(str(path)),
    ):
        pass


@pytest.fixture
def hangup() -> Iterator[None]:
    """Gives SIGHUP and SIGUSR1 their dispositions back."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGUSR1)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("hangup")
def test_hangup_is_ignored_until_the_loop_handles_it() -> None:
    """A SIGHUP, or nginx's reopen signal USR1, that comes while the command starts does not
    stop the process."""
    assert REOPEN_SIGNALS == (signal.SIGHUP, signal.SIGUSR1)
    ignore_hangup()
    for sig in REOPEN_SIGNALS:
        assert signal.getsignal(sig) is signal.SIG_IGN
        os.kill(os.getpid(), sig)  # this test's process survives it
