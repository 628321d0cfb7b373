"""OpenTelemetry export: one span per flow record, with the record's ids, times and figures."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hopmeter.errors import HopmeterError, OtelConfigError
from hopmeter.export import otel
from hopmeter.export.otel import OtelExporter, traces_url
from tests.harness.procs import free_port
from tests.harness.scripted import Exchange, ScriptedUpstream

T0 = 1_800_000_000.25  # request start, epoch seconds
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = "b7ad6b7169203331"
SECRETS = ("sk-live-123", "session=abc", "Bearer tok", "the secret reply text", "x-api-key")


def record(**over: Any) -> dict[str, Any]:
    """A flow record shaped like hopmeter's (docs/design.md §4), with literal times."""
    rec: dict[str, Any] = {
        "schema": "hopmeter.flow/1",
        "trace_id": TRACE,
        "span_id": SPAN,
        "parent_span_id": None,
        "flow_id": "f-1",
        "hop": "edge",
        "listener": "edge",
        "request": {
            "method": "POST",
            "scheme": "http",
            "host": "llm.internal",
            "path": "/v1/chat/completions",
            "t_start": T0,
            "t_end": T0 + 0.001,
            "bytes": 77,
        },
        "response": {
            "status": 200,
            "http_version": "HTTP/1.1",
            "content_type": "text/event-stream",
            "content_encoding": None,
            "t_headers": T0 + 0.002,
            "t_first_byte": T0 + 0.05,
            "t_last_byte": T0 + 0.8,
            "bytes_wire": 6073,
            "bytes_decoded": 6073,
            "bytes_out": 6073,
            "ended": "complete",
            "headers": {"cache-control": "no-cache", "x-api-key": "sk-live-123"},
        },
        "events": [[0.05, 0, 0], [0.06, 1, 5], [0.8, 1, 9]],
        "figures": {
            "ttfb_s": 0.05,
            "ttfe_s": 0.05,
            "ttft_s": 0.06,
            "duration_s": 0.8,
            "tokens": 30,
            "tokens_source": "usage",
            "usage_input_tokens": 12,
            "itl_p50_s": 0.025,
            "itl_p99_s": 0.03,
            "max_gap_s": 0.04,
            "stalls": 0,
            "tokens_per_s": 39.9,
        },
        "api": "openai.chat",
        "model": "gpt-4o-mini",
        "findings": [],
        "content": "the secret reply text",
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(rec.get(key), dict):
            rec[key] = {**rec[key], **value}
        else:
            rec[key] = value
    return rec


def ns(t: float) -> int:
    return round(t * 1e9)


@pytest.fixture
def memory() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def exporter(memory: InMemorySpanExporter) -> Iterator[OtelExporter]:
    ex = OtelExporter("http://127.0.0.1:4318", exporter=memory)
    yield ex
    ex.close()


def spans_of(ex: OtelExporter, memory: InMemorySpanExporter, *recs: dict[str, Any]) -> list[Any]:
    for rec in recs:
        ex.observe(SimpleNamespace(record=rec))
    assert ex.flush(10)
    return list(memory.get_finished_spans())


def one(ex: OtelExporter, memory: InMemorySpanExporter, rec: dict[str, Any]) -> Any:
    (span,) = spans_of(ex, memory, rec)
    return span


def test_span_name_is_hop_method_and_route(exporter: OtelExporter, memory: Any) -> None:
    """A span is named `hopmeter {hop} {method} {route}` with a known route's template."""
    span = one(exporter, memory, record())
    assert span.name == "hopmeter edge POST /v1/chat/completions"
    assert span.kind is trace.SpanKind.SERVER


def test_span_name_keeps_ids_out(exporter: OtelExporter, memory: Any) -> None:
    """Ids in a path collapse into the route template; an unknown path adds no route and an
    unknown method is named HTTP (HTTP semantic conventions)."""
    azure = record(request={"path": "/openai/deployments/prod-4o/chat/completions"})
    unknown = record(request={"path": "/v1/files/file-abc123", "method": "GET"})
    odd = record(request={"method": "BREW"})
    spans = spans_of(exporter, memory, azure, unknown, odd)
    assert [s.name for s in spans] == [
        "hopmeter edge POST /openai/deployments/{deployment}/chat/completions",
        "hopmeter edge GET",
        "hopmeter edge HTTP /v1/chat/completions",
    ]
    assert spans[2].attributes["http.request.method"] == "_OTHER"
    assert spans[2].attributes["http.request.method_original"] == "BREW"


def test_ids_are_the_records(exporter: OtelExporter, memory: Any) -> None:
    """The span's trace id and span id are the record's; without a parent it is a root."""
    span = one(exporter, memory, record())
    assert format(span.context.trace_id, "032x") == TRACE
    assert format(span.context.span_id, "016x") == SPAN
    assert span.parent is None


def test_parent_span_id_is_the_remote_parent(exporter: OtelExporter, memory: Any) -> None:
    """A record's parent_span_id becomes the span's remote parent, in the same trace."""
    span = one(exporter, memory, record(parent_span_id=PARENT))
    assert span.parent is not None and span.parent.is_remote
    assert format(span.parent.span_id, "016x") == PARENT
    assert format(span.parent.trace_id, "032x") == TRACE
    assert format(span.context.span_id, "016x") == SPAN


def test_missing_or_bad_ids_fall_back(exporter: OtelExporter, memory: Any) -> None:
    """Without a span id the span gets a random one; a bad trace id gives a fresh root trace."""
    no_span = record()
    del no_span["span_id"], no_span["parent_span_id"]
    bad_trace = record(trace_id="not-hex", parent_span_id=PARENT, span_id="0" * 16)
    a, b = spans_of(exporter, memory, no_span, bad_trace)
    assert format(a.context.trace_id, "032x") == TRACE
    assert a.context.span_id not in (0, int(SPAN, 16))
    assert format(b.context.trace_id, "032x") != TRACE and b.context.trace_id != 0
    assert b.context.span_id != 0
    assert b.parent is None


def test_times_and_events(exporter: OtelExporter, memory: Any) -> None:
    """Start is the request start, end the last byte; events sit at first byte, token, last byte."""
    span = one(exporter, memory, record())
    assert span.start_time == ns(T0)
    assert span.end_time == ns(T0 + 0.8)
    assert [(e.name, e.timestamp) for e in span.events] == [
        ("first_byte", ns(T0 + 0.05)),
        ("first_token", ns(T0 + 0.06)),
        ("last_byte", ns(T0 + 0.8)),
    ]


def test_end_falls_back_to_what_the_record_knows(exporter: OtelExporter, memory: Any) -> None:
    """No response: the span ends at the request's end; only a start: it ends about now."""
    no_response = record()
    del no_response["response"], no_response["figures"]
    only_start = record(request={"t_end": None, "t_start": time.time() - 1.0})
    del only_start["response"], only_start["figures"]
    before = time.time_ns()
    a, b = spans_of(exporter, memory, no_response, only_start)
    assert a.end_time == ns(T0 + 0.001)
    assert a.events == ()
    assert before <= b.end_time <= time.time_ns()


def test_attributes_use_semantic_convention_names(exporter: OtelExporter, memory: Any) -> None:
    """HTTP and GenAI names where they fit, hopmeter.* for the figures, nothing that is None."""
    rec = record(findings=[{"kind": "stall"}, {"kind": "burst_gaps"}])
    rec["figures"]["itl_p99_s"] = None
    attrs = dict(one(exporter, memory, rec).attributes)
    assert attrs == {
        "hopmeter.hop": "edge",
        "hopmeter.listener": "edge",
        "hopmeter.flow_id": "f-1",
        "http.request.method": "POST",
        "url.scheme": "http",
        "url.path": "/v1/chat/completions",
        "http.route": "/v1/chat/completions",
        "server.address": "llm.internal",
        "http.request.body.size": 77,
        "http.response.status_code": 200,
        "http.response.body.size": 6073,
        "network.protocol.version": "1.1",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 30,
        "hopmeter.api": "openai.chat",
        "hopmeter.ended": "complete",
        "hopmeter.ttfb_s": 0.05,
        "hopmeter.ttfe_s": 0.05,
        "hopmeter.ttft_s": 0.06,
        "hopmeter.duration_s": 0.8,
        "hopmeter.itl_p50_s": 0.025,
        "hopmeter.max_gap_s": 0.04,
        "hopmeter.stalls": 0,
        "hopmeter.tokens_per_s": 39.9,
        "hopmeter.tokens_source": "usage",
        "hopmeter.findings": "stall,burst_gaps",
        "hopmeter.timeline.v": 1,
        "hopmeter.timeline.t_us": (60000, 800000),
        "hopmeter.timeline.offset": (5, 9),
    }


def test_timeline_off_keeps_spans_to_figures(memory: InMemorySpanExporter) -> None:
    """With the timeline off a span carries no hopmeter.timeline attribute, and batches of 512."""
    ex = OtelExporter("http://127.0.0.1:4318", exporter=memory, timeline=False)
    try:
        attrs = dict(one(ex, memory, record()).attributes)
    finally:
        ex.close()
    assert not [key for key in attrs if key.startswith("hopmeter.timeline.")]
    assert attrs["hopmeter.hop"] == "edge"


def test_timeline_keeps_the_head_and_counts_the_rest(exporter: OtelExporter, memory: Any) -> None:
    """Past 1,024 token events the first are kept, the rest counted with the record's dropped,
    and the whole stream's token span travels too."""
    events = [[0.01 * i, 1 if i % 3 else 2, 4 * i] for i in range(1, 1501)]
    attrs = dict(one(exporter, memory, record(events=events, events_dropped=7)).attributes)
    assert len(attrs["hopmeter.timeline.t_us"]) == 1024
    assert attrs["hopmeter.timeline.t_us"][:2] == (10000, 20000)
    assert attrs["hopmeter.timeline.tokens"][:3] == (1, 1, 2)
    assert attrs["hopmeter.timeline.dropped"] == 1500 - 1024 + 7
    assert attrs["hopmeter.timeline.span_us"] == 14_990_000


def test_span_limits_from_the_environment_do_not_cut_hopmeter_spans(
    memory: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's OTEL_*_LIMIT settings neither evict hopmeter.hop nor cut strings."""
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "4")
    monkeypatch.setenv("OTEL_ATTRIBUTE_COUNT_LIMIT", "4")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "3")
    ex = OtelExporter("http://127.0.0.1:4318", exporter=memory)
    try:
        span = one(ex, memory, record())
    finally:
        ex.close()
    assert span.attributes["hopmeter.hop"] == "edge"
    assert span.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert span.dropped_attributes == 0


