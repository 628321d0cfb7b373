"""`hopmeter run --workers N`: N proxy processes serving the same listening ports.

mitmproxy runs on one event loop, so one process saturates one core. With `--workers N` the
command starts N copies of itself; each binds the same listen addresses with SO_REUSEPORT and the
kernel spreads connections between them. Each worker serves its metrics on its own port (the
`--metrics` port plus the worker's index: one scrape target per worker, summed in Prometheus) and
appends to the same records file, one whole record per write. Two listeners of one trace may land
in different workers, so live hop pairing can miss; `hopmeter join` on the records finds it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from hopmeter.pidfile import REOPEN_SIGNALS

# How long workers get to drain after the first signal before they are killed, unless the
# command gives its own (`hopmeter run` passes its drain timeout plus a margin).
STOP_TIMEOUT_S = 30.0
POLL_S = 0.1


def failed_worker(code: int, stopping: bool) -> bool:
    """Whether a worker's exit status means it failed (and the others should stop): any but 0,
    except, once a stop was asked for, death by the signal forwarded to it. A worker still
    starting up (importing, before its loop installs its handlers) dies of SIGTERM or SIGINT
    with nothing in flight; counting that as a failure would signal the others a second time,
    and a second signal stops a worker without letting its streams finish."""
    if code == 0:
        return False
    return not (stopping and code in (-signal.SIGTERM, -signal.SIGINT))


def run_workers(argv: Sequence[str], workers: int, stop_timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Start `workers` copies of `hopmeter run ARGV`, forward signals, return the worst status.

    Every signal is forwarded (the first makes each worker drain, a second stops them at once);
    a worker still running `stop_timeout_s` after the first is killed. SIGHUP and SIGUSR1 are
    forwarded too, and stop nothing: each worker reopens its records file. A worker that fails
    (a port, a bad option) stops the others.
    """
    # Each worker in a session of its own: a Ctrl-C in the terminal reaches the parent only, and
    # the parent forwards it once (a worker that got it twice would stop without draining).
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "hopmeter.cli", *argv, "--worker-index", str(i)],
            start_new_session=True,
        )
        for i in range(workers)
    ]
    stopping: list[float] = []  # when the first signal came

    def forward(sig: int, _frame: object) -> None:
        if not stopping:
            stopping.append(time.monotonic())
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    def forward_hangup(sig: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    for sig in REOPEN_SIGNALS:
        signal.signal(sig, forward_hangup)
    status = 0
    failed: set[int] = set()
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            code = p.poll()
            if code is not None and i not in failed and failed_worker(code, bool(stopping)):
                failed.add(i)
                status = max(status, code)
                forward(signal.SIGTERM, None)
        if stopping and time.monotonic() > stopping[0] + stop_timeout_s:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(POLL_S)
    for p in procs:
        p.wait()
        status = max(status, p.returncode if p.returncode > 0 else 0)
    return status
