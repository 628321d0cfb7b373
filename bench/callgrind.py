"""Instructions per streamed event and per flow, under callgrind: a figure neighbours do not move.

    python bench/callgrind.py                                   # this checkout's hopmeter run
    python bench/callgrind.py --variant before=/tmp/base --variant after=.  # two checkouts
    python bench/callgrind.py --variant after=. --bare          # and bare mitmdump beside
    python bench/callgrind.py --bare --protos http1,http1-norelay,tls,h2 --functions 40

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

With `--paced STREAMS` the two loads are instead STREAMS streams in flight at once, each paced
on its own clock (`--paced-rate` events a second, random phases: most reads carry one event),
from bench/upstream.py in its own process through bench/client.py: the per-event and per-flow
figures then include what grows with the streams a proxy holds at once (every stream's state
live together), which one flow at a time cannot show. Protos `http1`, `http1-norelay`, `tls`,
`h2` and `h2-up` (bench/upstream.py's HTTP/2 listener in TLS, its certificate unchecked).

`--protos` picks the client's side of the proxy (the upstream is plain HTTP/1.1 but for
`tls-up`, where it speaks HTTP/1.1 in TLS to a plain HTTP/1.1 client, and `h2-up`, where it
speaks HTTP/2 in TLS, one DATA frame per event, to an `h2` client): `http1`
(the default, as above), `http1-norelay` (the same with `hopmeter run --no-relay`: every read
through mitmproxy's own layers; bare mitmdump runs as for `http1`), `tls` (HTTP/1.1 in TLS from
the client, a new connection and handshake per flow) and `h2` (HTTP/2 in TLS, ALPN h2: every flow
of a load is a stream on one connection, one stream at a time). hopmeter's relay takes `tls`'s
and `h2`'s body reads as `http1`'s (it sends through the client's TLS connection, and to an
HTTP/2 client into its HTTP/2 connection). Each proto's figures are under `protos`;
`serial` repeats `http1`'s when it ran. With `--functions N`, one more round per proto and
variant runs with Python's perf trampolines (bench/cg_functions.py) and records the top N
functions by inclusive and by self Ir, per event and per flow, hopmeter's own marked; that
round's totals are not in the medians (the trampolines add instructions of their own).
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
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cg_functions
import procs
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, RequestReceived, StreamEnded, StreamReset

from harness import Load, client, log
from hopmeter.upstream.tls import make_self_signed, server_context
from upstream import DONE, END, EVENT, FINISH, HEAD, chunk

ROOT = Path(__file__).resolve().parents[1]
WARM_FLOWS = 3
WARM_EVENTS = 5
START_TIMEOUT_S = 240.0  # importing mitmproxy under valgrind takes a minute or more
# mitmproxy listens before its `running` hook loads the certificate store: a client in TLS that
# connects in between fails its handshake and the proxy exits ("Errors logged during startup").
# Under valgrind that gap is seconds long.
SETTLE_S = 10.0
PACED_GRACE_S = 120.0  # `--paced`: how long past its plan a load may run (valgrind's slowdown)
FLOW_TIMEOUT_S = 600.0
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.M)
PROTOS = ("http1", "http1-norelay", "tls", "h2", "tls-up", "h2-up")
BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'
MARK = b'data: {"t":'  # the start of every token event


@dataclass(frozen=True, slots=True)
class Variant:
    """One proxy command measured: a label, and how to start it on a port."""

    label: str
    checkout: Path | None  # None: bare mitmdump
    extra: tuple[str, ...] = ()

    def command(
        self, upstream_port: int, port: int, logdir: Path, proto: str, *, unchecked: bool = False
    ) -> list[str]:
        """The proxy's command line; with `unchecked`, an upstream in TLS whose certificate is
        not this harness's (bench/upstream.py's, for `--paced`) is taken unchecked."""
        scheme: str = "http"
        trust: tuple[str, ...] = ()
        if proto in ("tls-up", "h2-up"):  # the upstream in TLS, its own certificate trusted
            scheme = "https"
            trust = (
                ("--set", "ssl_insecure=true")
                if unchecked
                else ("--set", f"ssl_verify_upstream_trusted_ca={upstream_cert(logdir)[0]}")
            )
        if self.checkout is None:
            mode = f"reverse:{scheme}://127.0.0.1:{upstream_port}@127.0.0.1:{port}"
            bare = procs.BENCH / "bare_addon.py"
            return [str(procs.BIN / "mitmdump"), "-q", "-s", str(bare), "--mode", mode, *trust]
        return [
            procs.PY,
            "-m",
            "hopmeter.cli",
            "run",
            f"{scheme}://127.0.0.1:{upstream_port}",
            *trust,
            *("--listen", f"127.0.0.1:{port}"),
            *("--records", str(logdir / f"{self.label}.records.jsonl")),
            *("--metrics", f"127.0.0.1:{procs.free_port()}"),
            *(("--no-relay",) if proto == "http1-norelay" else ()),
            *self.extra,
        ]

    def environment(self, profile: bool) -> dict[str, str]:
        env = dict(os.environ)
        if self.checkout is not None:
            env["PYTHONPATH"] = str(self.checkout.resolve() / "addons")
        if profile:
            env["PYTHONPERFSUPPORT"] = "1"
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
        self.h2_seen = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # cancelled at the end of a run while the proxy keeps the connection: a quiet end (an
        # escaping CancelledError makes asyncio's stream callback print a traceback)
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
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

    async def serve_h2(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The upstream over HTTP/2 (`h2-up`): each request's events as DATA frames, one per
        event, the next once the client has read the one before."""
        conn = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        heads: dict[int, dict[str, str]] = {}
        streams: set[asyncio.Task[None]] = set()
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(1 << 16):
                for event in conn.receive_data(data):
                    if isinstance(event, RequestReceived):
                        heads[event.stream_id] = dict(event.headers)  # type: ignore[arg-type]
                    elif isinstance(event, DataReceived):
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, StreamEnded):
                        events = int(heads.pop(event.stream_id)["x-events"])
                        task = asyncio.create_task(
                            self._h2_respond(conn, writer, event.stream_id, events)
                        )
                        streams.add(task)
                        task.add_done_callback(streams.discard)
                writer.write(conn.data_to_send())
        writer.close()

    async def _h2_respond(
        self, conn: H2Connection, writer: asyncio.StreamWriter, sid: int, events: int
    ) -> None:
        conn.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream")])
        for _ in range(events):
            self.next.clear()
            conn.send_data(sid, EVENT % (time.time_ns(), 0))
            writer.write(conn.data_to_send())
            await writer.drain()
            await self.next.wait()
        conn.send_data(sid, FINISH + DONE, end_stream=True)
        writer.write(conn.data_to_send())

    def _seen(self, counter: EventCounter, data: bytes) -> None:
        if counter.take(data):
            self.next.set()

    async def flow(self, port: int, events: int, tls: bool) -> None:
        """One request through the proxy on a new connection (in TLS with `tls`); every event
        read before the next is sent."""
        context = _client_tls(["http/1.1"]) if tls else None
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="bench" if tls else None
        )
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\n"
            b"content-type: application/json\r\nx-events: %d\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (events, len(BODY), BODY)
        )
        counter = EventCounter()
        tail = b""
        while not tail.endswith(END):
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError(f"the proxy closed the flow after {counter.seen} of {events}")
            tail = (tail + data)[-len(END) :]
            self._seen(counter, data)
        if counter.seen != events:
            raise RuntimeError(f"{counter.seen} events of {events}")
        writer.close()

    async def flows(self, port: int, count: int, events: int, proto: str) -> None:
        if proto in ("h2", "h2-up"):
            await self.h2_flows(port, count, events)
            return
        for _ in range(count):
            await asyncio.wait_for(self.flow(port, events, proto == "tls"), FLOW_TIMEOUT_S)

    async def h2_flows(self, port: int, count: int, events: int) -> None:
        """`count` requests as streams of one HTTP/2 connection, one after the other."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=_client_tls(["h2"]), server_hostname="bench"
        )
        alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if alpn != "h2":
            raise RuntimeError(f"the proxy chose {alpn!r}, not h2")
        conn = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        for _ in range(count):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":path", "/v1/chat/completions"),
                    (":authority", "bench"),
                    (":scheme", "https"),
                    ("content-type", "application/json"),
                    ("x-events", str(events)),
                    ("content-length", str(len(BODY))),
                ],
            )
            conn.send_data(sid, BODY, end_stream=True)
            writer.write(conn.data_to_send())
            await asyncio.wait_for(self._h2_stream(conn, sid, reader, writer), FLOW_TIMEOUT_S)
            if self.h2_seen != events:
                raise RuntimeError(f"{self.h2_seen} events of {events} on stream {sid}")
        conn.close_connection()
        writer.write(conn.data_to_send())
        writer.close()

    async def _h2_stream(
        self,
        conn: H2Connection,
        sid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        counter = EventCounter()
        ended = False
        while not ended:
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError(f"the proxy closed the connection in stream {sid}")
            for event in conn.receive_data(data):
                if isinstance(event, DataReceived) and event.stream_id == sid:
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                    self._seen(counter, event.data)
                elif isinstance(event, StreamEnded) and event.stream_id == sid:
                    ended = True
                elif isinstance(event, StreamReset):
                    raise RuntimeError(f"stream {event.stream_id} reset: {event.error_code}")
            out = conn.data_to_send()
            if out:
                writer.write(out)
                await writer.drain()
        self.h2_seen = counter.seen


class EventCounter:
    """Token events seen so far in a body read piece by piece (a mark may span two pieces)."""

    def __init__(self) -> None:
        self.seen = 0
        self._tail = b""

    def take(self, data: bytes) -> bool:
        """Count the events `data` starts; whether there were any."""
        buf = self._tail + data
        new = buf.count(MARK)
        self._tail = buf[-(len(MARK) - 1) :]
        self.seen += new
        return new > 0


def upstream_cert(logdir: Path) -> tuple[Path, Path]:
    """The upstream's certificate and key for `tls-up` (made once per run, in `logdir`)."""
    folder = logdir / "upstream-tls"
    if not (folder / "key.pem").exists():
        return make_self_signed(folder, ("127.0.0.1",))
    return folder / "cert.pem", folder / "key.pem"