def test_service_is_named_on_the_resource(memory: Any) -> None:
    """The resource carries the service name given, and hopmeter's version."""
    ex = OtelExporter("http://127.0.0.1:4318", service_name="edge-proxy", exporter=memory)
    span = one(ex, memory, record())
    ex.close()
    assert span.resource.attributes["service.name"] == "edge-proxy"
    assert span.resource.attributes["service.version"] == otel.__version__


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"response": {"status": 502}}, "502"),
        ({"response": {"ended": "upstream_reset"}}, "upstream_reset"),
        ({"response": {"ended": "client_gone"}}, "client_gone"),
        ({"findings": [{"kind": "truncated"}]}, "truncated"),
        ({"response": None}, "no_response"),
        (
            {"response": None, "upstream_error": {"cause": "connect_refused"}},
            "connect_refused",
        ),
    ],
)
def test_failures_set_error_status(
    exporter: OtelExporter, memory: Any, over: dict[str, Any], error: str
) -> None:
    """A 5xx, an end other than complete, a truncated stream or no response is an ERROR span."""
    span = one(exporter, memory, record(**over))
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.status.description == error
    assert span.attributes["error.type"] == error


def test_success_and_client_errors_leave_status_unset(exporter: OtelExporter, memory: Any) -> None:
    """A complete 200 or a 4xx leaves the server span's status unset (HTTP conventions)."""
    ok, not_found = spans_of(exporter, memory, record(), record(response={"status": 404}))
    assert ok.status.status_code is trace.StatusCode.UNSET
    assert not_found.status.status_code is trace.StatusCode.UNSET
    assert "error.type" not in ok.attributes


