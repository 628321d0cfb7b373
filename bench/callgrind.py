"""Instructions per streamed event and per flow, under callgrind: a figure neighbours do not move.

    python bench/callgrind.py                                   # this checkout's hopmeter run
    python bench/callgrind.py --variant before=/tmp/base --variant after=.  # two checkouts
    python bench/callgrind.py --variant after=. --bare          # and bare mitmdump beside

Each variant is `hopmeter run` from a checkout (its `addons/` first on PYTHONPATH, this venv's
Python and libraries), with any extra run flags after a comma: `--variant off=.,--no-relay`.
The proxy runs under `valgrind --tool=callgrind` with instrumentation off until the load starts;
the upstream and the client are this process (asyncio), outside valgrind. After 3 warm-up flows,
two loads run one flow at a time, one connection per flow: `--flows` flows of `--short` events,
then as many of `--long` events. Each is ping-pong: the upstream writes the next event (one
OpenAI chat chunk, one HTTP/1.1 chunk) only once the client has read the one before, so every
event is its own read through the proxy whatever valgrind's slowdown. The instructions of each
load are the proxy's user-space instructions, every thread (`callgrind_control` zeroes before a
load and dumps after it); per event = the loads' difference over the extra events, per flow =
the rest of the short load over its flows. With `--rounds N` the variants take turns N times,
each on a fresh process, and the medians are reported (hopmeter's looks at the client's queues
run on wall-clock timers, so a busy machine moves the counts by a percent or two). Writes
bench/results/<UTC time>-callgrind.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs

from harness import log
from upstream import DONE, END, EVENT, FINISH, HEAD, chunk

ROOT = Path(__file__).resolve().parents[1]
WARM_FLOWS = 3
WARM_EVENTS = 5
START_TIMEOUT_S = 240.0  # importing mitmproxy under valgrind takes a minute or more
FLOW_TIMEOUT_S = 600.0
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.M)


@dataclass(frozen=True, slots=True)
class Variant:
    """One proxy command measured: a label, and how to start it on a port."""

    label: str
    checkout: Path | None  # None: bare mitmdump
    extra: tuple[str, ...] = ()

    def command(self, upstream_port: int, port: int, logdir: Path) -> list[str]:
        if self.checkout is None:
            mode = f"reverse:http://127.0.0.1:{upstream_port}@127.0.0.1:{port}"
            bare = procs.BENCH / "bare_addon.py"
            return [str(procs.BIN / "mitmdump"), "-q", "-s", str(bare), "--mode", mode]
        return [
            procs.PY,
            "-m",
            "hopmeter.cli",
            "run",
            f"http://127.0.0.1:{upstream_port}",
            *("--listen", f"127.0.0.1:{port}"),
            *("--records", str(logdir / f"{self.label}.records.jsonl")),
            *("--metrics", f"127.0.0.1:{procs.free_port()}"),
            *self.extra,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.checkout is not None:
            env["PYTHONPATH"] = str(self.checkout.resolve() / "addons")
        return env


def parse_variant(text: str) -> Variant:
    """LABEL=CHECKOUT[,FLAG...]."""
    label, _, rest = text.partition("=")
    path, *extra = rest.split(",")
    if not label or not (Path(path) / "addons" / "hopmeter").is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=CHECKOUT of hopmeter")
    return Variant(label, Path(path), tuple(extra))


class PingPong:
    """The upstream and the client in one loop: one flow at a time, one event per read."""

    def __init__(self) -> None:
        self.next = asyncio.Event()  # set by the client once it has read an event
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                size = re.search(rb"content-length: (\d+)", head, re.I)
                await reader.readexactly(int(size.group(1)) if size else 0)
                events = int(re.search(rb"x-events: (\d+)", head).group(1))  # type: ignore[union-attr]
                writer.write(HEAD + b"\r\n")
                for _ in range(events):
                    self.next.clear()
                    writer.write(chunk(EVENT % (time.time_ns(), 0)))
                    await writer.drain()
                    await self.next.wait()
                writer.write(chunk(FINISH) + chunk(DONE) + END)
                await writer.drain()
        writer.close()

    async def flow(self, port: int, events: int) -> None:
        """One request through the proxy on a new connection; every event read before the next
        is sent."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\n"
            b"content-type: application/json\r\nx-events: %d\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (events, len(body), body)
        )
        seen, got = 0, b""
        while not got.endswith(END):
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError(f"the proxy closed the flow after {seen} of {events} events")
            got += data
            now = got.count(b'data: {"t":')
            if now > seen:
                seen = now
                self.next.set()
        if seen != events:
            raise RuntimeError(f"{seen} events of {events}")
        writer.close()

    async def flows(self, port: int, count: int, events: int) -> None:
        for _ in range(count):
            await asyncio.wait_for(self.flow(port, events), FLOW_TIMEOUT_S)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=True)


