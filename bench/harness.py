"""What every bench mode shares: running the load generator, warming a proxy, one measured load."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import procs
from procs import Topology


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def client(args: list[str], on_line: Any = None) -> dict[str, Any]:
    """Run bench/client.py on the generator CPU; its final {"result": ...}."""
    proc = subprocess.Popen(procs.client_command(args), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    result: dict[str, Any] = {}
    for line in proc.stdout:
        msg = json.loads(line)
        if "result" in msg:
            result = msg["result"]
        elif on_line is not None:
            on_line(msg)
    proc.wait()
    if not result:
        raise RuntimeError(f"client {' '.join(args)} failed with {proc.returncode}")
    return result


@dataclass(frozen=True, slots=True)
class Load:
    """One load: `streams` streams of `rate` token events per second, `mode` paced or lockstep,
    spoken as `proto` (bench/client.py's `--proto`: h1, tls or h2).

    Each stream lasts warm-up + measure; events sent during the warm-up are not measured (the
    connections are still opening); the client waits `grace_s` past the planned end.
    """

    streams: int
    rate: float
    mode: str = "paced"
    warmup_s: float = 1.5
    measure_s: float = 5.0
    grace_s: float = 3.0
    proto: str = "h1"

    def args(self, port: int) -> list[str]:
        """bench/client.py's command line for this load against 127.0.0.1:`port`."""
        events = max(1, round(self.rate * (self.warmup_s + self.measure_s)))
        return [
            "load",
            *("--target", f"127.0.0.1:{port}", "--streams", str(self.streams)),
            *("--rate", str(self.rate), "--events", str(events), "--mode", self.mode),
            *("--warmup-s", str(self.warmup_s), "--measure-s", str(self.measure_s)),
            *("--grace-s", str(self.grace_s)),
            # only when asked: bench/loadgen.c speaks plain HTTP/1 and knows no --proto
            *(("--proto", self.proto) if self.proto != "h1" else ()),
        ]


WARM = Load(streams=1, rate=1000.0, warmup_s=0.0, measure_s=0.02, grace_s=2.0)


def warm(topo: Topology, proto: str = "h1") -> None:
    """One short stream through a fresh proxy: imports, tokenizer, first connection (and with
    TLS, the proxy's first certificate)."""
    client(replace(WARM, proto=proto).args(topo.port))
    time.sleep(0.3)


def new_run() -> tuple[str, Path]:
    """A run's UTC stamp (its results file is named by it) and a fresh folder for the logs of
    the processes it starts."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    logdir = Path("/tmp") / f"hopmeter-bench-{stamp}"
    logdir.mkdir(parents=True)
    return stamp, logdir


QUIET_CORES = 0.15  # background CPU (cores) above which the machine is not quiet enough
QUIET_WAIT_S = 10.0  # the longest a load waits for other work on the machine to stop


def background_cores(ours: list[int], seconds: float = 0.5) -> float:
    """CPU the rest of the machine used over `seconds`, in cores (our processes left out)."""
    b0, o0, t0 = procs.machine_busy_s(), procs.cpu_s(ours), time.monotonic()
    time.sleep(seconds)
    busy = procs.machine_busy_s() - b0 - (procs.cpu_s(ours) - o0)
    return max(0.0, busy / (time.monotonic() - t0))


def wait_quiet(ours: list[int]) -> float:
    """Wait (bounded) until the machine is quiet apart from our processes; seconds waited.

    Other work on the machine (a test suite, a build) takes CPU from the proxy's core and turns
    microseconds into milliseconds; every load records how much it had in `background_cores`.
    """
    t0 = time.monotonic()
    calm = 0
    while time.monotonic() - t0 < QUIET_WAIT_S and calm < 2:
        calm = calm + 1 if background_cores(ours) < QUIET_CORES else 0
    return round(time.monotonic() - t0, 1)


def measured_load(topo: Topology, load: Load, upstream_pid: int) -> dict[str, Any]:
    """One load through `topo`, with the proxy's CPU and RSS read around and during it."""
    pids = topo.pids()
    waited = wait_quiet([*pids, upstream_pid])
    idle_rss = procs.rss_kib(pids)
    cpu0, up0, busy0 = procs.cpu_s(pids), procs.cpu_s([upstream_pid]), procs.machine_busy_s()
    wake0 = procs.wakeups(pids)
    self0 = sum(os.times()[:2])
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(procs.client_command(load.args(topo.port)), stdout=subprocess.PIPE)
    while True:  # wait4: the client's own CPU time comes with its exit status
        done, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if done:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if pids:
            samples.append((time.monotonic() - t0, procs.rss_kib(pids)))
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    cpu = procs.cpu_s(pids) - cpu0
    woke = procs.wakeups(pids) - wake0
    generator = procs.cpu_s([upstream_pid]) - up0 + usage.ru_utime + usage.ru_stime
    harness = sum(os.times()[:2]) - self0
    background = procs.machine_busy_s() - busy0 - cpu - generator - harness
    out = proc.stdout.read() if proc.stdout else b""
    if proc.returncode != 0 or not out:
        raise RuntimeError(f"client failed ({proc.returncode}) against {topo.name}")
    result: dict[str, Any] = json.loads(out.splitlines()[-1])["result"]
    result["waited_for_quiet_s"] = waited
    result["background_cores"] = round(max(0.0, background) / elapsed, 3)
    result["generator_cores"] = round(generator / elapsed, 3)
    if pids:
        # streams are all open from the end of the warm-up until the planned end
        lo, hi = load.warmup_s + 0.5, load.warmup_s + load.measure_s + 0.3
        window = [r for t, r in samples if lo <= t <= hi] or [r for _, r in samples] or [idle_rss]
        result["rss_idle_kib"] = idle_rss
        result["rss_load_kib"] = max(window)
        result["rss_per_stream_kib"] = round((max(window) - idle_rss) / load.streams, 1)
        result["cpu_s"] = round(cpu, 3)
        result["proxy_cores"] = round(cpu / elapsed, 3)
        events = result["events_received"]
        result["cpu_us_per_event"] = round(cpu / events * 1e6, 1) if events else None
        result["wakeups_per_event"] = round(woke / events, 3) if events else None
    return result