def test_hops_become_hold_events(exporter: OtelExporter, memory: Any) -> None:
    """Each segment of an outermost record is a "hold" event at the flow's first token."""
    hop = {
        "segment": "edge>origin",
        "inner_hop": "origin",
        "first_token_hold_s": 0.7,
        "hold_p50_s": 0.35,
        "hold_p99_s": 0.69,
        "hold_max_s": 0.7,
        "whole_body": True,
        "tokens_aligned": 30,
        "skew_s": 0.0,
        "skew_bounds_s": [None, 0.001],
        "findings": [{"kind": "whole_body_hold"}],
    }
    span = one(exporter, memory, record(hops=[hop]))
    (hold,) = [e for e in span.events if e.name == "hold"]
    assert hold.timestamp == ns(T0 + 0.06)
    assert dict(hold.attributes) == {
        "hopmeter.segment": "edge>origin",
        "hopmeter.inner_hop": "origin",
        "hopmeter.first_token_hold_s": 0.7,
        "hopmeter.hold_p50_s": 0.35,
        "hopmeter.hold_p99_s": 0.69,
        "hopmeter.hold_max_s": 0.7,
        "hopmeter.whole_body": True,
        "hopmeter.tokens_aligned": 30,
        "hopmeter.findings": "whole_body_hold",
    }


