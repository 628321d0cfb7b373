"""OTLP for tests: a running `hopmeter join --serve`, literal hopmeter spans, and a trace-id router.

The router stands in for the OpenTelemetry Collector's load-balancing exporter, which cannot run
on the test machines (no container engine, no Collector package): it takes OTLP/HTTP protobuf,
splits each request by trace id with rendezvous hashing (a backend leaving moves only its own
traces, as the exporter's consistent-hash ring does), keeps every span under its own Resource
and Scope, and forwards each part over OTLP/gRPC with gzip, through grpcio: the protocol and
compression the Collector's exporter uses.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.procs import Proc, free_port, hopmeter, wait_for

PROTOBUF = "application/x-protobuf"


@dataclass
class JoinServe:
    """A running `hopmeter join --serve`: its process, ports and joined-records file."""

    proc: Proc
    port: int
    metrics_port: int
    grpc_port: int | None
    records: Path

    @property
    def url(self) -> str:
        """The OTLP/HTTP base URL, what `--otel-endpoint` takes."""
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed `name{label="value",...}` (labels sorted)."""
        return scrape(self.metrics_port)

    def joined(self, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Wait until at least `count` joined lines were written; all of them."""

        def enough() -> list[dict[str, Any]] | None:
            if not self.records.exists():
                return None
            lines = [ln for ln in self.records.read_bytes().splitlines() if ln.strip()]
            return [orjson.loads(ln) for ln in lines] if len(lines) >= count else None

        return wait_for(enough, timeout_s, f"{count} joined lines in {self.records}")


@contextlib.contextmanager
def join_serve(
    tmp: Path, *args: str, name: str = "join", grpc_port: bool = False, window_s: float = 30.0
) -> Iterator[JoinServe]:
    """`hopmeter join --serve` on free loopback ports, joined lines to tmp/NAME.jsonl."""
    port, metrics_port = free_port(), free_port()
    grpc_at = free_port() if grpc_port else None
    records = tmp / f"{name}.jsonl"
    extra = ("--grpc", f"127.0.0.1:{grpc_at}") if grpc_at else ()
    with hopmeter(
        tmp,
        "join",
        "--serve",
        *("--listen", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics_port}"),
        *("--records", str(records), "--window", str(window_s)),
        *extra,
        *args,
        name=name,
        ports=(port, metrics_port, *((grpc_at,) if grpc_at else ())),
    ) as proc:
        yield JoinServe(proc, port, metrics_port, grpc_at, records)


def scrape(port: int) -> dict[str, float]:
    """A metrics endpoint's samples, keyed `name{label="value",...}`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def post(
    port: int,
    body: bytes,
    content_type: str = PROTOBUF,
    *,
    encoding: str = "",
    method: str = "POST",
    path: str = "/v1/traces",
) -> tuple[int, dict[str, str], bytes]:
    """One OTLP/HTTP request: (status, headers, body)."""
    headers = {"content-type": content_type}
    if encoding:
        headers["content-encoding"] = encoding
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


# -- literal spans ---------------------------------------------------------------------------------
def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[_any(v) for v in value]))
    return AnyValue(string_value=str(value))


def hop_span(
    trace_id: bytes,
    span_id: bytes,
    *,
    hop: str | None = "edge",
    parent: bytes = b"",
    start_ns: int = 1_800_000_000_000_000_000,
    t_us: Sequence[int] = (300_000, 320_000),
    offsets: Sequence[int] = (4, 8),
    **attributes: Any,
) -> Span:
    """A span as hopmeter exports it: `hop` (None: a foreign span), a timeline, more attributes
    (dots written as `__`, e.g. hopmeter__ttft_s=0.3)."""
    attrs: dict[str, Any] = {}
    if hop is not None:
        attrs["hopmeter.hop"] = hop
        attrs["hopmeter.timeline.v"] = 1
        attrs["hopmeter.timeline.t_us"] = list(t_us)
        attrs["hopmeter.timeline.offset"] = list(offsets)
    attrs.update({key.replace("__", "."): value for key, value in attributes.items()})
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=f"hopmeter {hop} POST /v1/chat/completions",
        kind=Span.SpanKind.SPAN_KIND_SERVER,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=start_ns + 1_000_000_000,
        attributes=[KeyValue(key=k, value=_any(v)) for k, v in attrs.items()],
    )


