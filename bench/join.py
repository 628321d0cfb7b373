"""How much one `hopmeter join --serve` instance takes: timeline events/s, and memory per trace.

    python bench/join.py              # throughput and memory: bench/results/<time>-join.json
    python bench/join.py --rounds 1   # one round per point (quicker, noisier)
    python bench/join.py --redraw bench/results/<file>-join.json   # the README table again

The service runs as its own process, as deployed; this process only sends pre-encoded export
requests over one keep-alive connection and reads the service's CPU time from /proc, so each
figure is the service's own cost: decoding, checking and filing every span, aligning each pair
and observing every token's hold. The spans are the ones hopmeter exports (its own OtelExporter
and the SDK's encoder, every attribute), an edge and an origin per trace, 256 spans a request.

- throughput: spans and timeline events per second of the service's CPU, for 50, 200 and 1,000
  token events a span, as OTLP/HTTP protobuf, protobuf+gzip and OTLP JSON, and as OTLP/gRPC;
  the best of `--rounds` rounds (the machine is shared: the best is the least disturbed).
- memory: RSS growth while 10,240 traces of two 200-event spans are held in the window.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import orjson
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hopmeter.export.otel import OtelExporter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TRACES_PER_REQUEST = 128  # 256 spans: the exporter's batch with the timeline on is 128 spans
EVENTS_PER_POINT = 1_200_000  # timeline events sent per point: a second or more of its CPU
T0 = 1_800_000_000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One throughput measurement."""

    events_per_span: int
    encoding: str
    spans: int
    cpu_s: float
    spans_per_cpu_s: float
    events_per_cpu_s: float
    cpu_us_per_span: float
    segments: int


def record(trace: int, hop: str, n_events: int, *, hold_s: float) -> dict[str, Any]:
    """A flow record of `n_events` one-token events at 50 tokens/s (`hold_s` later at the edge)."""
    first = 0.3 + hold_s
    events = [[round(first + i * 0.02, 6), 1, 4 * (i + 1)] for i in range(n_events)]
    end = events[-1][0] + 0.001
    edge = hop == "edge"
    return {
        "schema": "hopmeter.flow/1",
        "trace_id": f"{trace:032x}",
        "span_id": f"{2 * trace + (0 if edge else 1):016x}",
        "parent_span_id": None if edge else f"{2 * trace:016x}",
        "flow_id": f"f{trace}",
        "hop": hop,
        "listener": hop,
        "request": {
            "method": "POST",
            "scheme": "http",
            "host": "llm.internal",
            "path": "/v1/chat/completions",
            "t_start": T0 + (0 if edge else 0.002),
            "t_end": T0 + 0.003,
            "bytes": 300,
        },
        "response": {
            "status": 200,
            "http_version": "HTTP/1.1",
            "t_headers": T0 + 0.01,
            "t_first_byte": T0 + first,
            "t_last_byte": T0 + end,
            "bytes_wire": 120 * n_events,
            "ended": "complete",
        },
        "events": events,
        "figures": {
            "ttfb_s": first,
            "ttft_s": first,
            "duration_s": end,
            "tokens": n_events,
            "tokens_source": "usage",
            "itl_p50_s": 0.02,
            "itl_p99_s": 0.02,
            "max_gap_s": 0.02,
            "stalls": 0,
            "tokens_per_s": 50.0,
        },
        "api": "openai.chat",
        "model": "gpt-4o-mini",
        "findings": [],
    }


def base_request(n_events: int) -> ExportTraceServiceRequest:
    """One request of TRACES_PER_REQUEST traces (an edge and an origin span each)."""
    memory = InMemorySpanExporter()
    exporter = OtelExporter("http://127.0.0.1:4318", exporter=memory)
    for trace in range(1, TRACES_PER_REQUEST + 1):
        for hop, hold in (("edge", 0.004), ("origin", 0.0)):
            exporter.observe(SimpleNamespace(record=record(trace, hop, n_events, hold_s=hold)))
    assert exporter.flush(60)
    exporter.close()
    return encode_spans(memory.get_finished_spans())