def _client_tls(alpn: list[str]) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # mitmproxy's certificate for "bench"
    context.set_alpn_protocols(alpn)
    return context


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=True)


def _dumped(out: Path, pid: int, before: set[Path]) -> tuple[int, Path]:
    """The instructions in the dump callgrind_control just asked for, and its file."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out.parent.glob(f"{out.name}.{pid}.*")) - before
        for path in new:
            found = _TOTALS.search(path.read_bytes())
            if found:
                return int(found.group(1)), path
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


@contextlib.contextmanager
def proxy(
    variant: Variant,
    upstream_port: int,
    logdir: Path,
    proto: str,
    profile: bool,
    *,
    unchecked: bool = False,
) -> Iterator[tuple[int, int, Path]]:
    """The variant under callgrind: (its pid, its port, its dump file prefix)."""
    port = procs.free_port()
    out = logdir / f"callgrind.{variant.label}.{proto}{'.profiled' if profile else ''}"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}.%p",
        *variant.command(upstream_port, port, logdir, proto, unchecked=unchecked),
    ]
    with (logdir / f"{variant.label}.{proto}.log").open("ab") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=variant.environment(profile)
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _listening(port):
                if proc.poll() is not None:
                    raise RuntimeError(f"{variant.label} exited {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{variant.label} did not listen")
                time.sleep(0.5)
            time.sleep(SETTLE_S)
            yield proc.pid, port, out
        finally:
            procs.stop(proc)
            if profile:
                Path(f"/tmp/perf-{proc.pid}.map").unlink(missing_ok=True)


def measure(
    variant: Variant,
    flows: int,
    short: int,
    long: int,
    logdir: Path,
    *,
    proto: str = "http1",
    functions: int = 0,
) -> dict[str, Any]:
    """The variant's two loads and what they give per event and per flow; with `functions`,
    run with Python's perf trampolines and add the top functions (`cg_functions`)."""

    async def go() -> dict[str, Any]:
        pp = PingPong()
        context = server_context(*upstream_cert(logdir)) if proto in ("tls-up", "h2-up") else None
        serve = pp.serve
        if proto == "h2-up" and context is not None:
            context.set_alpn_protocols(["h2"])
            serve = pp.serve_h2
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
        upstream_port = server.sockets[0].getsockname()[1]
        loads, dumps = [], []
        profile = functions > 0
        with proxy(variant, upstream_port, logdir, proto, profile) as (pid, port, out):
            await pp.flows(port, WARM_FLOWS, WARM_EVENTS, proto)
            for events in (short, long):
                before = set(out.parent.glob(f"{out.name}.{pid}.*"))
                await asyncio.to_thread(_control, pid, "--zero")
                await asyncio.to_thread(_control, pid, "--instr=on")
                started = time.monotonic()
                await pp.flows(port, flows, events, proto)
                elapsed = time.monotonic() - started
                await asyncio.to_thread(_control, pid, "--instr=off")
                await asyncio.to_thread(_control, pid, "--dump")
                ir, dump = await asyncio.to_thread(_dumped, out, pid, before)
                dumps.append(dump)
                loads.append(
                    {"flows": flows, "events_per_flow": events, "s": round(elapsed, 3), "ir": ir}
                )
                log(
                    f"{variant.label} {proto}: {flows} x {events} events: {ir:,} Ir "
                    f"in {elapsed:.1f}s{' (profiled)' if profile else ''}"
                )
            names = cg_functions.perf_map(pid) if profile else {}
        server.close()
        a, b = loads
        per_event = (b["ir"] - a["ir"]) / (flows * (long - short))
        per_flow = (a["ir"] - per_event * flows * short) / flows
        result: dict[str, Any] = {
            "loads": loads,
            "per_event_ir": round(per_event),
            "per_flow_ir": round(per_flow),
        }
        if profile:
            tables = [cg_functions.table(d, names) for d in dumps]
            result["functions"] = cg_functions.per_unit(
                tables[0], tables[1], flows, short, long, top=functions
            )
        return result

    return asyncio.run(go())