def exported(
    records: Sequence[dict[str, Any]], *, timeline: bool = True
) -> ExportTraceServiceRequest:
    """The export request hopmeter's own OtelExporter makes of `records` (the SDK's encoder)."""
    from types import SimpleNamespace

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hopmeter.export.otel import OtelExporter

    memory = InMemorySpanExporter()
    exporter = OtelExporter("http://127.0.0.1:4318", exporter=memory, timeline=timeline)
    for record in records:
        exporter.observe(SimpleNamespace(record=record))
    assert exporter.flush(10)
    exporter.close()
    return encode_spans(memory.get_finished_spans())


def to_otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP JSON, as the Collector's file exporter writes a request: camelCase, hex ids."""
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(request, use_integers_for_enums=True)

    def hex_ids(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                else:
                    hex_ids(value)
        elif isinstance(node, list):
            for value in node:
                hex_ids(value)

    hex_ids(doc)
    return doc


def request_of(spans: Sequence[Span], service: str = "hopmeter") -> ExportTraceServiceRequest:
    """One export request with every span under one resource and scope."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=_any(service)))
    rs.scope_spans.add().spans.extend(spans)
    return request


# -- the router ------------------------------------------------------------------------------------
def pick(trace_id: bytes, backends: Sequence[str]) -> int:
    """Rendezvous (highest random weight) hashing of a trace id over backends."""
    weights = [hashlib.blake2b(trace_id + b.encode(), digest_size=8).digest() for b in backends]
    return weights.index(max(weights))


def split(
    request: ExportTraceServiceRequest, backends: Sequence[str]
) -> dict[int, ExportTraceServiceRequest]:
    """One request per backend that gets spans, each span under a copy of its Resource/Scope."""
    out: dict[int, ExportTraceServiceRequest] = {}
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            parts: dict[int, ScopeSpans] = {}
            for span in ss.spans:
                i = pick(span.trace_id, backends)
                if i not in parts:
                    target: ResourceSpans = out.setdefault(
                        i, ExportTraceServiceRequest()
                    ).resource_spans.add()
                    target.resource.CopyFrom(rs.resource)
                    parts[i] = target.scope_spans.add()
                    parts[i].scope.CopyFrom(ss.scope)
                parts[i].spans.append(span)
    return out


class TraceRouter:
    """OTLP/HTTP protobuf in, OTLP/gRPC (gzip) out to the backend each trace id hashes to."""

    def __init__(self, backends: Sequence[str]) -> None:  # backends: "127.0.0.1:PORT"
        self.backends = list(backends)
        self.channels = [grpc.insecure_channel(b) for b in self.backends]
        self.stubs = [TraceServiceStub(c) for c in self.channels]
        self.forwarded = [0] * len(backends)  # spans sent to each backend
        self._lock = threading.Lock()
        router = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                status = router.route(body)
                self.send_response(status)
                self.send_header("content-type", PROTOBUF)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, body: bytes) -> int:
        """Forward one request's parts; 200, or 503 (retryable) when a backend failed."""
        request = ExportTraceServiceRequest.FromString(body)
        status = 200
        for i, part in split(request, self.backends).items():
            try:
                self.stubs[i].Export(part, timeout=10, compression=grpc.Compression.Gzip)
            except grpc.RpcError:
                status = 503
                continue
            with self._lock:
                self.forwarded[i] += sum(
                    len(ss.spans) for rs in part.resource_spans for ss in rs.scope_spans
                )
        return status

    def __enter__(self) -> TraceRouter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        for channel in self.channels:
            channel.close()
