"""The end of a long flow: how long the other streams wait while the proxy finishes it.

    python bench/long_end.py            # hopmeter and bare mitmdump, 3 rounds taking turns
    HOPMETER_BENCH_BASE=/tmp/base python bench/long_end.py --topologies hopmeter,hopmeter-base

hopmeter builds a flow's record when the flow ends: its tokens counted, its figures, delivery
summary and findings computed over every event. For a long reply that is tens of milliseconds of
Python; on the loop every stream shares, every other stream would wait that long.

Each round starts the proxy fresh (bench/procs.py's topologies), warms it, then runs two loads
through it at once: `--short` paced streams of 50 events a second (bench/client.py `load`; their
delay is what is measured, over an 8 s window after a 1.5 s warm-up), and from 2 s into that
window `--long` streams of `--long-events` events each at 1,000 events a second (not measured),
which end together mid-window. The figure is the short streams' added delay (p50, p99, max: the
time from the upstream's send to the client's read), the median round's per topology, beside bare
mitmdump, whose streams wait for nothing at a flow's end; and from hopmeter's records of the short
flows, the longest of its own steps on the loop while they streamed and the loop's largest lag
(`delivery.own_step_max_s`, `loop_lag_max_s`), the worst over the flows. Writes
bench/results/<UTC time>-long_end.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs

from harness import Load, client, log, wait_quiet, warm

BENCH = Path(__file__).resolve().parent
SHORT = Load(streams=20, rate=50.0, mode="paced", warmup_s=1.5, measure_s=8.0, grace_s=3.0)
LONG_RATE = 1000.0  # events a second of each long stream: it ends ~4 s after it starts
LONG_AFTER_S = SHORT.warmup_s + 2.0  # the long streams start this long after the short ones


def one_round(cls: type[procs.Topology], up: procs.Upstream, args: argparse.Namespace) -> Any:
    """One fresh proxy: the short streams' delay percentiles, with the long ones ending."""
    short = replace(SHORT, streams=args.short)
    long = Load(
        streams=args.long,
        rate=LONG_RATE,
        mode="paced",
        warmup_s=0.0,
        measure_s=args.long_events / LONG_RATE,
        grace_s=10.0,
    )
    with cls(up.port, Path(args.logdir)) as topo:
        warm(topo)
        waited = wait_quiet([*topo.pids(), up.pid])
        records = getattr(topo, "records", None)
        seen = _lines(records)
        longs: dict[str, Any] = {}

        def run_long() -> None:
            time.sleep(LONG_AFTER_S)
            longs.update(client(long.args(topo.port)))

        thread = threading.Thread(target=run_long)
        thread.start()
        shorts = client(short.args(topo.port))
        thread.join()
        time.sleep(1.0)  # the last records written
        own = _own_steps(records, seen, args.long_events)
    return {
        "short": shorts["delay_ms"],
        "short_outcomes": shorts["outcomes"],
        "long": longs,
        "hopmeter_own": own,
        "waited_for_quiet_s": waited,
    }


def _lines(path: Path | None) -> int:
    """Records written so far (none without a records file)."""
    if path is None or not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _own_steps(path: Path | None, skip: int, long_events: int) -> dict[str, Any] | None:
    """From hopmeter's records of this round's short flows: the longest of its own steps on the
    loop while each streamed (`delivery.own_step_max_s`), and the loop's largest lag
    (`delivery.loop_lag_max_s`), the worst over the flows; None for a proxy without records."""
    if path is None:
        return None
    steps, lags, flows = [0.0], [0.0], 0
    with path.open("rb") as f:
        for line in itertools.islice(f, skip, None):
            rec = json.loads(line)
            events = (rec.get("figures") or {}).get("events") or 0
            if events >= long_events or "delivery" not in rec:
                continue
            flows += 1
            steps.append(rec["delivery"].get("own_step_max_s") or 0.0)
            lags.append(rec["delivery"].get("loop_lag_max_s") or 0.0)
    return {
        "short_flows": flows,
        "own_step_max_ms": 1e3 * max(steps),
        "lag_max_ms": 1e3 * max(lags),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topologies", default="hopmeter,mitmdump")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--short", type=int, default=SHORT.streams, help="measured streams")
    p.add_argument("--long", type=int, default=2, help="long streams, ending together")
    p.add_argument("--long-events", type=int, default=4000, help="events per long stream")
    p.add_argument("--note", default="")
    args = p.parse_args()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    args.logdir = f"/tmp/hopmeter-bench-{stamp}"
    Path(args.logdir).mkdir(parents=True)
    names = args.topologies.split(",")
    classes = [procs.COST_TOPOLOGIES[n] for n in names]
    for cls in classes:
        why = cls(0, Path(args.logdir)).available()
        if why:
            sys.exit(f"{cls.name}: {why}")
    rounds: dict[str, list[Any]] = {n: [] for n in names}
    with procs.Upstream(Path(args.logdir)) as up:
        for n in range(args.rounds):
            for cls in classes:
                log(f"{cls.name} (round {n + 1})")
                r = one_round(cls, up, args)
                d = r["short"]
                log(f"  short delay p50/p99/max {d['p50']:.2f}/{d['p99']:.2f}/{d['max']:.2f} ms")
                if r["hopmeter_own"]:
                    log(f"  hopmeter's own steps on the loop: {r['hopmeter_own']}")
                rounds[cls.name].append(r)
    medians = {
        name: {
            q: round(statistics.median(r["short"][q] for r in rs), 3) for q in ("p50", "p99", "max")
        }
        for name, rs in rounds.items()
    }
    for name, rs in rounds.items():
        if all(r["hopmeter_own"] for r in rs):
            for key in ("own_step_max_ms", "lag_max_ms"):
                medians[name][key] = round(statistics.median(r["hopmeter_own"][key] for r in rs), 3)
    out = {
        "schema": "hopmeter.bench/1",
        "kind": "long_end",
        "started_utc": stamp,
        "note": args.note,
        "method": __doc__,
        "settings": {
            "short_streams": args.short,
            "long_streams": args.long,
            "long_events": args.long_events,
            "rounds": args.rounds,
        },
        "rounds": rounds,
        "medians_ms": medians,
    }
    path = BENCH / "results" / f"{stamp}-long_end.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for name, m in medians.items():
        own = (
            f"; hopmeter's longest own step {m['own_step_max_ms']} ms,"
            f" loop lag {m['lag_max_ms']} ms"
            if "own_step_max_ms" in m
            else ""
        )
        log(
            f"{name}: short streams' delay p50 {m['p50']} ms, p99 {m['p99']} ms,"
            f" max {m['max']} ms{own}"
        )
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
