"""OpenTelemetry trace export: one SERVER span per flow per hop (`pip install 'hopmeter[otel]'`).

The only module that imports opentelemetry; the addon imports it only when `--otel-endpoint` is
set, so hopmeter runs without the extra. Each record becomes a span with the record's own ids:
its trace id, its span id (the one hopmeter forwarded in `traceparent`, so the next hop's span is
this one's child) and the incoming parent, so a tracing backend joins the hops of a fleet.
Spans carry figures and names, never content, headers, keys or cookies; unless told not to, they
also carry the flow's token timeline (hopmeter.core.timeline), so that any OTLP consumer, and
`hopmeter join` above all, can align the hops of one trace from spans alone (docs/fleet.md).

The provider is this exporter's own, never the global one. Spans are batched and sent on the
SDK's worker thread; a collector that fails is logged once per outage and never reaches the proxy.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard
from urllib.parse import unquote, urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

from hopmeter import __version__
from hopmeter.core import timeline as token_timeline
from hopmeter.core.hops import events_out
from hopmeter.core.spans import FIGURES as SPAN_FIGURES
from hopmeter.errors import OtelConfigError
from hopmeter.export.labels import DEFAULT_ROUTES, OTHER, RouteLabels
from hopmeter.log import get_logger

log = get_logger()

TRACES_PATH = "/v1/traces"  # OTLP/HTTP: the traces signal's path under the collector's base URL
# One export, retries included (the SDK's default is 10 s). Closing waits for the last export, on
# the proxy's event loop at shutdown, so a dead collector may cost this long once.
EXPORT_TIMEOUT_S = 5.0
# Spans waiting for the worker thread (the SDK's default queue); past it a span is dropped and
# counted here, before the SDK's own queue could log a warning per span.
MAX_QUEUED_SPANS = 2048
MAX_EXPORT_BATCH = 512  # the SDK's default batch
# With the timeline, spans are up to ~13 KB (1,024 token events): 128 of them are ~1.7 MB a
# request, below a Collector's 4 MiB gRPC limit; 512 of the largest would pass it and be lost.
MAX_TIMELINE_BATCH = 128
# hopmeter's own span limits, whatever OTEL_*_LIMIT the environment sets: past the attribute
# count the Python SDK evicts the OLDEST attribute (hopmeter.hop, which makes a span hopmeter's),
# and a value-length limit would cut its strings. Its spans have ~35 attributes and 3 events
# plus one per segment.
SPAN_LIMITS = SpanLimits(
    max_span_attributes=128,
    max_events=64,
    max_links=0,
    max_event_attributes=32,
    max_attribute_length=SpanLimits.UNSET,
    max_span_attribute_length=SpanLimits.UNSET,
)

# The record's `api` -> the GenAI semantic conventions' provider name (gen_ai.provider.name, and
# gen_ai.system, its older name that many backends still query). Other APIs name no provider.
GEN_AI_PROVIDERS = {
    "openai.chat": "openai",
    "openai.responses": "openai",
    "anthropic.messages": "anthropic",
    "gemini": "gcp.gemini",
}
# figures -> hopmeter.<name>: seconds, counts (what a join reads back, core.spans.FIGURES) and
# the token source (docs/design.md §4, §6).
FIGURES = (*SPAN_FIGURES, "tokens_source")
# a `hops` entry -> attributes of its "hold" event.
HOLD_FIGURES = (
    "inner_hop",
    "first_token_hold_s",
    "hold_p50_s",
    "hold_p99_s",
    "hold_max_s",
    "whole_body",
    "tokens_aligned",
)
# HTTP semantic conventions: a method outside this set is "_OTHER", and "HTTP" in span names.
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_ROUTES = RouteLabels(DEFAULT_ROUTES)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a collector base URL (or the traces URL itself)."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtelConfigError(
            f"hopmeter_otel_endpoint: {endpoint!r} is not an http(s) URL; give the collector's "
            f"OTLP/HTTP address, e.g. http://127.0.0.1:4318"
        )
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return urlunsplit(parts._replace(path=path))


def _secrets(url: str) -> tuple[str, ...]:
    """What of `url` a log line must not say: its user, password, query and query values (the
    exporter's own errors quote the URL it posted to), longest first."""
    parts = urlsplit(url)
    found = {parts.username or "", parts.password or "", parts.query}
    found.update(pair.partition("=")[2] for pair in parts.query.split("&"))
    found.update(unquote(v) for v in list(found))
    return tuple(sorted((v for v in found if len(v) >= 4), key=len, reverse=True))


def _shown(url: str) -> str:
    """`url` without user:password, for logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc, query=""))


class OtelExporter:
    """Observes finished flows (HopMeter's observer protocol) and exports one span for each."""

    def __init__(
        self,
        endpoint: str,
        service_name: str = "hopmeter",
        headers: dict[str, str] | None = None,
        *,
        timeout_s: float = EXPORT_TIMEOUT_S,
        exporter: SpanExporter | None = None,
        timeline: bool = True,
    ) -> None:
        """Send to `endpoint` (a collector's OTLP/HTTP base URL); `exporter` replaces OTLP.

        `timeline`: carry each flow's token timeline (off keeps spans small).
        """
        self.url = traces_url(endpoint)
        self.timeline = timeline
        _quiet_library_logs()
        inner = exporter or OTLPSpanExporter(endpoint=self.url, headers=headers, timeout=timeout_s)
        self._guard = _GuardedExporter(inner, _shown(self.url), _secrets(self.url))
        self._ids = _RecordIds()
        self._provider = TracerProvider(
            resource=Resource.create(
                {"service.name": service_name, "service.version": __version__}
            ),
            id_generator=self._ids,
            span_limits=SPAN_LIMITS,
            shutdown_on_exit=False,  # close() is called by the addon's done()
        )
        batch = min(MAX_TIMELINE_BATCH, MAX_EXPORT_BATCH) if timeline else MAX_EXPORT_BATCH
        self._provider.add_span_processor(
            BatchSpanProcessor(
                self._guard, max_queue_size=MAX_QUEUED_SPANS, max_export_batch_size=batch
            )
        )
        self._tracer = self._provider.get_tracer("hopmeter", __version__)
        self._closed = False
        self.dropped = 0  # spans not queued because the queue was full

    def observe(self, result: Any) -> None:
        """Export the span of one finished flow (`result.record`, docs/design.md §4)."""
        if self._closed:
            return
        if not self._guard.reserve():
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "hopmeter: OpenTelemetry spans are being dropped: the collector is behind",
                    endpoint=_shown(self.url),
                    queued=MAX_QUEUED_SPANS,
                )
            return
        try:
            if not self._export(result.record):
                self._guard.release()  # not sampled (OTEL_TRACES_SAMPLER): never queued
        except BaseException:
            self._guard.release()
            raise

    def _export(self, record: Mapping[str, Any]) -> bool:
        """Start and end the flow's span; False if the sampler dropped it."""
        trace_id = _hex_id(record.get("trace_id"), _TRACE_ID)
        parent_id = _hex_id(record.get("parent_span_id"), _SPAN_ID) if trace_id else None
        self._ids.set_next(trace_id, _hex_id(record.get("span_id"), _SPAN_ID))
        try:
            span = self._tracer.start_span(
                span_name(record),
                context=_parent(trace_id, parent_id),
                kind=trace.SpanKind.SERVER,
                attributes=span_attributes(record, timeline=self.timeline),
                start_time=_ns(_request(record).get("t_start")),
            )
        finally:
            self._ids.set_next(None, None)
        if not span.is_recording():
            return False
        for name, t in span_events(record):
            span.add_event(name, timestamp=_ns(t))
        first_token = _first_token_t(record)
        for hop in record.get("hops") or ():
            span.add_event("hold", hold_attributes(hop), _ns(first_token or _end_t(record)))
        error = error_type(record)
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.end(end_time=_ns(_end_t(record)))
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every span observed so far; False if that took longer than `timeout_s`."""
        return self._provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        """Export what is queued (giving up at once if the collector is failing) and stop."""
        if self._closed:
            return
        self._closed = True
        self._guard.closing = True
        self._provider.shutdown()


def span_name(record: Mapping[str, Any]) -> str:
    """`hopmeter {hop} {method} {route}`: a known route's template, else no route (bounded)."""
    request = _request(record)
    method = request.get("method")
    method = method if method in KNOWN_METHODS else "HTTP"
    route = _ROUTES.label(request.get("path"))
    name = f"hopmeter {record.get('hop') or '-'} {method}"
    return name if route == OTHER else f"{name} {route}"


def span_attributes(record: Mapping[str, Any], *, timeline: bool = False) -> dict[str, Any]:
    """The span's attributes: HTTP and GenAI semantic-convention names, hopmeter.* for the rest.

    `timeline` adds the token timeline (hopmeter.core.timeline) when the record has events.
    """
    request = _request(record)
    response = record.get("response") or {}
    figures = record.get("figures") or {}
    api = record.get("api")
    route = _ROUTES.label(request.get("path"))
    method = request.get("method")
    known_method = method in KNOWN_METHODS
    attrs: dict[str, Any] = {}
    pairs: Sequence[tuple[str, Any]] = (
        ("hopmeter.hop", record.get("hop")),
        ("hopmeter.listener", record.get("listener")),
        ("hopmeter.flow_id", record.get("flow_id")),
        ("http.request.method", method if known_method else "_OTHER"),
        ("http.request.method_original", None if known_method else method),
        ("url.scheme", request.get("scheme")),
        ("url.path", request.get("path")),
        ("http.route", None if route == OTHER else route),
        ("server.address", request.get("host")),
        ("http.request.body.size", request.get("bytes")),
        ("http.response.status_code", response.get("status")),
        ("http.response.body.size", response.get("bytes_wire")),
        ("network.protocol.version", _protocol_version(response.get("http_version"))),
        ("gen_ai.provider.name", GEN_AI_PROVIDERS.get(str(api))),
        ("gen_ai.system", GEN_AI_PROVIDERS.get(str(api))),
        ("gen_ai.request.model", record.get("model")),
        ("gen_ai.usage.input_tokens", figures.get("usage_input_tokens")),
        ("gen_ai.usage.output_tokens", figures.get("tokens")),
        ("hopmeter.api", api),
        ("hopmeter.ended", response.get("ended", record.get("ended"))),
        ("error.type", error_type(record)),
        *((f"hopmeter.{key}", figures.get(key)) for key in FIGURES),
    )
    for key, value in pairs:
        if _is_attribute(value):
            attrs[key] = value
    kinds = _finding_kinds(record.get("findings"))
    if kinds:
        attrs["hopmeter.findings"] = ",".join(kinds)
    events = record.get("events")
    if timeline and isinstance(events, list):
        dropped = record.get("events_dropped")
        out_s = events_out(events, record.get("chunks") or [], record.get("chunks_out") or [])
        attrs.update(
            token_timeline.encode(events, dropped if isinstance(dropped, int) else 0, out_s=out_s)
        )
    return attrs


def span_events(record: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(name, epoch seconds) of first_byte, first_token and last_byte, those the flow had."""
    response = record.get("response") or {}
    moments = (
        ("first_byte", response.get("t_first_byte")),
        ("first_token", _first_token_t(record)),
        ("last_byte", response.get("t_last_byte")),
    )
    return [(name, t) for name, t in moments if _is_time(t)]


def hold_attributes(hop: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of one segment's "hold" event, from its `hops` entry."""
    attrs: dict[str, Any] = {}
    if _is_attribute(hop.get("segment")):
        attrs["hopmeter.segment"] = hop["segment"]
    for key in HOLD_FIGURES:
        if _is_attribute(hop.get(key)):
            attrs[f"hopmeter.{key}"] = hop[key]
    kinds = _finding_kinds(hop.get("findings"))
    if kinds:
        attrs["hopmeter.findings"] = ",".join(kinds)
    return attrs


def error_type(record: Mapping[str, Any]) -> str | None:
    """Why the flow failed (a 5xx status, an end other than complete, truncated), or None."""
    response = record.get("response")
    if not response:
        # the upstream failed and the proxy answered (connect_refused, upstream_timeout, ...)
        cause = (record.get("upstream_error") or {}).get("cause")
        return str(cause) if cause else "no_response"
    status = response.get("status")
    if isinstance(status, int) and status >= 500:
        return str(status)
    ended = response.get("ended")
    if ended != "complete":
        return str(ended or "unknown")
    if "truncated" in _finding_kinds(record.get("findings")):
        return "truncated"
    return None


# -- helpers --------------------------------------------------------------------------------------
def _request(record: Mapping[str, Any]) -> Mapping[str, Any]:
    request = record.get("request")
    return request if isinstance(request, Mapping) else {}


def _is_attribute(value: object) -> bool:
    return isinstance(value, str | bool | int | float) and value != ""


def _is_time(value: object) -> TypeGuard[float]:
    """An epoch time (int or float, not bool, positive)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _ns(t: object) -> int | None:
    return round(t * 1e9) if _is_time(t) else None


def _first_token_t(record: Mapping[str, Any]) -> float | None:
    t0 = _request(record).get("t_start")
    ttft = (record.get("figures") or {}).get("ttft_s")
    if _is_time(t0) and isinstance(ttft, int | float) and not isinstance(ttft, bool):
        return float(t0) + float(ttft)
    return None


def _end_t(record: Mapping[str, Any]) -> float:
    """The last moment the record knows of; `now` if it knows only the start."""
    request = _request(record)
    response = record.get("response") or {}
    candidates = (
        request.get("t_start"),
        request.get("t_end"),
        response.get("t_headers"),
        response.get("t_first_byte"),
        response.get("t_last_byte"),
        _first_token_t(record),
    )
    known = [float(t) for t in candidates if _is_time(t)]
    if len(known) > 1:
        return max(known)
    return max([*known, time.time()])


def _finding_kinds(findings: object) -> list[str]:
    if not isinstance(findings, list):
        return []
    return [
        f["kind"] for f in findings if isinstance(f, Mapping) and isinstance(f.get("kind"), str)
    ]


def _protocol_version(http_version: object) -> str | None:
    if not isinstance(http_version, str) or not http_version.startswith("HTTP/"):
        return None
    version = http_version.removeprefix("HTTP/")
    return "2" if version == "2.0" else "3" if version == "3.0" else version


def _hex_id(value: object, shape: re.Pattern[str]) -> int | None:
    """A W3C id (lower-case hex, not all zeros) as an int, else None."""
    if isinstance(value, str) and shape.fullmatch(value):
        return int(value, 16) or None
    return None


def _parent(trace_id: int | None, parent_id: int | None) -> Context:
    """The remote parent's context; an empty one (never the caller's) for a root span."""
    if trace_id is None or parent_id is None:
        return Context()
    parent = trace.SpanContext(
        trace_id, parent_id, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent), Context())


class _RecordIds(IdGenerator):
    """Gives the SDK the record's ids for the span being started; random ids when it has none."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._next = threading.local()

    def set_next(self, trace_id: int | None, span_id: int | None) -> None:
        """Ids for the next span this thread starts."""
        self._next.trace_id = trace_id
        self._next.span_id = span_id

    def generate_trace_id(self) -> int:
        value: int | None = getattr(self._next, "trace_id", None)
        self._next.trace_id = None
        return value or self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        value: int | None = getattr(self._next, "span_id", None)
        self._next.span_id = None
        return value or self._random.generate_span_id()


class _LibraryQuiet(logging.Filter):
    """Drops the OTLP exporter's own log lines while hopmeter exports (it reports once itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self.local, "active", False):
            if self.local.reason is None:  # the first line names the cause; later ones retries
                self.local.reason = record.getMessage()
            return False
        return True


_QUIET = _LibraryQuiet()


def _quiet_library_logs() -> None:
    """Install _QUIET on the OTLP exporter's logger, once however many exporters start.

    Done when an exporter starts, not at import: importing hopmeter changes no logger.
    """
    library = logging.getLogger(OTLPSpanExporter.__module__)
    if _QUIET not in library.filters:
        library.addFilter(_QUIET)


class _GuardedExporter(SpanExporter):
    """Counts queued spans and exports them; a failure is logged once per outage, never raised."""

    def __init__(self, inner: SpanExporter, shown_url: str, secrets: Sequence[str] = ()) -> None:
        self._inner = inner
        self._shown_url = shown_url
        self._secrets = secrets  # of the endpoint's URL, kept out of the failure's reason
        self._lock = threading.Lock()
        self._queued = 0
        self.failing = False
        self.closing = False

    def reserve(self) -> bool:
        """Count one span about to be queued; False when the queue is full."""
        with self._lock:
            if self._queued >= MAX_QUEUED_SPANS:
                return False
            self._queued += 1
            return True

    def release(self) -> None:
        """Undo a reserve() whose span was not queued."""
        with self._lock:
            self._queued = max(0, self._queued - 1)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._queued = max(0, self._queued - len(spans))
        if self.closing and self.failing:
            return SpanExportResult.FAILURE  # do not hold the proxy's shutdown for a dead collector
        _QUIET.local.active, _QUIET.local.reason = True, None
        try:
            result = self._inner.export(spans)
        except Exception as exc:
            result, _QUIET.local.reason = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        finally:
            _QUIET.local.active = False
        if result is SpanExportResult.SUCCESS:
            if self.failing:
                self.failing = False
                log.info("hopmeter: OpenTelemetry export works again", endpoint=self._shown_url)
        elif not self.failing:
            self.failing = True
            reason = _QUIET.local.reason or "unknown"
            for secret in self._secrets:
                reason = reason.replace(secret, "[redacted]")
            log.warning(
                "hopmeter: OpenTelemetry export failed; spans are dropped until it works",
                endpoint=self._shown_url,
                reason=reason,
            )
        return result

    def shutdown(self) -> None:
        try:
            self._inner.shutdown()
        except Exception as exc:
            log.warning("hopmeter: OpenTelemetry exporter did not shut down", error=str(exc))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)
