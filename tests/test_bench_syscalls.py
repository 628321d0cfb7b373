"""bench/syscalls.py reads strace -c's table (with and without an errors column)."""

from __future__ import annotations

from tests.harness.bench import bench_module

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
    mod = bench_module("syscalls")
    assert mod.parse(TABLE) == {"futex": 135, "epoll_pwait": 6105, "clock_gettime": 3398}