# `--paced`: bench/client.py's `--proto` for each proto, and which of bench/upstream.py's
# listeners the proxy is put in front of (its HTTP/1.1 one, or its HTTP/2 one in TLS)
PACED = {
    "http1": ("h1", False),
    "http1-norelay": ("h1", False),
    "tls": ("tls", False),
    "h2": ("h2", False),
    "h2-up": ("h2", True),
}


def measure_paced(  # noqa: PLR0917 - one load point's settings
    variant: Variant, streams: int, rate: float, short: int, long: int, logdir: Path, proto: str
) -> dict[str, Any]:
    """`--paced`: `streams` streams in flight at once, each paced at `rate` events a second on
    its own clock (bench/client.py), from bench/upstream.py in its own process; a load of
    `short` events a stream, then one of `long`. Per event and per flow as for the ping-pong
    loads, but with every stream's state live together, as under a real load."""
    client_proto, h2_upstream = PACED[proto]
    loads, instructions = [], []
    with procs.Upstream(logdir) as up:
        upstream_port = up.h2_port if h2_upstream else up.port
        if not upstream_port:
            raise RuntimeError("the upstream has no HTTP/2 listener (bench/upstream.py has)")
        with proxy(variant, upstream_port, logdir, proto, False, unchecked=True) as (
            pid,
            port,
            out,
        ):
            warm = Load(1, rate=10.0, warmup_s=0.0, measure_s=1.0, grace_s=30.0, proto=client_proto)
            client(warm.args(port))
            for events in (short, long):
                load = Load(
                    streams,
                    rate=rate,
                    warmup_s=0.0,
                    measure_s=events / rate,
                    grace_s=PACED_GRACE_S,
                    proto=client_proto,
                )
                before = set(out.parent.glob(f"{out.name}.{pid}.*"))
                _control(pid, "--zero")
                _control(pid, "--instr=on")
                started = time.monotonic()
                result = client(load.args(port))
                elapsed = time.monotonic() - started
                time.sleep(SETTLE_S)  # the flows' ends (records) are the proxy's work too
                _control(pid, "--instr=off")
                _control(pid, "--dump")
                ir, _ = _dumped(out, pid, before)
                got = int(result["events_received"])
                if got != streams * events:
                    raise RuntimeError(
                        f"{got} events of {streams * events} through {variant.label}"
                    )
                instructions.append(ir)
                loads.append(
                    {
                        "streams": streams,
                        "events_per_stream": events,
                        "s": round(elapsed, 3),
                        "ir": ir,
                    }
                )
                log(f"{variant.label} {proto} paced: {streams} x {events} events: {ir:,} Ir")
    per_event = (instructions[1] - instructions[0]) / (streams * (long - short))
    per_flow = (instructions[0] - per_event * streams * short) / streams
    return {"loads": loads, "per_event_ir": round(per_event), "per_flow_ir": round(per_flow)}


