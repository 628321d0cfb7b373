"""Instructions of hopmeter's own per-event and per-flow work, called directly, under callgrind.

    python bench/cg_micro.py --variant before=/tmp/base --variant after=.

`bench/callgrind.py` counts a whole proxy, whose looks at the client's queues run on wall-clock
timers: its rounds spread by a percent or two, more than one cut to hopmeter's own work moves
them. This counts that work alone, with nothing timed: a 325-event OpenAI chat flow (the bench
upstream's events, then a finish chunk and `[DONE]`), each chunk one event, fed to a FlowMeter
(`feed`); and the same flow fed, then its chunks followed out to a client that kept up,
measured and written (`core.record.finish`, with the text-shape token estimate) and observed
into the Prometheus metrics (`flow`; the chunks' follow-up is made by the bench, a few
instructions per chunk, the same for every variant). Each variant is a checkout whose
`addons/` goes first on PYTHONPATH; each figure is the difference between a run of 12 flows and
one of 2 (Python's start and imports cancel out), over the 10 flows. `flow` less `feed` is the
flow's end: what hopmeter does once per flow that grows with its events. Writes
bench/results/<UTC time>-cg-micro.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
EVENTS = 325
ROUNDS = (2, 12)
_COLLECTED = re.compile(r"Collected : (\d+)")


def child(rounds: int, part: str) -> None:
    """Run `rounds` flows in this process (under callgrind, from `count`)."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from hopmeter.core.delivery import DeliverySeen  # noqa: PLC0415
    from hopmeter.core.ledger import OUT, SENT, T_WRITE, FlowChunks, new_chunk  # noqa: PLC0415
    from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen  # noqa: PLC0415
    from hopmeter.core.meter import FlowMeter  # noqa: PLC0415
    from hopmeter.core.record import finish  # noqa: PLC0415
    from hopmeter.core.tokens import Counter, estimate_counter  # noqa: PLC0415
    from hopmeter.core.vocab import Api  # noqa: PLC0415
    from hopmeter.export.prometheus import Metrics  # noqa: PLC0415

    sys.path.insert(0, str(BENCH))
    from upstream import DONE, EVENT, FINISH  # noqa: PLC0415

    chunks = [EVENT % (1_700_000_000_000_000_000 + i * 20_000_000, 0) for i in range(EVENTS)]
    chunks += [FINISH, DONE]
    mono0 = 1000.0

    class Estimate:
        def for_model(self, model: str | None) -> Counter:
            del model
            return estimate_counter()

    metrics = Metrics(CollectorRegistry())
    for i in range(rounds):
        meter = FlowMeter(
            api=Api.OPENAI_CHAT, content_type="text/event-stream", content_encoding=None
        )
        for k, data in enumerate(chunks):
            meter.feed(data, 0.05 + k * 0.02 + (k % 7) * 1e-4)
        meter.close(0.05 + len(chunks) * 0.02)
        if part == "feed":
            continue
        flow = FlowChunks()  # each chunk written 30-34 µs after its read, sent 200 µs after it
        for k, data in enumerate(chunks):
            t = 0.05 + k * 0.02 + (k % 7) * 1e-4
            c = new_chunk(len(data), mono0 + t)
            c[T_WRITE] = c[OUT] = mono0 + t + 3e-5 + (k % 5) * 1e-6
            c[SENT] = mono0 + t + 2e-4
            flow.add(c)
        request = RequestInfo(
            method="POST",
            scheme="http",
            host="bench",
            path="/v1/chat/completions",
            t_start=1.7e9,
            t_end=1.7e9,
            bytes=80,
        )
        response = ResponseInfo(
            status=200,
            http_version="HTTP/1.1",
            headers={"content-type": "text/event-stream"},
            t_headers_s=0.04,
        )
        delivery = DeliverySeen(
            reason=None,
            measured=True,
            chunks=flow,
            mono0=mono0,
            skew_s=0.0,
            http_version="HTTP/1.1",
        )
        seen = Seen(
            flow_id=f"f{i}",
            trace_id=None,
            hop="edge",
            listener="edge",
            request=request,
            response=response,
            meter=meter,
            ended="complete",
            bytes_out=meter.bytes_wire,
            stall_threshold_s=0.5,
            delivery=delivery,
        )
        metrics.observe_result(finish(seen, Estimate()))


def count(checkout: Path, rounds: int, part: str) -> int:
    """Instructions of a child process running `rounds` flows with `checkout`'s hopmeter."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve() / "addons"), PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/callgrind.out",
                sys.executable,
                __file__,
                "--child",
                str(rounds),
                part,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    found = _COLLECTED.search(out.stderr)
    if not found:
        raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
    return int(found.group(1))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", default=[], help="LABEL=CHECKOUT")
    p.add_argument("--note", default="", help="what the variants are, for the results file")
    args = p.parse_args()
    variants = [v.split("=", 1) for v in args.variant] or [["hopmeter", str(BENCH.parent)]]
    started = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, Any] = {}
    flows = ROUNDS[1] - ROUNDS[0]
    for label, checkout in variants:
        row: dict[str, Any] = {"checkout": checkout}
        for part in ("feed", "flow"):
            low, high = (count(Path(checkout), r, part) for r in ROUNDS)
            row[f"{part}_ir_per_flow"] = round((high - low) / flows)
        row["feed_ir_per_event"] = round(row["feed_ir_per_flow"] / (EVENTS + 2))
        row["end_ir_per_flow"] = row["flow_ir_per_flow"] - row["feed_ir_per_flow"]
        results[label] = row
        print(
            f"{label}: feed {row['feed_ir_per_event']:,} Ir per event, flow's end "
            f"{row['end_ir_per_flow'] / 1e6:.2f} MIr per flow ({EVENTS} events)",
            file=sys.stderr,
        )
    doc = {
        "schema": "hopmeter.bench/1",
        "kind": "cg-micro",
        "started_utc": started,
        "method": __doc__.split("\n\n", 2)[2].strip(),
        "note": args.note,
        "events_per_flow": EVENTS,
        "variants": results,
    }
    path = BENCH / "results" / f"{started}-cg-micro.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
