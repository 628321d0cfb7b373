"""hopmeter's cost against bare mitmdump, the ratios of its targets, in one run.

    python bench/cost.py                 # 3 rounds of paced + lockstep at 50 and 200 streams,
                                         # the saturation ramp and idle RSS (~25 min on a quiet VM)
    python bench/cost.py --rounds 1 --quick      # a first look (~8 min)
    HOPMETER_BENCH_BASE=/tmp/before python bench/cost.py    # and a checkout before a change

Ratios are hopmeter over bare mitmproxy (`mitmdump -q -s bench/bare_addon.py`) in the same run,
the topologies taking turns (bench/run.py's matrix, `--repeat`): CPU per event (the median-CPU
round), added delay p99 (the median of the rounds' p99), the saturation rate (events/s before
p99 passes 10 ms, 100 paced streams), idle RSS: the process tree's VmRSS once it listens and
has settled, before any flow (the median of `--rounds` fresh starts), and RSS per open stream at
each load point (bench/README.md, "RSS per open stream"; the median round's): hopmeter's part is
its figure less bare mitmproxy's, which is what mitmproxy itself holds for a connection. Writes
bench/results/<time>-cost.json and prints the table; bench/README.md is not rewritten.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
import run
from procs import Topology

from harness import log

SETTLE_MAX_S = 20.0  # longest wait for an idle proxy's RSS to stop moving
SETTLE_STEP_S = 0.5
SETTLED = 0.01  # two readings a step apart within 1%: settled
# the targets: hopmeter / bare mitmdump
TARGETS = {"cpu": 1.0, "p99": 1.1, "saturation": 1.0, "idle_rss_mib": 80.0}
# and what hopmeter may add to bare mitmproxy's RSS per open stream, KiB
PER_STREAM_KIB = 24.0


def idle_rss_kib(cls: type[Topology], up: procs.Upstream, logdir: Path) -> int:
    """VmRSS of a fresh proxy's process tree once it listens and its RSS stopped moving."""
    with cls(up.port, logdir) as topo:
        last, deadline = procs.rss_kib(topo.pids()), time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline:
            time.sleep(SETTLE_STEP_S)
            now = procs.rss_kib(topo.pids())
            if abs(now - last) <= SETTLED * last:
                return now
            last = now
        return last


