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

# How long workers get to write their in-flight records after SIGTERM before they are killed.
STOP_TIMEOUT_S = 15.0


def run_workers(argv: Sequence[str], workers: int) -> int:
    """Start `workers` copies of `hopmeter run ARGV`, forward signals, return the worst status."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "hopmeter.cli", *argv, "--worker-index", str(i)])
        for i in range(workers)
    ]

    def forward(sig: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    status = 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            code = p.poll()
            if code not in (None, 0):
                # one worker failed (a port, a bad option): stop the rest, report it
                status = max(status, code)
                forward(signal.SIGTERM, None)
        time.sleep(0.1)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
        status = max(status, p.returncode or 0)
    return status