def test_no_content_headers_or_keys_on_spans(exporter: OtelExporter, memory: Any) -> None:
    """Reply text, response headers, keys and cookies appear nowhere in a span."""
    rec = record(response={"headers": {"set-cookie": "session=abc", "x-api-key": "sk-live-123"}})
    rec["request"]["headers"] = {"authorization": "Bearer tok"}
    span = one(exporter, memory, rec)
    texts = [span.name, *map(str, span.attributes.items())]
    texts += [f"{e.name} {dict(e.attributes or {})}" for e in span.events]
    blob = " ".join(texts).lower()
    for secret in (*SECRETS, "cache-control", "set-cookie", "authorization"):
        assert secret.lower() not in blob


def test_the_global_tracer_provider_is_left_alone(exporter: OtelExporter, memory: Any) -> None:
    """Exporting uses the exporter's own provider; the process-wide one is not set."""
    before = trace.get_tracer_provider()
    one(exporter, memory, record())
    assert trace.get_tracer_provider() is before
    assert not trace.get_current_span().get_span_context().is_valid


def test_close_flushes_and_later_records_are_ignored(memory: Any) -> None:
    """close() exports what is queued; observing after it, or closing twice, does nothing."""
    ex = OtelExporter("http://127.0.0.1:4318", exporter=memory)
    ex.observe(SimpleNamespace(record=record()))
    ex.close()
    ex.close()
    ex.observe(SimpleNamespace(record=record(span_id=PARENT)))
    assert len(memory.get_finished_spans()) == 1


