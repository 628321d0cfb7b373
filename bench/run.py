"""hopmeter bench: direct, nginx, bare mitmproxy and hopmeter under the same load, in one run.

    python bench/run.py              # full run (~11 min quiet): load matrix + saturation ramp
    python bench/run.py --quick      # the same, shorter (~7 min)
    python bench/run.py --soak       # 100,000 short flows via hopmeter and bare mitmproxy; RSS
    python bench/run.py --profile    # py-spy on bare mitmproxy and on hopmeter at 100 streams
    python bench/run.py --scale      # --workers 2 vs one worker on every CPU (C load generator)
    python bench/run.py --ramp-only --ramp-streams 200 --topologies mitmdump,hopmeter
    python bench/run.py --repeat 5 --loads 50,100 --topologies mitmdump,hopmeter --no-ramp
    HOPMETER_BENCH_BASE=/tmp/before python bench/run.py --repeat 3 --loads 50 --no-ramp \
        --topologies mitmdump,hopmeter,hopmeter-base      # a change against its base

Every mode writes bench/results/<timestamp>[-mode].json and regenerates its tables in
bench/README.md (bench/report.py). The method is described in bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
import profiling
from procs import BENCH, LAYOUT, Topology

import report
from harness import QUIET_CORES, Load, log, measured_load, warm

RESULTS = BENCH / "results"
RETRIES = 1  # a load disturbed by other work on the machine is run again, once
DELAY_LIMIT_MS = 10.0  # the ramp's pass line for added delay p99
# --scale: more streams than the matrix's ramp, so that SO_REUSEPORT's hash spreads them evenly
# over the workers, and a higher cap, which two workers can pass
SCALE_STREAMS = 200
SCALE_CAP = 64000.0


@dataclass(frozen=True)
class Settings:
    loads: tuple[int, ...] = (1, 50, 100, 200)
    modes: tuple[str, ...] = ("paced", "lockstep")
    rate: float = 50.0  # tokens (= events) per second per stream
    warmup_s: float = 1.5
    measure_s: float = 5.0
    grace_s: float = 3.0
    ramp_streams: int = 100
    ramp_start: float = 1000.0  # events per second, all streams together
    ramp_cap: float = 32000.0
    ramp_bisect: int = 3
    ramp_warmup_s: float = 1.0
    ramp_measure_s: float = 3.0


QUICK = Settings(warmup_s=1.0, measure_s=2.5, grace_s=2.0, ramp_bisect=2, ramp_measure_s=2.0)


def hopmeter_check(topo: Topology, before: int) -> dict[str, int]:
    """What hopmeter recorded for the flows of one load: flows and token events."""
    path = getattr(topo, "records", None)
    if path is None or not path.exists():
        return {}
    time.sleep(0.5)  # records are written just after each flow's response hook
    lines = path.read_bytes().splitlines()[before:]
    records = [json.loads(line) for line in lines]
    return {
        "flows": len(records),
        "events": sum(len(r.get("events") or []) for r in records),
        "tokens": sum((r.get("figures") or {}).get("tokens") or 0 for r in records),
    }


def record_count(topo: Topology) -> int:
    path = getattr(topo, "records", None)
    return len(path.read_bytes().splitlines()) if path is not None and path.exists() else 0


def run_matrix(
    topos: list[type[Topology]],
    up: procs.Upstream,
    s: Settings,
    logdir: Path,
    *,
    rows: list[dict[str, Any]],
    save: Callable[[], None],
    repeat: int = 1,
) -> None:
    """Every load point through every topology; each row is saved as soon as it is measured.

    With `repeat` > 1 each point is run that many rounds, the topologies taking turns (A B A B:
    a slow spell of the machine falls on both), and a topology's row holds the medians
    (`median_round`).
    """
    for mode in s.modes:
        for streams in s.loads:
            load = Load(streams, s.rate, mode, s.warmup_s, s.measure_s, s.grace_s)
            rounds: dict[str, list[dict[str, Any]]] = {cls.name: [] for cls in topos}
            for n in range(repeat):
                for cls in topos:
                    turn = f" (round {n + 1} of {repeat})" if repeat > 1 else ""
                    log(f"{mode} {streams} streams via {cls.name}{turn}")
                    tries = attempts(cls, up, load, logdir)
                    r = min(tries, key=lambda r: float(r["background_cores"]))
                    rounds[cls.name].append(r)
                    log(
                        f"  delay p50/p99/max {fmt_delay(r)} cpu/event {r.get('cpu_us_per_event')}"
                        f" wake-ups/event {r.get('wakeups_per_event')}"
                    )
            for cls in topos:
                rows.append({"topology": cls.name, **median_round(rounds[cls.name])})
                save()


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median CPU per event (the lower middle one of an even count), its
    delay p99 replaced by the median of every round's p99 (the two medians need not fall in one
    round), and every round's CPU per event and delay p99 beside it."""
    if len(rounds) == 1:
        return rounds[0]
    ranked = sorted(rounds, key=lambda r: r.get("cpu_us_per_event") or math.inf)
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["rounds"] = [
        {
            "cpu_us_per_event": r.get("cpu_us_per_event"),
            "wakeups_per_event": r.get("wakeups_per_event"),
            "p99_ms": r["delay_ms"]["p99"],
        }
        for r in rounds
    ]
    p99s = sorted(r["delay_ms"]["p99"] or math.inf for r in rounds)
    row["delay_ms"] = {**row["delay_ms"], "p99": p99s[(len(p99s) - 1) // 2]}
    return row


def attempts(
    cls: type[Topology], up: procs.Upstream, load: Load, logdir: Path
) -> list[dict[str, Any]]:
    """The load on a fresh proxy; again (up to RETRIES times) while other work disturbed it."""
    tries: list[dict[str, Any]] = []
    while len(tries) <= RETRIES:
        with cls(up.port, logdir) as topo:
            warm(topo)
            before = record_count(topo)
            r = measured_load(topo, load, up.pid)
            check = hopmeter_check(topo, before)
        if check:
            r["hopmeter_recorded"] = check
        r["attempt"] = len(tries) + 1
        tries.append(r)
        if r["background_cores"] <= QUIET_CORES:
            break
        again = "; again" if len(tries) <= RETRIES else "; keeping the least disturbed try"
        log(f"  disturbed: {r['background_cores']} cores of other work{again}")
    return tries


def fmt_delay(r: dict[str, Any]) -> str:
    d = r["delay_ms"]
    return "/".join("-" if d[k] is None else f"{d[k]:.2f}" for k in ("p50", "p99", "max"))


def ramp_step(topo: Topology, up: procs.Upstream, s: Settings, rate_total: float) -> dict[str, Any]:
    """One step of the ramp. A step that fails is run once more and the better attempt counts:
    one 3-second sample decides the whole ramp, and a single stall (a scheduler hiccup on a
    shared VM) fails a rate the proxy carries (a step failed at 24,000 events/s, p50 0.7 ms, and
    held at 32,000). A rate that fails twice is over the line."""
    first = ramp_attempt(topo, up, s, rate_total)
    if first["passed"]:
        return first
    again = ramp_attempt(topo, up, s, rate_total)
    again["attempts"] = first["attempts"] = 2
    return min(first, again, key=lambda r: (not r["passed"], r["delay_ms"]["p99"] or math.inf))


def ramp_attempt(
    topo: Topology, up: procs.Upstream, s: Settings, rate_total: float
) -> dict[str, Any]:
    per_stream = rate_total / s.ramp_streams
    load = Load(s.ramp_streams, per_stream, "paced", s.ramp_warmup_s, s.ramp_measure_s, 2.0)
    r = measured_load(topo, load, up.pid)
    p99 = r["delay_ms"]["p99"]
    complete = r["outcomes"] == {"ok": s.ramp_streams}
    r["events_per_s"] = rate_total
    r["passed"] = bool(complete and p99 is not None and p99 <= DELAY_LIMIT_MS)
    late = r["upstream_late_ms"]["p99"]
    r["generator_late"] = late is not None and late > DELAY_LIMIT_MS / 2
    log(f"  ramp {rate_total:.0f} ev/s: p99 {p99} ms, {r['outcomes']}, late p99 {late} ms")
    settle(topo)
    return r


def settle(topo: Topology, timeout_s: float = 15.0) -> None:
    """Wait until the proxy is idle again (a failed step can leave a backlog)."""
    pids = topo.pids()
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        c0 = procs.cpu_s(pids)
        time.sleep(0.5)
        if procs.cpu_s(pids) - c0 < 0.05:
            return


def ramp(cls: type[Topology], up: procs.Upstream, s: Settings, logdir: Path) -> dict[str, Any]:
    """Double the event rate until added p99 passes 10 ms, then bisect; the best rate that held."""
    steps: list[dict[str, Any]] = []
    log(f"ramp via {cls.name}")
    with cls(up.port, logdir) as topo:
        warm(topo)
        rate, best, worst = s.ramp_start, None, None
        while rate <= s.ramp_cap:
            step = ramp_step(topo, up, s, rate)
            steps.append(step)
            if not step["passed"]:
                worst = rate
                break
            best, rate = rate, rate * 2
        if best is not None and worst is not None:
            for _ in range(s.ramp_bisect):
                mid = round((best + worst) / 2)
                step = ramp_step(topo, up, s, mid)
                steps.append(step)
                best, worst = (mid, worst) if step["passed"] else (best, mid)
    fail = next((st for st in steps if st["events_per_s"] == worst), None)
    limited = "cap" if worst is None else ("generator" if fail and fail["generator_late"] else "")
    return {
        "topology": cls.name,
        "streams": s.ramp_streams,
        "saturation_events_per_s": best,
        "first_failing_events_per_s": worst,
        "limited_by": limited,
        "steps": steps,
    }


def machine(up: procs.Upstream) -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    versions = {}
    for name, cmd in (
        ("nginx", ["nginx", "-v"]),
        ("mitmproxy", [str(procs.BIN / "mitmdump"), "--version"]),
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        versions[name] = (done.stdout + done.stderr).strip().splitlines()[0]
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uvloop_in_generator": up.uvloop,
        "pinning": LAYOUT.pinning,
        **versions,
    }


def select(names: str) -> tuple[list[type[Topology]], list[dict[str, str]]]:
    chosen, skipped = [], []
    for name in names.split(","):
        cls = procs.TOPOLOGIES[name]
        why = cls(0, Path()).available()
        if why:
            skipped.append({"topology": name, "reason": why})
        else:
            chosen.append(cls)
    return chosen, skipped


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the with-blocks, which stop every process started


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="hopmeter bench")
    p.add_argument("--quick", action="store_true", help="shorter loads and ramp")
    p.add_argument("--soak", action="store_true", help="many short flows; RSS over time")
    p.add_argument("--soak-flows", type=int, default=100_000)
    p.add_argument("--soak-topologies", default="hopmeter,mitmdump")
    p.add_argument(
        "--scale",
        action="store_true",
        help="saturation of --workers 2 against one worker, every CPU shared, C generator",
    )
    p.add_argument("--scale-topologies", default="mitmdump,hopmeter,hopmeter-w2")
    p.add_argument("--profile", action="store_true", help="py-spy at 100 streams")
    p.add_argument("--profile-s", type=float, default=12.0)
    p.add_argument("--topologies", default=",".join(procs.TOPOLOGIES))
    p.add_argument(
        "--loads", default="", help="comma-separated stream counts (default 1,50,100,200)"
    )
    p.add_argument("--no-ramp", action="store_true")
    p.add_argument(
        "--ramp-only", action="store_true", help="only the saturation ramp (its own README table)"
    )
    p.add_argument("--ramp-streams", type=int, help="streams the ramp spreads its rate over")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds per load point, topologies taking turns; the median-CPU round is reported",
    )
    p.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    return p.parse_args()


