"""Micro-benchmark of what writing one record and one log line costs the proxy's event loop.

    python bench/micro_outputs.py           # table on stdout, JSON in bench/results/
    python bench/micro_outputs.py --json    # the JSON on stdout too

A finished flow is one record line (here a real one: `record.finish` on a 175-event OpenAI chat
stream, orjson-encoded, ~2 KiB) and, by default, one console line through the log. Before,
both were written on the event loop: `write` + `flush` to the records file (or a pipe), and
mitmproxy's terminal log handler's `print` to standard output. Now the loop puts each line on an
outlet (hopmeter.export.outlets) and a writer thread writes it. Each row times the loop's side
per line, in CPU (`time.thread_time`, the loop thread's alone) and in wall time
(`time.perf_counter`: what the loop was away from its streams, a write that blocks included),
and the writer thread's CPU per line (the process's CPU minus the loop thread's): the cost moved
off the loop, still paid by the process. Medians of ROUNDS rounds of LINES lines each.

Destinations: a file in a temporary folder; a pipe drained by `cat` (a log agent that keeps up);
a pipe nobody reads (a stalled agent: before, the loop blocks on the first write past the pipe's
64 KiB, so that row exists only for the new path, where lines are dropped and counted).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addons"))

from micro_feed import CHUNK, new_meter
from mitmproxy.addons.termlog import TermLogHandler

from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
from hopmeter.core.record import finish, summary_line
from hopmeter.export.outlets import Outlets
from hopmeter.proxy.addon.outlets import QueuedTermLogHandler
from hopmeter.proxy.addon.tokenizers import load_counter

RESULTS = Path(__file__).resolve().parent / "results"
EVENTS = 175  # the bench soak's flows are shorter; the cost matrix's streams carry ~175-325
LINES = 500
ROUNDS = 21


def make_record() -> dict[str, Any]:
    """A real record: hopmeter.core.record.finish on an EVENTS-event OpenAI chat stream."""
    counters = load_counter(None)
    counters.preload()
    meter = new_meter()
    for i in range(EVENTS):
        meter.feed(CHUNK, 0.1 + i * 0.02)
    meter.feed(b"data: [DONE]\n\n", 0.1 + EVENTS * 0.02)
    meter.close(0.2 + EVENTS * 0.02)
    seen = Seen(
        flow_id="f",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        hop="proxy",
        listener="proxy",
        request=RequestInfo(
            method="POST",
            scheme="http",
            host="h",
            path="/v1/chat/completions",
            t_start=1.7e9,
            t_end=1.7e9,
            bytes=80,
        ),
        response=ResponseInfo(
            status=200,
            http_version="HTTP/1.1",
            headers={"content-type": "text/event-stream"},
            t_headers_s=0.05,
        ),
        meter=meter,
        ended="complete",
        bytes_out=meter.bytes_wire,
        stall_threshold_s=0.5,
    )
    result = finish(seen, counters)
    return result.record


def measure(
    call: Callable[[], object], settle: Callable[[], object] | None = None
) -> dict[str, float]:
    """Median per line over ROUNDS rounds: the loop thread's CPU and wall µs, the writer's CPU µs
    (the process's CPU in the round, until the writer is done, minus this thread's)."""
    cpu, wall, writer = [], [], []
    for _ in range(ROUNDS):
        t_cpu, t_wall, t_proc = time.thread_time(), time.perf_counter(), time.process_time()
        for _ in range(LINES):
            call()
        loop_cpu = time.thread_time() - t_cpu
        wall.append((time.perf_counter() - t_wall) / LINES * 1e6)
        if settle is not None:
            settle()  # the writer's share of this round, before the next one starts
        mine = time.thread_time() - t_cpu
        cpu.append(loop_cpu / LINES * 1e6)
        writer.append(max(0.0, time.process_time() - t_proc - mine) / LINES * 1e6)
    return {
        "loop_cpu_us": round(statistics.median(cpu), 2),
        "loop_wall_us": round(statistics.median(wall), 2),
        "writer_cpu_us": round(statistics.median(writer), 2),
    }


def drained(outlets: Outlets) -> Callable[[], None]:
    """Wait until every outlet has written what it holds."""

    def wait() -> None:
        while any(s.queued_bytes for s in outlets.states()):
            time.sleep(0.0005)

    return wait


def cat_pipe() -> tuple[int, subprocess.Popen[bytes]]:
    """The write end of a pipe that `cat` drains to /dev/null."""
    r, w = os.pipe()
    proc = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL)
    os.close(r)
    return w, proc


def stalled_pipe() -> tuple[int, int]:
    """(read end, write end) of a pipe nobody reads, filled up first."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def log_record(text: str) -> logging.LogRecord:
    """The console's line for a flow, as a log record (what structlog hands the handler)."""
    return logging.LogRecord("hopmeter", logging.INFO, __file__, 0, text, None, None)


