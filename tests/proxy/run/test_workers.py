"""Tests for hopmeter.proxy.run.workers: which exit of a worker stops the others."""

from __future__ import annotations

import signal

import pytest

from hopmeter.proxy.run.workers import failed_worker


@pytest.mark.parametrize(
    ("code", "stopping", "failed"),
    [
        (0, False, False),
        (0, True, False),
        (2, False, True),  # a port in use, a bad option: the others stop
        (2, True, True),
        (-signal.SIGKILL, True, True),
        (-signal.SIGTERM, False, True),  # killed by someone else, no stop asked for
        # the forwarded signal reached a worker still starting up (no handler yet): it had
        # nothing in flight, and signalling the others again would stop them without a drain
        (-signal.SIGTERM, True, False),
        (-signal.SIGINT, True, False),
    ],
)
def test_only_a_real_failure_stops_the_other_workers(code: int, stopping: bool, failed: bool):
    assert failed_worker(code, stopping) is failed