def measure(  # noqa: PLR0917 - the run's state, handed over from main
    args: argparse.Namespace,
    s: Settings,
    up: procs.Upstream,
    out: dict[str, Any],
    save: Callable[[], None],
    logdir: Path,
    stamp: str,
) -> None:
    """Run the mode `args` asks for, filling `out` and saving it as it goes."""
    if args.soak:
        topos, out["skipped"] = select(args.soak_topologies)
        out["soak"] = [profiling.soak(cls, up, args.soak_flows, logdir) for cls in topos]
    elif args.profile:
        out["profile"] = profiling.profile(up, RESULTS, stamp, args.profile_s, logdir)
    elif args.scale:
        topos, out["skipped"] = select(args.scale_topologies)
        s = replace(s, ramp_streams=args.ramp_streams or SCALE_STREAMS, ramp_cap=SCALE_CAP)
        out["settings"] = asdict(s)
        out["scale"] = []
        for cls in topos:
            out["scale"].append(ramp(cls, up, s, logdir))
            save()
    else:
        topos, out["skipped"] = select(args.topologies)
        out["settings"] = asdict(s)
        out["loads"] = []
        if not args.ramp_only:
            run_matrix(topos, up, s, logdir, rows=out["loads"], save=save, repeat=args.repeat)
        if args.ramp_only or not args.no_ramp:
            out["ramp"] = []
            for cls in topos:
                out["ramp"].append(ramp(cls, up, s, logdir))
                save()


