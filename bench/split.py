"""Where hopmeter's cost over bare mitmproxy goes on mitmproxy's own path (`--no-relay`).

    python bench/split.py                     # 50 and 200 streams, paced and lockstep, 3 rounds
    python bench/split.py --streams 50 --modes paced --rounds 5

`bench/cost.py` compares `hopmeter run --no-relay` with bare mitmdump as a whole. This runs the
same loads through four `hopmeter run --no-relay` processes that differ in what they do, each
beside bare mitmdump in the same run (the topologies taking turns, A B C D E A B ...):

- `plumbing`: the hooks, the stream callable, the flow's end, its record and metrics, with no
  response measured and no chunk followed out (bench/split_site: `HOPMETER_BENCH_OFF=measure,
  delivery`);
- `delivery`: plumbing, and each chunk followed out to the client (the write counter on the
  client's connection, the looks at its queues);
- `measure`: plumbing, and each response measured (the meter: SSE, the API's chunks, tokens,
  figures, detectors) with no chunk followed out;
- `full`: `hopmeter run --no-relay` as it ships.

Each part's cost is its row less `plumbing`'s, plumbing's is its row less bare's; the parts need
not add up to `full` exactly (the machine's spread between rounds is ±10-15% of a row). Writes
bench/results/<UTC time>-split.json and prints a table of CPU per event and added p99.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import cost
import procs
import run

from harness import Load, log, new_run

SITE = Path(__file__).resolve().parent / "split_site"


class _Part(procs.HopmeterNoRelay):
    """hopmeter run --no-relay with bench/split_site turning `off` parts off."""

    off = ""

    def environment(self) -> dict[str, str] | None:
        path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
        return dict(os.environ, PYTHONPATH=path, HOPMETER_BENCH_OFF=self.off)


class Plumbing(_Part):
    name, label, off = (
        "plumbing",
        "hopmeter --no-relay, nothing measured or followed",
        ("measure,delivery"),
    )


class DeliveryOnly(_Part):
    name, label, off = (
        "delivery",
        "hopmeter --no-relay, chunks followed, nothing measured",
        ("measure"),
    )


class MeasureOnly(_Part):
    name, label, off = "measure", "hopmeter --no-relay, measured, no chunk followed", "delivery"


class Full(_Part):
    name, label, off = "full", "hopmeter --no-relay", ""


TOPOLOGIES: tuple[type[procs.Topology], ...] = (
    procs.COST_TOPOLOGIES["mitmdump"],
    Plumbing,
    DeliveryOnly,
    MeasureOnly,
    Full,
)


def parts(rows: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """CPU per event each part adds: plumbing over bare, the others over plumbing."""

    def cpu(name: str) -> float | None:
        return rows[name].get("cpu_us_per_event")

    def less(a: str, b: str) -> float | None:
        x, y = cpu(a), cpu(b)
        return None if x is None or y is None else round(x - y, 1)

    return {
        "plumbing": less("plumbing", "mitmdump"),
        "delivery": less("delivery", "plumbing"),
        "measure": less("measure", "plumbing"),
        "full": less("full", "mitmdump"),
    }


def table(points: list[dict[str, Any]]) -> list[str]:
    """A markdown table: each point's CPU per event (and p99) per topology, then the parts."""
    names = [cls.name for cls in TOPOLOGIES]
    head = "| load | " + " | ".join(names) + " | plumbing | + delivery | + measure | full |"
    lines = [head, "|" + "---|" * (len(names) + 5)]
    for pt in points:
        rows = pt["rows"]
        cells = [
            f"{rows[n].get('cpu_us_per_event')} µs ({rows[n]['delay_ms']['p99']:.2f} ms)"
            for n in names
        ]
        added = [
            "-" if v is None else f"{v:+.1f}"
            for v in (pt["parts"][k] for k in ("plumbing", "delivery", "measure", "full"))
        ]
        lines.append(f"| {pt['mode']} {pt['streams']} | " + " | ".join([*cells, *added]) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per load point (medians)")
    p.add_argument("--modes", default="paced,lockstep")
    p.add_argument("--streams", default="50,200", help="the load points' stream counts")
    args = p.parse_args()
    stamp, logdir = new_run()
    s = replace(
        run.Settings(),
        loads=tuple(int(n) for n in args.streams.split(",")),
        modes=tuple(args.modes.split(",")),
    )
    path = run.RESULTS / f"{stamp}-split.json"
    out: dict[str, Any] = {"schema": "hopmeter.bench/1", "kind": "split", "started_utc": stamp}
    out.update(method=__doc__.split("\n\n", 2)[2].strip(), settings=asdict(s))
    out.update(rounds=args.rounds, logs=str(logdir), points=[])
    out["topologies"] = {cls.name: cls.label for cls in TOPOLOGIES}
    out["load_average_before"] = os.getloadavg()
    started = time.monotonic()

    def save() -> None:
        out["elapsed_s"] = round(time.monotonic() - started, 1)
        path.write_text(json.dumps(out, indent=1) + "\n")

    with procs.Upstream(logdir) as up:
        out["machine"] = run.machine(up)
        for mode in s.modes:
            for streams in s.loads:
                load = Load(streams, s.rate, mode, s.warmup_s, s.measure_s, s.grace_s)
                rounds: dict[str, list[dict[str, Any]]] = {cls.name: [] for cls in TOPOLOGIES}
                for n in range(args.rounds):
                    for cls in TOPOLOGIES:
                        log(f"{mode} {streams} streams via {cls.name} (round {n + 1})")
                        tries = cost.attempts(cls, up, load, logdir, "h1")
                        r = min(tries, key=lambda r: float(r["background_cores"]))
                        rounds[cls.name].append(r)
                        log(f"  cpu/event {r.get('cpu_us_per_event')} p99 {run.fmt_delay(r)}")
                rows = {name: run.median_round(rs) for name, rs in rounds.items()}
                point: dict[str, Any] = {"mode": mode, "streams": streams, "rows": rows}
                point["parts"] = parts(rows)  # each row keeps its rounds (run.median_round)
                out["points"].append(point)
                save()
    out["load_average_after"] = os.getloadavg()
    out["table"] = table(out["points"])
    save()
    print("\n".join(out["table"]))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
