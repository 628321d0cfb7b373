"""System calls per event, by kind, of bare mitmdump and `hopmeter run` under the same load.

    python bench/syscalls.py                       # h1 (relay and --no-relay), tls, h2
    python bench/syscalls.py --protocols h1 --streams 20 --events 200

Each proxy is started as bench/cost.py starts it (bench/procs.py), warmed with one stream, then
loaded twice with the same paced load (bench/client.py): once bare, for the user/system CPU split
per event (/proc/PID/stat utime and stime of the process tree), and once with `strace -f -c`
attached to the process tree, for the count of each system call per event (strace slows the
proxy, so its run gives counts, not CPU). Writes bench/results/<time>-syscalls.json.

With `--wakeups`, a third run of the same load under `strace -f -e trace=epoll_wait,epoll_pwait`
tells the event loop's waits apart (`wakeups_per_event`): `io`, a wait that returned ready
sockets; `timer`, one that slept until its timeout ran out (a timer of the loop came due: with
nothing else to wake it, hopmeter's measuring timer sleeps 1 ms, its delivery looks 1-64 ms);
`nowait`, a poll with a zero timeout (callbacks were ready: asyncio's and uvloop's call_soon). The
timers' timeouts are counted in ms buckets (`timer_timeouts_ms`).
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
# strace -f's line of one wait: "PID epoll_pwait(epfd, [events], maxevents, timeout, ...) = n",
# or its two halves ("... <unfinished ...>", then "PID <... epoll_pwait resumed>...") when
# another thread's call came between
WAIT_START = re.compile(r"^(\d+)\s+epoll_p?wait\((.*)$")
WAIT_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. epoll_p?wait resumed>(.*)$")
WAIT_ARGS = re.compile(r"\], \d+, (-?\d+)")
WAIT_RETURN = re.compile(r"\) += (\d+)\s*$")
TIMEOUT_BUCKETS_MS = (1, 2, 8, 64)


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


def waits(trace: str) -> dict[str, Any]:
    """strace -f's lines of the loop's waits: {"io", "timer", "nowait": count, "timer_timeouts_ms":
    {"<=1": count, ...}}."""
    open_calls: dict[str, str] = {}
    out: dict[str, Any] = {"io": 0, "timer": 0, "nowait": 0}
    timeouts = {f"<={b}": 0 for b in TIMEOUT_BUCKETS_MS} | {f">{TIMEOUT_BUCKETS_MS[-1]}": 0}
    for line in trace.splitlines():
        m = WAIT_START.match(line)
        if m and line.endswith("<unfinished ...>"):
            open_calls[m.group(1)] = m.group(2)
            continue
        if m:
            text = m.group(2)
        else:
            r = WAIT_RESUMED.match(line)
            if r is None:
                continue
            text = open_calls.pop(r.group(1), "") + r.group(2)
        args, ret = WAIT_ARGS.search(text), WAIT_RETURN.search(text)
        if args is None or ret is None:
            continue
        timeout, ready = int(args.group(1)), int(ret.group(1))
        if ready:
            out["io"] += 1
        elif timeout == 0:
            out["nowait"] += 1
        else:
            out["timer"] += 1
            bucket = next((f"<={b}" for b in TIMEOUT_BUCKETS_MS if 0 <= timeout <= b), None)
            timeouts[bucket or f">{TIMEOUT_BUCKETS_MS[-1]}"] += 1
    out["timer_timeouts_ms"] = timeouts
    return out


def one(
    name: str, load: Load, up: procs.Upstream, logdir: Path, traced: bool, *, wakeups: bool = False
) -> dict[str, Any]:
    with CLASSES[name](up.port if "h2" not in name else up.h2_port, logdir) as topo:
        warm(topo, load.proto)
        pids = topo.pids()
        tracer = None
        out = logdir / f"{name}-{load.proto}.strace"
        if wakeups:
            out = logdir / f"{name}-{load.proto}.waits.strace"
            cmd = ["strace", "-f", "-qq", "-e", "trace=epoll_wait,epoll_pwait", "-o", str(out)]
            for pid in pids:
                cmd += ["-p", str(pid)]
            tracer = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        elif traced:
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
    if wakeups:
        seen = waits(out.read_text())
        row["wakeups_events"] = events
        row["wakeups"] = seen
        row["wakeups_per_event"] = {
            k: round(v / events, 3) for k, v in seen.items() if isinstance(v, int)
        }
    elif traced:
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
    p.add_argument(
        "--wakeups", action="store_true", help="a third run: the loop's waits, by what ended them"
    )
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
                if args.wakeups:
                    row.update(one(name, load, up, logdir, traced=True, wakeups=True))
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