def main() -> None:
    signal.signal(signal.SIGTERM, _terminated)
    args = parse_args()
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    modes = ("soak", "profile", "scale", "ramp_only", "quick")
    kind = next((k for k in modes if getattr(args, k)), "full").removesuffix("_only")
    if kind == "full" and args.repeat > 1:
        kind = "repeat"
    logdir = Path("/tmp") / f"hopmeter-bench-{stamp}"
    logdir.mkdir(parents=True)
    if args.scale:
        LAYOUT.unpin()
        LAYOUT.use_c_generator(logdir)
    s = QUICK if args.quick else Settings()
    if args.loads:
        s = replace(s, loads=tuple(int(n) for n in args.loads.split(",")))
    if args.ramp_streams:
        s = replace(s, ramp_streams=args.ramp_streams)
    started = time.monotonic()
    out: dict[str, Any] = {"schema": "hopmeter.bench/1", "kind": kind, "started_utc": stamp}
    out["logs"] = str(logdir)
    path = RESULTS / f"{stamp}-{kind}.json"

    def save() -> None:
        """Write what has been measured so far: a run cut short still leaves its numbers."""
        out["elapsed_s"] = round(time.monotonic() - started, 1)
        path.write_text(json.dumps(out, indent=1) + "\n")

    with procs.Upstream(logdir) as up:
        out["machine"] = machine(up)
        measure(args, s, up, out, save, logdir, stamp)
    save()
    log(f"wrote {path} in {out['elapsed_s']} s")
    if not args.no_readme:
        report.update_readme(path)
        log("updated bench/README.md")


if __name__ == "__main__":
    main()
