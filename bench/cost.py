"""hopmeter's cost against bare mitmdump, the ratios of its targets, in one run.

    python bench/cost.py                 # 3 rounds of paced + lockstep at 50 and 200 streams,
                                         # the saturation ramp and idle RSS (~25 min on a quiet VM)
    python bench/cost.py --rounds 1 --quick      # a first look (~8 min)
    HOPMETER_BENCH_BASE=/tmp/before python bench/cost.py    # and a checkout before a change
    python bench/cost.py --protocols h2 --modes paced --no-ramp   # one protocol's rows only

Each protocol is a row of the matrix, hopmeter beside bare mitmdump in the same run:
`h1` plain HTTP/1.1 on both sides, hopmeter with its relay and without it (`--no-relay`,
`hopmeter-norelay`); `tls` the client speaks HTTP/1.1 over TLS to the proxy (mitmproxy's
reverse mode answers a TLS ClientHello with its own CA's certificate), plain HTTP/1.1 upstream;
`h2` HTTP/2 over TLS from the client, the streams multiplexed (100 to a connection, what
mitmproxy announces), to an HTTP/2-over-TLS upstream (`mitmdump-h2up`, `hopmeter-h2up`: to an
HTTP/1 upstream mitmproxy opens at most 5 connections per client connection, so 50 streams on
one connection would run 5 at a time). hopmeter runs on the standard library's event loop, its
default and what bare mitmdump runs on; each row also runs it on libuv's (`--loop uvloop`:
`hopmeter-uvloop`, `hopmeter-norelay-uvloop`, `hopmeter-h2up-uvloop`; ~2 MiB more idle RSS).

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
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
import run
from procs import Topology

from harness import QUIET_CORES, Load, log, measured_load, new_run, warm

SETTLE_MAX_S = 20.0  # longest wait for an idle proxy's RSS to stop moving
SETTLE_STEP_S = 0.5
SETTLED = 0.01  # two readings a step apart within 1%: settled
# the targets: hopmeter / bare mitmdump
# (idle: MiB over bare mitmdump's idle RSS, measured in the same run)
TARGETS = {"cpu": 1.0, "p99": 1.1, "saturation": 1.0, "idle_rss_over_bare_mib": 5.0}
# and what hopmeter may add to bare mitmproxy's RSS per open stream, KiB
PER_STREAM_KIB = 24.0
# TLS: 200 connections took ~4.2 s to open through either proxy (64 ~1.2 s; quick run
# 20261205T063340Z), the last streams starting in the window and timing out; the warm-up and
# the grace grow by this much per stream (the streams grow with the warm-up: events = rate x time)
TLS_OPEN_S_PER_STREAM = 0.03
# each protocol's topologies, bare mitmproxy first (the ratios' denominator)
PROTOCOLS: dict[str, tuple[str, ...]] = {
    "h1": (
        "mitmdump",
        "hopmeter",
        "hopmeter-norelay",
        "hopmeter-uvloop",
        "hopmeter-norelay-uvloop",
        "hopmeter-base",
    ),
    "tls": ("mitmdump", "hopmeter", "hopmeter-uvloop"),
    "h2": ("mitmdump-h2up", "hopmeter-h2up", "hopmeter-h2up-uvloop"),
}


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


def ratios(out: dict[str, Any], name: str, proto: str = "h1") -> list[dict[str, Any]]:
    """Each load point's CPU and p99 ratio of `name` over bare mitmdump, spoken as `proto`."""
    rows = {
        (r.get("protocol", "h1"), r["mode"], r["streams"], r["topology"]): r for r in out["loads"]
    }
    bare_name = PROTOCOLS[proto][0]
    table = []
    for (p, mode, streams, topo), r in rows.items():
        bare = rows.get((p, mode, streams, bare_name))
        if p != proto or topo != name or bare is None:
            continue
        cpu, bare_cpu = r.get("cpu_us_per_event"), bare.get("cpu_us_per_event")
        p99, bare_p99 = r["delay_ms"]["p99"], bare["delay_ms"]["p99"]
        table.append(
            {
                "protocol": proto,
                "topology": name,
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


def point_line(r: dict[str, Any], bare_limit: float | None) -> str:
    """One load point's ratios as text, each with its target and whether it was met."""
    cpu_ok = r["cpu_ratio"] is not None and r["cpu_ratio"] <= TARGETS["cpu"]
    p99_ok = r["p99_ratio"] is not None and r["p99_ratio"] <= TARGETS["p99"]
    return (
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


def summary(out: dict[str, Any]) -> list[str]:
    """The ratios as lines of text, each with its target and whether it was met."""
    lines = []
    ramps = {r["topology"]: r for r in out.get("ramp", [])}
    bare_sat = ramps.get("mitmdump")
    bare_limit = bare_sat["saturation_events_per_s"] if bare_sat else None
    idle = out.get("idle_rss_mib", {})
    for proto, names in PROTOCOLS.items():
        measured = {r["topology"] for r in out["loads"] if r.get("protocol", "h1") == proto}
        for name in [n for n in names[1:] if n in measured]:
            lines.append(f"{proto}: {name} / {names[0]}:")
            limit = bare_limit if proto == "h1" else None
            lines += [point_line(r, limit) for r in ratios(out, name, proto)]
            sat = ramps.get(name)
            if proto == "h1" and sat is not None and bare_sat is not None:
                a, b = sat["saturation_events_per_s"], bare_sat["saturation_events_per_s"]
                ratio = round(a / b, 3) if a and b else None
                ok = ratio is not None and ratio >= TARGETS["saturation"]
                lines.append(
                    f"  saturation {a} vs {b} events/s = {ratio}× "
                    f"({'met' if ok else 'NOT met'}, ≥ {TARGETS['saturation']})"
                )
            if proto == "h1" and name in idle and "mitmdump" in idle:
                over = round(idle[name] - idle["mitmdump"], 1)
                ok = over <= TARGETS["idle_rss_over_bare_mib"]
                lines.append(
                    f"  idle RSS {idle[name]} MiB, bare mitmdump {idle['mitmdump']}: +{over} "
                    f"({'met' if ok else 'NOT met'}, ≤ +{TARGETS['idle_rss_over_bare_mib']} MiB)"
                )
    return lines


def markdown(out: dict[str, Any]) -> list[str]:
    """The rows' CPU per event and delay p99 against bare's, a Markdown table for the README."""
    points = sorted({(r["mode"], r["streams"]) for r in out["loads"]}, key=lambda p: p[::-1])
    head = " | ".join(f"{mode} {streams}" for mode, streams in points)
    lines = [f"| row | figure | {head} |", "| --- | --- |" + " ---: |" * len(points)]
    for proto, names in PROTOCOLS.items():
        for name in names[1:]:
            found = {(r["mode"], r["streams"]): r for r in ratios(out, name, proto)}
            if not found:
                continue
            label = f"{proto}: {name} / {names[0]}"
            for figure, key, ratio, unit in (
                ("CPU per event", "cpu_us", "cpu_ratio", " µs"),
                ("delay p99", "p99_ms", "p99_ratio", " ms"),
            ):
                cells = []
                for p in points:
                    r = found.get(p)
                    if r is None:
                        cells.append("")
                        continue
                    a, b = r[key]
                    cells.append(f"{_num(a)} / {_num(b)}{unit} = {r[ratio]}×")
                lines.append(f"| {label} | {figure} | " + " | ".join(cells) + " |")
    return lines


def _num(x: float | None) -> str:
    """Three significant digits or so: what a table of shared-machine figures can carry."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def attempts(
    cls: type[Topology], up: Any, load: Load, logdir: Path, proto: str
) -> list[dict[str, Any]]:
    """bench/run.py's `attempts`, the proxy warmed in the load's own protocol (an HTTP/2
    upstream answers no plain HTTP/1 warm-up)."""
    tries: list[dict[str, Any]] = []
    while len(tries) <= run.RETRIES:
        with cls(up.port, logdir) as topo:
            warm(topo, proto)
            before = run.record_count(topo)
            r = measured_load(topo, load, up.pid)
            check = run.hopmeter_check(topo, before)
        if check:
            r["hopmeter_recorded"] = check
        r["attempt"] = len(tries) + 1
        tries.append(r)
        if r["background_cores"] <= QUIET_CORES:
            break
        log(f"  disturbed: {r['background_cores']} cores of other work")
    return tries


def matrix(  # noqa: PLR0917 - the run's state, handed over from main
    plan: list[tuple[str, list[type[Topology]]]],
    up: procs.Upstream,
    s: run.Settings,
    logdir: Path,
    rows: list[dict[str, Any]],
    save: Any,
    repeat: int,
) -> None:
    """Every protocol's load points through its topologies, `repeat` rounds taking turns (A B A
    B), each row the median round (bench/run.py's `median_round`), saved as soon as measured."""
    h2_up = SimpleNamespace(port=up.h2_port, pid=up.pid)
    for proto, topos in plan:
        target = h2_up if proto == "h2" else up
        for mode in s.modes:
            for streams in s.loads:
                # TLS connections open slower: the measured window starts after them, and the
                # streams opened last get as long to finish
                extra = TLS_OPEN_S_PER_STREAM * streams if proto == "tls" else 0.0
                load = Load(
                    *(streams, s.rate, mode, s.warmup_s + extra, s.measure_s),
                    *(s.grace_s + extra, proto),
                )
                rounds: dict[str, list[dict[str, Any]]] = {cls.name: [] for cls in topos}
                for n in range(repeat):
                    for cls in topos:
                        log(f"{proto} {mode} {streams} streams via {cls.name} (round {n + 1})")
                        tries = attempts(cls, target, load, logdir, proto)
                        r = min(tries, key=lambda r: float(r["background_cores"]))
                        rounds[cls.name].append(r)
                        log(
                            f"  delay p50/p99/max {run.fmt_delay(r)} cpu/event "
                            f"{r.get('cpu_us_per_event')} outcomes {r['outcomes']}"
                        )
                for cls in topos:
                    row = run.median_round(rounds[cls.name])
                    rows.append({"topology": cls.name, "protocol": proto, **row})
                    save()


def choose(protocols: str) -> tuple[list[tuple[str, list[type[Topology]]]], list[dict[str, str]]]:
    """Each asked protocol with the topologies that can run here, and those skipped, why."""
    plan, skipped = [], []
    for proto in protocols.split(","):
        chosen = []
        for name in PROTOCOLS[proto]:
            cls = procs.COST_TOPOLOGIES[name]
            why = cls(0, Path()).available()
            if why:
                skipped.append({"protocol": proto, "topology": name, "reason": why})
            else:
                chosen.append(cls)
        plan.append((proto, chosen))
    return plan, skipped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per load point (medians)")
    p.add_argument("--quick", action="store_true", help="shorter loads and ramp")
    p.add_argument("--protocols", default="h1,tls,h2", help="rows: h1, tls, h2 (see above)")
    p.add_argument("--modes", default="paced,lockstep")
    p.add_argument("--streams", default="50,200", help="the load points' stream counts")
    p.add_argument("--no-ramp", action="store_true", help="skip the saturation ramp")
    args = p.parse_args()
    stamp, logdir = new_run()
    s = replace(
        run.QUICK if args.quick else run.Settings(),
        loads=tuple(int(n) for n in args.streams.split(",")),
        modes=tuple(args.modes.split(",")),
    )
    plan, skipped = choose(args.protocols)
    h1 = next((topos for proto, topos in plan if proto == "h1"), [])
    path = run.RESULTS / f"{stamp}-cost.json"
    out: dict[str, Any] = {"schema": "hopmeter.bench/1", "kind": "cost", "started_utc": stamp}
    out.update(settings=asdict(s), rounds=args.rounds, skipped=skipped, logs=str(logdir))
    out["protocols"] = {proto: [cls.name for cls in topos] for proto, topos in plan}
    out["load_average_before"] = os.getloadavg()
    started = time.monotonic()

    def save() -> None:
        out["elapsed_s"] = round(time.monotonic() - started, 1)
        out["load_average_now"] = os.getloadavg()
        path.write_text(json.dumps(out, indent=1) + "\n")

    with procs.Upstream(logdir) as up:
        out["machine"] = run.machine(up)
        rss: dict[str, list[int]] = {cls.name: [] for cls in h1}
        for _ in range(args.rounds):
            for cls in h1:
                rss[cls.name].append(idle_rss_kib(cls, up, logdir))
        out["idle_rss_mib"] = {k: round(statistics.median(v) / 1024, 1) for k, v in rss.items()}
        out["idle_rss_rounds_kib"] = rss
        save()
        out["loads"] = []
        matrix(plan, up, s, logdir, out["loads"], save, args.rounds)
        if not args.no_ramp:
            out["ramp"] = []
            for cls in h1:
                out["ramp"].append(run.ramp(cls, up, s, logdir))
                save()
    out["load_average_after"] = os.getloadavg()
    out["summary"] = summary(out)
    out["table"] = markdown(out)
    save()
    print("\n".join([*out["summary"], "", *out["table"]]))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