def _dumped(out: Path, pid: int, before: set[Path]) -> int:
    """The instructions in the dump callgrind_control just asked for."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out.parent.glob(f"{out.name}.{pid}.*")) - before
        for path in new:
            found = _TOTALS.search(path.read_bytes())
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


@contextlib.contextmanager
def proxy(variant: Variant, upstream_port: int, logdir: Path) -> Iterator[tuple[int, int, Path]]:
    """The variant under callgrind: (its pid, its port, its dump file prefix)."""
    port = procs.free_port()
    out = logdir / f"callgrind.{variant.label}"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}.%p",
        *variant.command(upstream_port, port, logdir),
    ]
    with (logdir / f"{variant.label}.log").open("wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=variant.environment()
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _listening(port):
                if proc.poll() is not None:
                    raise RuntimeError(f"{variant.label} exited {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{variant.label} did not listen")
                time.sleep(0.5)
            yield proc.pid, port, out
        finally:
            procs.stop(proc)


def measure(variant: Variant, flows: int, short: int, long: int, logdir: Path) -> dict[str, Any]:
    """The variant's two loads and what they give per event and per flow."""

    async def go() -> dict[str, Any]:
        pp = PingPong()
        server = await asyncio.start_server(pp.serve, "127.0.0.1", 0)
        upstream_port = server.sockets[0].getsockname()[1]
        loads = []
        with proxy(variant, upstream_port, logdir) as (pid, port, out):
            await pp.flows(port, WARM_FLOWS, WARM_EVENTS)
            for events in (short, long):
                before = set(out.parent.glob(f"{out.name}.{pid}.*"))
                await asyncio.to_thread(_control, pid, "--zero")
                await asyncio.to_thread(_control, pid, "--instr=on")
                started = time.monotonic()
                await pp.flows(port, flows, events)
                elapsed = time.monotonic() - started
                await asyncio.to_thread(_control, pid, "--instr=off")
                await asyncio.to_thread(_control, pid, "--dump")
                ir = await asyncio.to_thread(_dumped, out, pid, before)
                loads.append(
                    {"flows": flows, "events_per_flow": events, "s": round(elapsed, 3), "ir": ir}
                )
                log(f"{variant.label}: {flows} x {events} events: {ir:,} Ir in {elapsed:.1f}s")
        server.close()
        a, b = loads
        per_event = (b["ir"] - a["ir"]) / (flows * (long - short))
        per_flow = (a["ir"] - per_event * flows * short) / flows
        return {"loads": loads, "per_event_ir": round(per_event), "per_flow_ir": round(per_flow)}

    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", type=parse_variant, action="append", default=[])
    p.add_argument("--bare", action="store_true", help="bare mitmdump too")
    p.add_argument("--flows", type=int, default=20)
    p.add_argument("--short", type=int, default=5, help="events per flow of the short load")
    p.add_argument("--long", type=int, default=325, help="events per flow of the long load")
    p.add_argument("--rounds", type=int, default=1, help="the variants in turn, this many times")
    p.add_argument("--note", default="", help="what the variants are, for the results file")
    args = p.parse_args()
    variants: list[Variant] = args.variant or [Variant("hopmeter", ROOT)]
    if args.bare:
        variants.append(Variant("bare", None))
    started = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%MZ")
    logdir = Path(f"/tmp/hopmeter-bench-{started}")
    logdir.mkdir(parents=True, exist_ok=True)
    rounds: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            rounds[variant.label].append(
                measure(variant, args.flows, args.short, args.long, logdir)
            )
    results = {}
    for label, runs in rounds.items():
        per_event = statistics.median(r["per_event_ir"] for r in runs)
        per_flow = statistics.median(r["per_flow_ir"] for r in runs)
        results[label] = {"rounds": runs, "per_event_ir": per_event, "per_flow_ir": per_flow}
        each = ", ".join(f"{r['per_event_ir'] / 1e3:.1f}" for r in runs)
        log(
            f"{label}: {per_event / 1e3:.1f} kIr per event (median of {each}), "
            f"{per_flow / 1e6:.2f} MIr per flow"
        )
    doc = {
        "schema": "hopmeter.bench/1",
        "kind": "callgrind",
        "started_utc": started,
        "method": __doc__.split("\n\n", 2)[2].strip(),
        "note": args.note,
        "variants": {
            v.label: " ".join(
                ("bare mitmdump" if v.checkout is None else str(v.checkout), *v.extra)
            )
            for v in variants
        },
        "serial": results,
    }
    path = procs.BENCH / "results" / f"{started.replace('Z', '00Z')}-callgrind.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
