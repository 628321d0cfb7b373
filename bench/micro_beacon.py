"""Micro-benchmark of a browser beacon's cost on the proxy's loop: parse, then join to its record.

    python bench/micro_beacon.py           # table on stdout, JSON in bench/results/
    python bench/micro_beacon.py --json    # the JSON on stdout too

A beacon is answered in the `request` hook, on the event loop every stream shares: its JSON is
parsed and checked (hopmeter.core.beacon.parse_beacon), then, once, joined to its record
(hopmeter.core.browser.join_beacon: the client findings' evidence, two alignments). Beacons are
made here as the snippet makes them (delta-coded 0.1 ms ticks) for replies of three sizes: the
demo's 120 tokens at 50/s, a 700-token reply, and the largest that fits the 64 KiB a beacon may
carry (the snippet merges neighbours past it). CPU
time per call (time.thread_time), median of many rounds. The rate bound of the beacon endpoint
(hopmeter.proxy.addon.browser_meter.RATE_PER_S) is chosen against these numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addons"))

from hopmeter.core.beacon import MAX_BEACON_BYTES, MAX_ENTRIES, parse_beacon
from hopmeter.core.browser import join_beacon

RESULTS = Path(__file__).resolve().parent / "results"
T0_MS = 1_733_000_000_000.0
FRAME_MS = 1000 / 60
CHARS = 5  # per token


def deltas(xs: list[int]) -> list[int]:
    return [b - a for a, b in zip([0, *xs[:-1]], xs, strict=True)]


def make(tokens: int, gap_ms: float) -> tuple[bytes, dict[str, Any]]:
    """A beacon (as sent) and its record, for a reply of `tokens`, one read per token."""
    reads = [100 + i * gap_ms for i in range(tokens)]
    frames: list[tuple[float, float, float, int]] = []
    k = 0
    shown = 0
    while k * FRAME_MS <= reads[-1] + 3 * FRAME_MS and len(frames) < MAX_ENTRIES:
        raf = k * FRAME_MS
        k += 1
        chars = CHARS * sum(1 for t in reads if t <= raf)
        if chars != shown:
            frames.append((raf + 1.2, raf, raf + 0.3, chars))
            shown = chars
    ticks = [round(t * 10) for t in reads]
    painted = [round(f[0] * 10) for f in frames]
    doc = {
        "schema": "hopmeter.beacon/1",
        "traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
        "url": "/v1/chat/completions",
        "t0": T0_MS,
        "status": 200,
        "headers": 600,
        "end": ticks[-1] + 10,
        "how": "done",
        "sent": ticks[-1] + 12000,
        "rt": [20, 580],
        "reads": {"t": deltas(ticks), "bytes": [80] * tokens, "chars": [CHARS] * tokens},
        "stream": {"bytes": 80 * tokens, "chars": CHARS * tokens, "shown": CHARS * tokens,
                   "fffd": 0},
        "screen": {
            "t": deltas(painted),
            "raf": [12] * len(frames),
            "write": [9] * len(frames),
            "chars": deltas([f[3] for f in frames]),
            "tasks": [1] * len(frames),
            "removed": [0] * len(frames),
        },
    }  # fmt: skip
    t_start = T0_MS / 1000 + 0.005
    record = {
        "trace_id": "ab" * 16,
        "hop": "edge",
        "request": {"t_start": t_start},
        "response": {"t_headers": t_start + 0.05},
        "events": [[(T0_MS + t) / 1000 - 0.0005 - t_start, 1, CHARS * (i + 1)]
                   for i, t in enumerate(reads)],
        "stream": {},
    }  # fmt: skip
    return orjson.dumps(doc), record


def largest(gap_ms: float) -> int:
    """The most tokens (a read each, a frame about each) whose beacon fits 64 KiB and the
    entry limit."""
    lo, hi = 100, MAX_ENTRIES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(make(mid, gap_ms)[0]) <= MAX_BEACON_BYTES:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cpu_ms(fn: Any, rounds: int) -> float:
    """The median CPU time of `fn()` in ms."""
    samples = []
    for _ in range(rounds):
        t0 = time.thread_time()
        fn()
        samples.append((time.thread_time() - t0) * 1000)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    full = largest(17.0)
    cases = {"120 tokens at 50/s": (120, 20.0), "700 tokens at 100/s": (700, 10.0),
             f"a full beacon: {full} tokens": (full, 17.0)}  # fmt: skip
    received = T0_MS / 1000 + 30.0
    rows = []
    for name, (tokens, gap) in cases.items():
        body, record = make(tokens, gap)
        beacon = parse_beacon(body)
        rounds = 200 if tokens < 1000 else 40
        parse = cpu_ms(lambda body=body: parse_beacon(body), rounds)
        join = cpu_ms(lambda b=beacon, r=record, at=received: join_beacon(r, b, at), rounds)
        frames = len(beacon.screen.t_ms) if beacon.screen else 0
        rows.append({"case": name, "beacon_bytes": len(body), "reads": tokens, "frames": frames,
                     "parse_ms": round(parse, 3), "join_ms": round(join, 3),
                     "total_ms": round(parse + join, 3)})  # fmt: skip
    print(
        f"{'case':26} {'bytes':>7} {'reads':>6} {'frames':>6} {'parse':>8} {'join':>8} {'total':>8}"
    )
    for r in rows:
        print(f"{r['case']:26} {r['beacon_bytes']:7} {r['reads']:6} {r['frames']:6} "
              f"{r['parse_ms']:7.2f}ms {r['join_ms']:7.2f}ms {r['total_ms']:7.2f}ms")  # fmt: skip
    out = {
        "bench": "micro_beacon",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cases": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out['when']}-micro_beacon.json").write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
