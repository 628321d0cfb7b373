"""Idle RSS of `hopmeter run` against bare mitmdump: after start-up, and after one flow.

    python bench/idle_memory.py              # 3 fresh starts of each, taking turns
    python bench/idle_memory.py --rounds 5 --topologies mitmdump,hopmeter,hopmeter-base

Each round starts a proxy fresh (bench/procs.py's topologies: `mitmdump -q -s
bench/bare_addon.py`, and `hopmeter run` with records and metrics on), waits until it listens
and its process tree's VmRSS stops moving ("start"), sends one short stream through it (bench/
harness.py's warm-up load: one stream of 20 events) and waits for RSS to settle again ("flow").
The second figure is the one that counts: memory deferred from start-up to the first flow is
still memory. The token table's part of it is read apart (`flow_table_kib`, from smaps): how much
of its file a flow maps depends on how the host's page cache holds the file as well (a file
written in one call, as hopmeter wrote it before, maps whole: ~4 MiB). HOPMETER_CACHE_DIR points
hopmeter at another cache, where the first start builds its table. Writes
bench/results/<time>-idle_memory.json with every round and the medians, and prints hopmeter's
figures over bare's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from procs import Topology

from harness import log, new_run, warm

SETTLE_MAX_S = 20.0  # longest wait for an idle proxy's RSS to stop moving
SETTLE_STEP_S = 0.5
SETTLED_KIB = 64  # two readings a step apart within this: settled (a page table's worth)
TARGET_MIB = 5.0  # hopmeter may idle this much above bare mitmdump


def settled_rss_kib(topo: Topology) -> int:
    """The process tree's VmRSS once two readings a step apart agree (bounded wait)."""
    last, deadline = procs.rss_kib(topo.pids()), time.monotonic() + SETTLE_MAX_S
    while time.monotonic() < deadline:
        time.sleep(SETTLE_STEP_S)
        now = procs.rss_kib(topo.pids())
        if abs(now - last) <= SETTLED_KIB:
            return now
        last = now
    return last


def table_kib(pids: list[int]) -> int:
    """How much of these processes' RSS is the token table's file (hopmeter/core/bpe.py), KiB.

    Its share depends on the host as well as on hopmeter: a fault maps the page cache's whole
    piece of the file, and how large the pieces are depends on how the file came into the cache
    (hopmeter.proxy.addon.tokenizers._write_and_map)."""
    total = 0
    for pid in pids:
        inside = False
        with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                    inside = fields[-1].endswith(".bpe")
                elif inside and fields[0] == "Rss:":
                    total += int(fields[1])
    return total


def one_round(cls: type[Topology], up: procs.Upstream, logdir: Path) -> dict[str, int]:
    """A fresh proxy's settled RSS after start-up and after one short stream, KiB, and the
    token table's part of the second."""
    with cls(up.port, logdir) as topo:
        start = settled_rss_kib(topo)
        warm(topo)
        flow = settled_rss_kib(topo)
        table = table_kib(topo.pids())
    return {"start_kib": start, "flow_kib": flow, "flow_table_kib": table}


def median_mib(rounds: list[dict[str, int]], key: str) -> float:
    return round(statistics.median(r[key] for r in rounds) / 1024, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="fresh starts of each (medians)")
    p.add_argument("--topologies", default="mitmdump,hopmeter")
    p.add_argument("--note", default="", help="what was measured, for the results file")
    args = p.parse_args()
    stamp, logdir = new_run()
    topos = [procs.COST_TOPOLOGIES[name] for name in args.topologies.split(",")]
    topos = [cls for cls in topos if cls(0, Path()).available() is None]
    rounds: dict[str, list[dict[str, int]]] = {cls.name: [] for cls in topos}
    out: dict[str, Any] = {"schema": "hopmeter.bench/1", "kind": "idle_memory"}
    out.update(started_utc=stamp, note=args.note, rounds=rounds)
    # the token table's file: how the page cache holds it decides how much a flow maps
    out.update(table_cache=os.environ.get("HOPMETER_CACHE_DIR", "~/.cache/hopmeter"))
    out["load_average_before"] = os.getloadavg()
    with procs.Upstream(logdir) as up:
        for n in range(args.rounds):
            for cls in topos:
                rounds[cls.name].append(one_round(cls, up, logdir))
                log(f"round {n + 1} {cls.name}: {rounds[cls.name][-1]}")
    out["load_average_after"] = os.getloadavg()
    out["median_mib"] = {
        name: {"start": median_mib(rs, "start_kib"), "flow": median_mib(rs, "flow_kib")}
        for name, rs in rounds.items()
    }
    bare = out["median_mib"].get("mitmdump")
    lines = []
    for name, m in out["median_mib"].items():
        if name == "mitmdump" or bare is None:
            continue
        over = {k: round(m[k] - bare[k], 1) for k in ("start", "flow")}
        out.setdefault("over_bare_mib", {})[name] = over
        met = "met" if over["flow"] <= TARGET_MIB else "NOT met"
        table = statistics.median(r.get("flow_table_kib", 0) for r in rounds[name])
        lines.append(
            f"{name}: start {m['start']} MiB (bare {bare['start']}, {over['start']:+}), after one "
            f"flow {m['flow']} MiB (bare {bare['flow']}, {over['flow']:+}; {met}, ≤ +{TARGET_MIB};"
            f" the token table {table:.0f} KiB of it)"
        )
    out["summary"] = lines
    path = procs.BENCH / "results" / f"{stamp}-idle_memory.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