def test_unsampled_spans_do_not_fill_the_queue(
    memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampler that drops spans (OTEL_TRACES_SAMPLER) does not count them as queued."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setattr(otel, "MAX_QUEUED_SPANS", 2)
    monkeypatch.setattr(otel, "MAX_EXPORT_BATCH", 2)
    ex = OtelExporter("http://127.0.0.1:4318", exporter=memory)
    for _ in range(5):
        ex.observe(SimpleNamespace(record=record()))
    ex.close()
    assert ex.dropped == 0
    assert memory.get_finished_spans() == ()


class Scripted(SpanExporter):
    """Answers each export with the next scripted outcome: a result, or an exception to raise."""

    def __init__(self, outcomes: list[SpanExportResult | Exception]) -> None:
        self.outcomes = outcomes
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        outcome = self.outcomes[min(self.calls, len(self.outcomes) - 1)]
        self.calls += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_failures_never_raise_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    """Failed and raising exports are logged once per outage, and recovery once."""
    caplog.set_level(logging.INFO, logger="hopmeter")
    failing = SpanExportResult.FAILURE
    scripted = Scripted([failing, RuntimeError("boom"), failing, SpanExportResult.SUCCESS])
    ex = OtelExporter("http://127.0.0.1:4318", exporter=scripted)
    for _ in range(4):
        ex.observe(SimpleNamespace(record=record()))
        ex.flush(10)
    ex.close()
    assert scripted.calls == 4
    messages = [r.getMessage() for r in caplog.records if r.name == "hopmeter"]
    assert len([m for m in messages if "export failed" in m]) == 1
    assert len([m for m in messages if "works again" in m]) == 1


async def _bad_request(ex: Exchange) -> None:
    """A collector that answers every export 400, which the exporter does not retry."""
    await ex.head({"content-type": "application/x-protobuf"}, status=400)
    await ex.end()


@pytest.mark.loopback
def test_close_sends_nothing_more_to_a_failing_collector() -> None:
    """Once an export failed, close() gives up at once: what is still queued is dropped, not
    sent to the collector again (a dead collector must not hold the proxy's shutdown)."""
    with ScriptedUpstream(_bad_request) as collector:
        ex = OtelExporter(f"http://127.0.0.1:{collector.port}", timeout_s=1.0)
        ex.observe(SimpleNamespace(record=record()))
        ex.flush(10)  # one export, refused
        tried = len(collector.requests)
        for _ in range(3):
            ex.observe(SimpleNamespace(record=record()))
        ex.close()
    assert tried >= 1 and all(r.path == "/v1/traces" for r in collector.requests)
    assert len(collector.requests) == tried


@pytest.mark.loopback
def test_unreachable_collector_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A real OTLP exporter with nothing listening: no exception, one hopmeter line, no library
    lines, closed without an error."""
    caplog.set_level(logging.DEBUG)
    ex = OtelExporter(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    ex.observe(SimpleNamespace(record=record()))
    ex.flush(10)  # one export, failing within timeout_s
    for _ in range(3):
        ex.observe(SimpleNamespace(record=record()))
    ex.close()
    ours = [r for r in caplog.records if r.name == "hopmeter" and r.levelno >= logging.WARNING]
    assert len(ours) == 1 and "127.0.0.1" in ours[0].getMessage()
    assert not [
        r
        for r in caplog.records
        if r.name.startswith("opentelemetry.exporter") and r.levelno >= logging.WARNING
    ]


def test_a_full_queue_drops_and_counts(
    memory: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While the collector is stuck, spans past the queue bound are dropped, counted, logged
    once, and the SDK's per-span queue warning never fires."""
    monkeypatch.setattr(otel, "MAX_QUEUED_SPANS", 4)
    monkeypatch.setattr(otel, "MAX_EXPORT_BATCH", 4)
    entered, release = threading.Event(), threading.Event()

    class Stuck(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            entered.set()
            release.wait(10)
            return SpanExportResult.SUCCESS

    ex = OtelExporter("http://127.0.0.1:4318", exporter=Stuck())
    for _ in range(4):  # a full batch wakes the worker, which gets stuck exporting it
        ex.observe(SimpleNamespace(record=record()))
    assert entered.wait(10)
    for _ in range(7):  # four fit in the queue again, three do not
        ex.observe(SimpleNamespace(record=record()))
    assert ex.dropped == 3
    release.set()
    ex.close()
    assert len([r for r in caplog.records if "being dropped" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if "Queue full" in r.getMessage()]


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otel.example/v1/traces", "https://otel.example/v1/traces"),
        (" https://gw.example/otlp/ ", "https://gw.example/otlp/v1/traces"),
    ],
)
def test_traces_url_appends_the_signal_path(endpoint: str, url: str) -> None:
    """A collector's base URL gets /v1/traces; a traces URL is kept as it is."""
    assert traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4318", "grpc://collector:4317", "http://", ""])
def test_bad_endpoint_is_a_config_error(endpoint: str) -> None:
    """Anything but an http(s) URL is refused with a message naming the option and an example."""
    with pytest.raises(OtelConfigError, match=r"hopmeter_otel_endpoint: .* e\.g\. http://") as exc:
        OtelExporter(endpoint)
    assert isinstance(exc.value, HopmeterError) and isinstance(exc.value, ValueError)


@pytest.mark.integration
def test_hopmeter_runs_without_the_extra() -> None:
    """The proxy, CLI and metrics import with opentelemetry made unimportable."""
    code = (
        "import sys\n"
        "for m in ('opentelemetry', 'opentelemetry.sdk'):\n"
        "    sys.modules[m] = None\n"
        "import hopmeter.proxy.addon.meter, hopmeter.cli, hopmeter.proxy.run.runner\n"
        "import hopmeter.proxy.addon.outputs\n"
        "try:\n"
        "    import hopmeter.export.otel\n"
        "except ImportError:\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_importing_installs_no_logging_filter_and_loads_no_prometheus() -> None:
    """Importing the module changes no logger and loads no prometheus_client (the route labels
    come from hopmeter.export.labels)."""
    code = (
        "import logging, sys\n"
        "import hopmeter.export.otel as otel\n"
        "name = otel.OTLPSpanExporter.__module__\n"
        "assert logging.getLogger(name).filters == [], logging.getLogger(name).filters\n"
        "assert 'prometheus_client' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_exporters_install_the_logging_filter_once(memory: InMemorySpanExporter) -> None:
    """Each exporter makes sure the OTLP library's logger is quiet; two install one filter."""
    library = logging.getLogger(otel.OTLPSpanExporter.__module__)
    first, second = (OtelExporter("http://127.0.0.1:4318", exporter=memory) for _ in range(2))
    try:
        assert library.filters.count(otel._QUIET) == 1
    finally:
        first.close()
        second.close()


def test_a_failed_exports_reason_never_says_the_endpoints_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The exporter's own errors quote the URL it posted to: the failure's log line says the
    reason without the endpoint's user, password, query or query values."""
    caplog.set_level(logging.INFO, logger="hopmeter")
    url = "http://otel:S3cretPW@127.0.0.1:4318/v1/traces?token=S3cretQ%2Bx"
    quoting = RuntimeError(f"Max retries exceeded with url: /v1/traces?token=S3cretQ%2Bx ({url})")
    ex = OtelExporter(url, exporter=Scripted([quoting]))
    ex.observe(SimpleNamespace(record=record()))
    ex.flush(10)
    ex.close()
    (failed,) = [r for r in caplog.records if "export failed" in r.getMessage()]
    said = failed.getMessage() + repr(vars(failed))  # the line and every field it carries
    assert "S3cret" not in said and "[redacted]" in said
