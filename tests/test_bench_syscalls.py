"""bench/syscalls.py reads strace -c's table (with and without an errors column)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "syscalls.py"

TABLE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 60.09    0.294029        2177       135        25 futex
  5.85    0.028608           4      6105           epoll_pwait
  0.88    0.004319           1      3398           clock_gettime
------ ----------- ----------- --------- --------- ----------------
100.00    0.489309          27     18032        25 total
"""


def test_parse_counts_each_call_and_skips_the_total() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("bench_syscalls", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.parse(TABLE) == {"futex": 135, "epoll_pwait": 6105, "clock_gettime": 3398}