def _protos(text: str) -> list[str]:
    protos = [p for p in text.split(",") if p]
    unknown = set(protos) - set(PROTOS)
    if unknown or not protos:
        raise argparse.ArgumentTypeError(f"{text!r}: expected some of {','.join(PROTOS)}")
    return protos


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rounds": runs,
        "per_event_ir": statistics.median(r["per_event_ir"] for r in runs),
        "per_flow_ir": statistics.median(r["per_flow_ir"] for r in runs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", type=parse_variant, action="append", default=[])
    p.add_argument("--bare", action="store_true", help="bare mitmdump too")
    p.add_argument("--flows", type=int, default=20)
    p.add_argument("--short", type=int, default=5, help="events per flow of the short load")
    p.add_argument("--long", type=int, default=325, help="events per flow of the long load")
    p.add_argument("--rounds", type=int, default=1, help="the variants in turn, this many times")
    p.add_argument(
        "--protos",
        type=_protos,
        default=["http1"],
        help=f"the client's side, comma-separated: {','.join(PROTOS)} (default http1)",
    )
    p.add_argument(
        "--functions",
        type=int,
        default=0,
        metavar="N",
        help="one more round per proto and variant, profiled: its top N functions by Ir",
    )
    p.add_argument(
        "--paced",
        type=int,
        default=0,
        metavar="STREAMS",
        help="STREAMS paced streams at once from bench/upstream.py instead of one flow at a time",
    )
    p.add_argument(
        "--paced-rate", type=float, default=4.0, help="--paced: events a second of each stream"
    )
    p.add_argument("--note", default="", help="what the variants are, for the results file")
    args = p.parse_args()
    if args.paced and (args.functions or set(args.protos) - set(PACED)):
        p.error(f"--paced takes --protos among {','.join(PACED)}, and no --functions")
    variants: list[Variant] = args.variant or [Variant("hopmeter", ROOT)]
    if args.bare:
        variants.append(Variant("bare", None))
    started = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%MZ")
    logdir = Path(f"/tmp/hopmeter-bench-{started}")
    logdir.mkdir(parents=True, exist_ok=True)
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
        proto: {v.label: [] for v in variants} for proto in args.protos
    }
    profiled: dict[str, dict[str, Any]] = {proto: {} for proto in args.protos}
    for _ in range(args.rounds):
        for proto in args.protos:
            for variant in variants:
                rounds[proto][variant.label].append(
                    measure_paced(
                        variant, args.paced, args.paced_rate, args.short, args.long, logdir, proto
                    )
                    if args.paced
                    else measure(variant, args.flows, args.short, args.long, logdir, proto=proto)
                )
    if args.functions:
        for proto in args.protos:
            for variant in variants:
                profiled[proto][variant.label] = measure(
                    variant,
                    args.flows,
                    args.short,
                    args.long,
                    logdir,
                    proto=proto,
                    functions=args.functions,
                )
    results = {proto: {k: _summary(v) for k, v in by.items()} for proto, by in rounds.items()}
    for proto, by in results.items():
        for label, summary in by.items():
            each = ", ".join(f"{r['per_event_ir'] / 1e3:.1f}" for r in summary["rounds"])
            log(
                f"{label} {proto}: {summary['per_event_ir'] / 1e3:.1f} kIr per event "
                f"(median of {each}), {summary['per_flow_ir'] / 1e6:.2f} MIr per flow"
            )
            if label in profiled[proto]:
                log(
                    f"{label} {proto}, profiled:\n"
                    + cg_functions.render(profiled[proto][label]["functions"])
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
        "serial": results.get("http1", {}),
        "protos": results,
        "paced": {"streams": args.paced, "rate": args.paced_rate} if args.paced else None,
    }
    if args.functions:
        doc["functions"] = profiled
    path = procs.BENCH / "results" / f"{started.replace('Z', '00Z')}-callgrind.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
