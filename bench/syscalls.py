"""System calls per event, by kind, of bare mitmdump and `hopmeter run` under the same load.

    python bench/syscalls.py                       # h1 (relay and --no-relay), tls, h2
    python bench/syscalls.py --protocols h1 --streams 20 --events 200

Each proxy is started as bench/cost.py starts it (bench/procs.py), warmed with one stream, then
loaded twice with the same paced load (bench/client.py): once bare, for the user/system CPU split
per event (/proc/PID/stat utime and stime of the process tree), and once with `strace -f -c`
attached to the process tree, for the count of each system call per event (strace slows the
proxy, so its run gives counts, not CPU). Writes bench/results/<time>-syscalls.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs

from harness import Load, client, log, warm

PAIRS: dict[str, tuple[str, ...]] = {
    "h1": ("mitmdump", "hopmeter", "hopmeter-norelay"),
    "tls": ("mitmdump", "hopmeter"),
    "h2": ("mitmdump-h2up", "hopmeter-h2up"),
}
CLASSES = {
    "mitmdump": procs.Mitmdump,
    "mitmdump-h2up": procs.MitmdumpH2,
    "hopmeter": procs.Hopmeter,
    "hopmeter-norelay": procs.HopmeterNoRelay,
    "hopmeter-h2up": procs.HopmeterH2,
}
ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


def ticks(pids: list[int]) -> tuple[int, int]:
    """utime and stime (clock ticks) of the processes, their threads included."""
    user = system = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    return user, system


def parse(summary: str) -> dict[str, int]:
    """strace -c's table: {syscall: calls}."""
    calls: dict[str, int] = {}
    for line in summary.splitlines():
        m = ROW.match(line)
        if m and m.group(3) != "total":
            calls[m.group(3)] = int(m.group(1))
    return calls


def one(name: str, load: Load, up: procs.Upstream, logdir: Path, traced: bool) -> dict[str, Any]:
    with CLASSES[name](up.port if "h2" not in name else up.h2_port, logdir) as topo:
        warm(topo, load.proto)
        pids = topo.pids()
        tracer = None
        out = logdir / f"{name}-{load.proto}.strace"
        if traced:
            cmd = ["strace", "-f", "-c", "-qq", "-o", str(out)]
            for pid in pids:
                cmd += ["-p", str(pid)]
            tracer = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # strace attaches to every thread
        before = ticks(pids)
        result = client(load.args(topo.port))
        after = ticks(pids)
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
    events = int(result.get("events_received") or 0) or 1
    row: dict[str, Any] = {"topology": name, "protocol": load.proto, "events": events}
    if traced:
        calls = parse(out.read_text())
        row["syscalls"] = calls
        row["syscalls_per_event"] = {
            k: round(v / events, 3) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])
        }
        row["total_per_event"] = round(sum(calls.values()) / events, 3)
    else:
        tck = os.sysconf("SC_CLK_TCK")
        row["user_us_per_event"] = round((after[0] - before[0]) / tck * 1e6 / events, 2)
        row["system_us_per_event"] = round((after[1] - before[1]) / tck * 1e6 / events, 2)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--protocols", default="h1,tls,h2")
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--events", type=int, default=200, help="events per stream")
    p.add_argument("--rate", type=float, default=50.0, help="events per second per stream")
    p.add_argument("--tag", default="", help="added to the result file's name")
    args = p.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("bench/syscalls.py needs strace (apt-get install strace)")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    logdir = Path(f"/tmp/hopmeter-syscalls-{stamp}")
    logdir.mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    seconds = args.events / args.rate
    with procs.Upstream(logdir) as up:
        for proto in args.protocols.split(","):
            load = Load(args.streams, args.rate, "paced", 0.0, seconds, 3.0, proto)
            for name in PAIRS[proto]:
                row = one(name, load, up, logdir, traced=False)
                row.update(one(name, load, up, logdir, traced=True))
                log(f"{proto} {name}: {row.get('total_per_event')} syscalls/event")
                rows.append(row)
    res = {
        "when": stamp,
        "load": vars(args),
        "pinning": procs.LAYOUT.pinning,
        "note": "CPU split from an untraced run; syscall counts from a run under strace -f -c",
        "rows": rows,
    }
    dest = procs.BENCH / "results" / f"{stamp}-syscalls{('-' + args.tag) if args.tag else ''}.json"
    dest.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
