"""Tests for hopmeter.proxy.addon.outlets: the owner of the outputs' queues (its option, the loss
reports, the flush at exit by the drain's deadline) and mitmproxy's log through an outlet."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from hopmeter.proxy.addon import outlets as outlets_module
from hopmeter.proxy.addon.outlets import LOOK_EVERY_S, OutputQueues, QueuedTermLog
from hopmeter.testing import ManualClock
from tests.harness.procs import wait_for


def test_the_queue_bound_is_a_size_option() -> None:
    """`hopmeter_output_queue` takes a size with its unit and sets every output's bound; a bad
    value names the option and an example."""
    queues = OutputQueues()
    with taddons.context(queues) as tctx:
        assert queues.outlets.queue_bytes == 8 * 1024 * 1024
        tctx.configure(queues, hopmeter_output_queue="64KiB")
        assert queues.outlets.queue_bytes == 65536
        with pytest.raises(exceptions.OptionsError, match="hopmeter_output_queue 'lots'"):
            tctx.configure(queues, hopmeter_output_queue="lots")


def test_done_flushes_and_says_what_was_lost(caplog: pytest.LogCaptureFixture) -> None:
    """At `done` the outputs write what they hold, and a run that lost lines says so, by output
    and reason, through the log."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    queues = OutputQueues()
    outlet = queues.outlets.open("records", "/dev/full")
    with taddons.context(queues), caplog.at_level(logging.INFO, logger="hopmeter"):
        outlet.put(b"{}\n")
        queues.done()
    (line,) = [r.getMessage() for r in caplog.records if "over this run" in r.getMessage()]
    assert "records 1 lines (enospc 1)" in line


def test_done_waits_no_longer_than_the_drain_left(tmp_path: Path) -> None:
    """With the drain's deadline past, `done` gives a stalled output only the floor
    (FLUSH_FLOOR_S) before it counts the rest lost."""
    fifo = tmp_path / "stalled"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    queues = OutputQueues()
    outlet = queues.outlets.open("log", str(fifo))
    with taddons.context(queues):
        for _ in range(200):
            outlet.put(b"x" * 999 + b"\n")
        queues.outlets.flush_by = time.monotonic() - 100  # the drain used all its time
        deadlines: list[tuple[float, float]] = []  # (the deadline given, when close was called)
        close = queues.outlets.close

        def spy(deadline: float, *args: Any, **kwargs: Any) -> int:
            deadlines.append((deadline, time.monotonic()))
            return close(deadline, *args, **kwargs)

        queues.outlets.close = spy  # type: ignore[method-assign]
        started = time.monotonic()
        queues.done()
    os.close(reader)
    ((deadline, called),) = deadlines
    # the floor from the moment done ran: not FLUSH_S, not the drain's deadline long past
    assert started <= deadline - outlets_module.FLUSH_FLOOR_S <= called
    (state,) = queues.outlets.states()
    assert state.lost["shutdown"] > 0 and state.queued_bytes == 0


def test_reopen_reopens_the_files_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGHUP's handler reopens each file at its path and logs which."""
    queues = OutputQueues()
    path = tmp_path / "r.jsonl"
    queues.outlets.open("records", str(path))
    with caplog.at_level(logging.INFO, logger="hopmeter"):
        queues.reopen()
    assert f"hopmeter: reopening {path} (SIGHUP or SIGUSR1)" in caplog.text
    queues.outlets.close(time.monotonic() + 10)


def test_losses_are_looked_at_while_running(caplog: pytest.LogCaptureFixture) -> None:
    """Once running, a loss is logged by the next look (every LOOK_EVERY_S) without anything
    else happening."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    now = ManualClock()
    queues = OutputQueues(clock=now, timers=now)
    outlet = queues.outlets.open("records", "/dev/full")

    async def main() -> None:
        queues.running()
        await asyncio.sleep(0)  # the look's task starts and waits
        outlet.put(b"{}\n")
        wait_for(  # the output's thread, a real one, fails to write
            lambda: any(sum(s.lost.values()) for s in queues.outlets.states()),
            what="the loss counted",
        )
        now.advance(LOOK_EVERY_S - 0.125)  # binary fractions: exact sums
        await asyncio.sleep(0)
        assert "could not write every line" not in caplog.text
        now.advance(0.125)
        await asyncio.sleep(0)
        assert "could not write every line" in caplog.text
        queues.outlets.flush_by = now()  # nothing left to write: no wait on the manual clock
        queues.done()

    with caplog.at_level(logging.INFO, logger="hopmeter"):
        asyncio.run(main())
    assert "records 1 lines (enospc 1)" in caplog.text


def test_mitmproxy_log_lines_go_on_the_log_outlet(capfd: pytest.CaptureFixture[str]) -> None:
    """The runner's TermLog formats a log record as mitmproxy does ("[time] message") and puts
    it on the `log` output, whose thread writes it to standard output."""
    queues = OutputQueues()
    termlog = QueuedTermLog(queues.outlets)
    try:
        outlet = termlog.logger.outlet
        assert outlet.output == "log" and outlet.target == "-"
        logging.getLogger("tests.termlog").warning("a line for the log")
        wait_for(
            lambda: any(s.output == "log" and s.written for s in queues.outlets.states()),
            what="the log line written",
        )
    finally:
        termlog.uninstall()
    queues.outlets.close(time.monotonic() + 10)
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\.\d{3}\] a line for the log\n", capfd.readouterr().out)