def retrace(request: ExportTraceServiceRequest, salt: int) -> ExportTraceServiceRequest:
    """A copy whose trace ids all differ from the original's (same links between spans)."""
    out = ExportTraceServiceRequest()
    out.CopyFrom(request)
    tag = salt.to_bytes(4, "big")
    for rs in out.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.trace_id = tag + span.trace_id[4:]
    return out


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP JSON (hex ids), as an exporter sends it."""
    doc = MessageToDict(request, use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return orjson.dumps(doc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """`hopmeter join --serve` in its own process."""

    def __init__(self, window_s: float = 600.0) -> None:
        self.port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "addons")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hopmeter.cli",
                "join",
                "--serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--grpc",
                f"127.0.0.1:{self.grpc_port}",
                "--metrics",
                f"127.0.0.1:{self.metrics_port}",
                "--window",
                str(window_s),
                "--max-traces",
                "1000000",
                "--max-events",
                "100000000",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not _listening(self.metrics_port) or not _listening(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("hopmeter join --serve did not start")
            time.sleep(0.05)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def metric(self, name: str) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name))

    def wait_for(self, name: str, value: int, timeout_s: float = 60.0) -> int:
        """Wait until the metric `name` reaches `value` (the last answer precedes its work)."""
        deadline = time.monotonic() + timeout_s
        while (seen := int(self.metric(name))) < value:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} stayed at {seen}, not {value}")
            time.sleep(0.01)
        return seen

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def send_http(service: Service, bodies: list[bytes], kind: str, encoding: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=300)
    headers = {"content-type": kind, **({"content-encoding": encoding} if encoding else {})}
    for body in bodies:
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
    conn.close()


def send_grpc(service: Service, requests: list[ExportTraceServiceRequest]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = TraceServiceStub(channel)  # type: ignore[no-untyped-call]
        for request in requests:
            stub.Export(request, timeout=300)


ENCODINGS: dict[str, Callable[[list[ExportTraceServiceRequest]], Callable[[Service], None]]] = {
    "protobuf": lambda rs: (
        lambda s: send_http(s, [r.SerializeToString() for r in rs], "application/x-protobuf", "")
    ),
    "protobuf+gzip": lambda rs: (
        lambda s: send_http(
            s,
            [gzip.compress(r.SerializeToString(), 6) for r in rs],
            "application/x-protobuf",
            "gzip",
        )
    ),
    "json": lambda rs: lambda s: send_http(s, [otlp_json(r) for r in rs], "application/json", ""),
    "grpc": lambda rs: lambda s: send_grpc(s, rs),
}


def throughput(rounds: int) -> list[Point]:
    points = []
    for n_events in (50, 200, 1000):
        base = base_request(n_events)
        n_requests = max(4, EVENTS_PER_POINT // (2 * TRACES_PER_REQUEST * n_events))
        requests = [retrace(base, i + 1) for i in range(n_requests)]
        for name, prepare in ENCODINGS.items():
            send = prepare(requests)
            best: Point | None = None
            for _ in range(rounds):
                service = Service()
                spans = 2 * TRACES_PER_REQUEST * n_requests
                try:
                    before = service.cpu_s()
                    send(service)
                    segments = service.wait_for("hopmeter_join_segments_total", spans // 2)
                    cpu = service.cpu_s() - before
                finally:
                    service.close()
                point = Point(
                    events_per_span=n_events,
                    encoding=name,
                    spans=spans,
                    cpu_s=round(cpu, 3),
                    spans_per_cpu_s=round(spans / cpu),
                    events_per_cpu_s=round(spans * n_events / cpu),
                    cpu_us_per_span=round(cpu / spans * 1e6),
                    segments=segments,
                )
                if best is None or point.cpu_s < best.cpu_s:
                    best = point
            assert best is not None
            print(
                f"{n_events:>5} events/span {name:<14} {best.spans_per_cpu_s:>7,} spans/s  "
                f"{best.events_per_cpu_s:>9,} events/s  {best.cpu_us_per_span:>6,} µs/span"
            )
            points.append(best)
    return points


def memory() -> dict[str, float]:
    """RSS growth per trace held (two 200-event spans, joined and kept for the window)."""
    base = base_request(200)
    bodies = [retrace(base, i + 1).SerializeToString() for i in range(80)]  # 10,240 traces
    service = Service()
    try:
        time.sleep(1.0)
        before = service.rss_mib()
        send_http(service, bodies, "application/x-protobuf", "")
        after = service.rss_mib()
        traces = service.metric("hopmeter_join_window_traces")
    finally:
        service.close()
    per_trace = (after - before) * 2**20 / traces
    out = {
        "traces": traces,
        "rss_before_mib": round(before, 1),
        "rss_after_mib": round(after, 1),
        "bytes_per_trace": round(per_trace),
        "bytes_per_event": round(per_trace / 400, 1),
    }
    print(
        f"memory: {traces:,.0f} traces of 2 x 200 events: RSS {before:.0f} -> {after:.0f} MiB, "
        f"{per_trace:,.0f} B a trace, {per_trace / 400:.1f} B an event"
    )
    return out


README = ROOT / "bench" / "README.md"
MARKERS = ("<!-- bench:join -->", "<!-- /bench:join -->")


def render(result: dict[str, Any], path: Path) -> str:
    """The README's table of one run."""
    mem = result["memory"]
    lines = [
        f"Run `{result['started']}`. Raw: `{path.relative_to(ROOT)}`. Best of "
        f"{result.get('rounds', 3)} rounds; the service's CPU, one core.",
        "",
        "| token events a span | encoding | spans/s | timeline events/s | µs a span |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for p in result["throughput"]:
        lines.append(
            f"| {p['events_per_span']:,} | {p['encoding']} | {p['spans_per_cpu_s']:,} "
            f"| {p['events_per_cpu_s']:,} | {p['cpu_us_per_span']:,} |"
        )
    lines += [
        "",
        f"Memory: {mem['traces']:,.0f} traces of two 200-event spans held in the window raised "
        f"RSS from {mem['rss_before_mib']} to {mem['rss_after_mib']} MiB: "
        f"{mem['bytes_per_trace']:,} B a trace, {mem['bytes_per_event']} B a timeline event.",
    ]
    return "\n".join(lines)


def redraw(result: dict[str, Any], path: Path) -> None:
    """Replace the table between the markers in bench/README.md."""
    text = README.read_text()
    start, end = text.index(MARKERS[0]), text.index(MARKERS[1])
    table = render(result, path)
    README.write_text(text[: start + len(MARKERS[0])] + "\n" + table + "\n" + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per point; the best is kept")
    parser.add_argument("--redraw", type=Path, help="redraw README's table from a saved run")
    args = parser.parse_args()
    if args.redraw is not None:
        path = args.redraw.resolve()
        redraw(json.loads(path.read_text()), path)
        return
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = {
        "kind": "join",
        "started": started,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
        "throughput": [asdict(p) for p in throughput(args.rounds)],
        "memory": memory(),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{started}-join.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    redraw(result, path)
    print(f"wrote {path.relative_to(ROOT)} and the table in bench/README.md")


if __name__ == "__main__":
    main()