def ratios(out: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Each load point's CPU and p99 ratio of `name` over mitmdump."""
    rows = {(r["mode"], r["streams"], r["topology"]): r for r in out["loads"]}
    table = []
    for (mode, streams, topo), r in rows.items():
        bare = rows.get((mode, streams, "mitmdump"))
        if topo != name or bare is None:
            continue
        cpu, bare_cpu = r.get("cpu_us_per_event"), bare.get("cpu_us_per_event")
        p99, bare_p99 = r["delay_ms"]["p99"], bare["delay_ms"]["p99"]
        table.append(
            {
                "mode": mode,
                "streams": streams,
                "events_per_s": streams * r["rate"],
                "cpu_us": [cpu, bare_cpu],
                "cpu_ratio": round(cpu / bare_cpu, 3) if cpu and bare_cpu else None,
                "p99_ms": [round(p99, 3), round(bare_p99, 3)],
                "p99_ratio": round(p99 / bare_p99, 3) if p99 and bare_p99 else None,
                # whether timers woke the proxy more often than bare (bench/procs.py `wakeups`)
                "wakeups": [r.get("wakeups_per_event"), bare.get("wakeups_per_event")],
                "rss_per_stream_kib": [r.get("rss_per_stream_kib"), bare.get("rss_per_stream_kib")],
            }
        )
    return table


def per_stream(kib: float | None, bare_kib: float | None) -> str:
    """RSS per open stream against bare's, and whether hopmeter's part is within its target."""
    if kib is None or bare_kib is None:
        return "RSS/stream not measured"
    part = round(kib - bare_kib, 1)
    ok = part <= PER_STREAM_KIB
    return (
        f"RSS/stream {kib} vs {bare_kib} KiB = {part:+} ({'met' if ok else 'NOT met'}, "
        f"≤ +{PER_STREAM_KIB} over bare)"
    )


def summary(out: dict[str, Any]) -> list[str]:
    """The ratios as lines of text, each with its target and whether it was met."""
    lines = []
    bare_sat = next(r for r in out["ramp"] if r["topology"] == "mitmdump")
    bare_limit = bare_sat["saturation_events_per_s"]
    bare_rss = out["idle_rss_mib"]["mitmdump"]
    for name in [t for t in out["idle_rss_mib"] if t != "mitmdump"]:
        lines.append(f"{name} / mitmdump:")
        for r in ratios(out, name):
            cpu_ok = r["cpu_ratio"] is not None and r["cpu_ratio"] <= TARGETS["cpu"]
            p99_ok = r["p99_ratio"] is not None and r["p99_ratio"] <= TARGETS["p99"]
            lines.append(
                f"  {r['mode']:8} {r['streams']:3} streams: CPU/event {r['cpu_us'][0]} vs "
                f"{r['cpu_us'][1]} µs = {r['cpu_ratio']}× ({'met' if cpu_ok else 'NOT met'}, "
                f"≤ {TARGETS['cpu']}); p99 {r['p99_ms'][0]} vs {r['p99_ms'][1]} ms = "
                f"{r['p99_ratio']}× ({'met' if p99_ok else 'NOT met'}, ≤ {TARGETS['p99']}); "
                f"wake-ups/event {r['wakeups'][0]} vs {r['wakeups'][1]}; "
                + per_stream(*r["rss_per_stream_kib"])
                + (
                    # a proxy behind reads several events per read: its CPU per event drops
                    "; bare is past its saturation at this rate"
                    if bare_limit and r["events_per_s"] > bare_limit
                    else ""
                )
            )
        sat = next(r for r in out["ramp"] if r["topology"] == name)
        a, b = sat["saturation_events_per_s"], bare_sat["saturation_events_per_s"]
        ratio = round(a / b, 3) if a and b else None
        ok = ratio is not None and ratio >= TARGETS["saturation"]
        lines.append(
            f"  saturation {a} vs {b} events/s = {ratio}× ({'met' if ok else 'NOT met'}, "
            f"≥ {TARGETS['saturation']})"
        )
        rss = out["idle_rss_mib"][name]
        ok = rss <= TARGETS["idle_rss_mib"]
        lines.append(
            f"  idle RSS {rss} MiB (bare mitmdump {bare_rss}; {'met' if ok else 'NOT met'}, "
            f"≤ {TARGETS['idle_rss_mib']} MiB)"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per load point (medians)")
    p.add_argument("--quick", action="store_true", help="shorter loads and ramp")
    p.add_argument("--topologies", default="mitmdump,hopmeter,hopmeter-base")
    args = p.parse_args()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    logdir = Path("/tmp") / f"hopmeter-bench-{stamp}"
    logdir.mkdir(parents=True)
    s = replace(run.QUICK if args.quick else run.Settings(), loads=(50, 200))
    topos, skipped = run.select(args.topologies)
    path = run.RESULTS / f"{stamp}-cost.json"
    out: dict[str, Any] = {"schema": "hopmeter.bench/1", "kind": "cost", "started_utc": stamp}
    out.update(settings=asdict(s), rounds=args.rounds, skipped=skipped, logs=str(logdir))
    started = time.monotonic()

    def save() -> None:
        out["elapsed_s"] = round(time.monotonic() - started, 1)
        path.write_text(json.dumps(out, indent=1) + "\n")

    with procs.Upstream(logdir) as up:
        out["machine"] = run.machine(up)
        rss: dict[str, list[int]] = {cls.name: [] for cls in topos}
        for _ in range(args.rounds):
            for cls in topos:
                rss[cls.name].append(idle_rss_kib(cls, up, logdir))
        out["idle_rss_mib"] = {k: round(statistics.median(v) / 1024, 1) for k, v in rss.items()}
        out["idle_rss_rounds_kib"] = rss
        save()
        out["loads"] = []
        run.run_matrix(topos, up, s, logdir, rows=out["loads"], save=save, repeat=args.rounds)
        out["ramp"] = []
        for cls in topos:
            out["ramp"].append(run.ramp(cls, up, s, logdir))
            save()
    out["summary"] = summary(out)
    save()
    print("\n".join(out["summary"]))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