def to_a_file(record: dict[str, Any], tmp: Path) -> dict[str, dict[str, float]]:
    """Records to a file: written on the loop (RecordSink, before) and put on an outlet."""
    rows = {}
    with open(tmp / "before.jsonl", "ab") as f:

        def sync_file() -> None:
            f.write(orjson.dumps(record) + b"\n")
            f.flush()

        rows["record to a file, written on the loop (before)"] = measure(sync_file)
        line = orjson.dumps(record) + b"\n"

        def sync_line() -> None:
            f.write(line)
            f.flush()

        rows["  its write + flush alone, the line made"] = measure(sync_line)
    outlets = Outlets()
    outlet = outlets.open("records", str(tmp / "now.jsonl"))
    rows["record to a file, put on an outlet (now)"] = measure(
        lambda: outlet.put(orjson.dumps(record) + b"\n"), drained(outlets)
    )
    rows["  its put alone, the line made"] = measure(lambda: outlet.put(line), drained(outlets))
    outlets.close(time.monotonic() + 10)
    return rows


def to_a_reader(record: dict[str, Any], console: str) -> dict[str, dict[str, float]]:
    """Records and console lines to a pipe `cat` drains: before and now."""
    rows = {}
    w, cat = cat_pipe()
    with os.fdopen(os.dup(w), "wb") as pipe:

        def sync_pipe() -> None:
            pipe.write(orjson.dumps(record) + b"\n")
            pipe.flush()

        rows["record to a pipe read by cat, written on the loop (before)"] = measure(sync_pipe)
    outlets = Outlets()
    outlet = outlets.open("records", f"/dev/fd/{w}")  # the same pipe, opened anew
    rows["record to a pipe read by cat, put on an outlet (now)"] = measure(
        lambda: outlet.put(orjson.dumps(record) + b"\n"), drained(outlets)
    )
    with os.fdopen(os.dup(w), "w") as text:
        termlog = TermLogHandler(text)
        rows["console line to the pipe, mitmproxy's terminal handler (before)"] = measure(
            lambda: termlog.handle(log_record(console))
        )
    queued = QueuedTermLogHandler(outlet)
    rows["console line to the pipe, queued handler (now)"] = measure(
        lambda: queued.handle(log_record(console)), drained(outlets)
    )
    outlets.close(time.monotonic() + 10)
    os.close(w)
    cat.wait(10)
    return rows


def to_nobody(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Records to a pipe nobody reads: before, the loop would block for good; now the line is
    dropped and counted."""
    r, w = stalled_pipe()
    outlets = Outlets(queue_bytes=64 * 1024)
    outlet = outlets.open("records", f"/dev/fd/{w}")
    row = measure(lambda: outlet.put(orjson.dumps(record) + b"\n"))
    line = orjson.dumps(record) + b"\n"
    alone = measure(lambda: outlet.put(line))
    outlets.close(time.monotonic())
    os.close(r)
    os.close(w)
    return {
        "record to a pipe nobody reads, on a full outlet (now: dropped, counted)": row,
        "  its put alone, the line made, the queue full": alone,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    record = make_record()
    line = orjson.dumps(record) + b"\n"
    console = summary_line(record)
    rows = {"orjson.dumps of the record alone (both)": measure(lambda: orjson.dumps(record))}
    with tempfile.TemporaryDirectory() as tmp:
        rows |= to_a_file(record, Path(tmp))
    rows |= to_a_reader(record, console)
    rows |= to_nobody(record)
    doc = {
        "kind": "micro-outputs",
        "time": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_1m": os.getloadavg()[0],
        "record_bytes": len(line),
        "console_line_bytes": len(console) + 1,
        "lines_per_round": LINES,
        "rounds": ROUNDS,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"micro-outputs-{doc['time']}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"record {len(line)} B, console line {len(console) + 1} B; µs per line, medians of "
          f"{ROUNDS} rounds of {LINES}; load {doc['load_1m']:.1f}")  # fmt: skip
    print(f"{'loop CPU':>9} {'loop wall':>9} {'writer CPU':>10}  what")
    for what, r in rows.items():
        cpu, wall, writer = r["loop_cpu_us"], r["loop_wall_us"], r["writer_cpu_us"]
        print(f"{cpu:9.2f} {wall:9.2f} {writer:10.2f}  {what}")
    print(f"written to {out}")
    if args.json:
        print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
