"""Prometheus metrics (DESIGN.md §8): the only prometheus_client import site.

`Metrics` turns finished flow records (DESIGN.md §4) into histograms and counters on a registry the
caller passes in (never the global one); `serve()` exposes that registry on /metrics (OpenMetrics
when the scraper asks for it, so trace-id exemplars show) and answers /healthz.

Every label value is bounded: models go through an allow-list of family prefixes, paths through a
table of known LLM routes, hop and segment names through a cap on how many distinct ones are kept.
Trace ids travel as exemplars, never as labels.
"""

from __future__ import annotations

import errno
import math
import os
import re
import socket
import socketserver
import threading
from bisect import bisect_left
from collections import Counter as CountOf
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

# Each `_created` series is one more series per label set, for nothing (DESIGN.md §8). The
# environment variable only works if set before prometheus_client is first imported anywhere in
# the process; disable_created_metrics() below covers the case where someone imported it earlier.
os.environ.setdefault("PROMETHEUS_DISABLE_CREATED_SERIES", "True")

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hopmeter.core.figures import Gaps
from hopmeter.core.vocab import Api, Ended, FindingKind, TokenSource

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# Tables read better as rows than as one item per line.
# fmt: off
# --- buckets (seconds unless named otherwise), DESIGN.md §8 ------------------------------------
# vLLM's TTFT list truncated at 160 s; its first 16 entries are OpenTelemetry GenAI's.
FIRST_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
# vLLM's inter-token list, with 1/2.5/5 ms below it: a buffering hop collapses gaps far below 10 ms.
GAP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# Per-token hold of one segment: from the ~0.3 ms floor of two listeners to a whole-body minute.
HOLD_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM's end-to-end request latency list.
DURATION_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                      60.0, 120.0, 240.0, 480.0, 960.0)
# Tokens per event: 1 is a token-per-event stream, 2-8 a coalescing provider, hundreds a body
# reconciled from a usage total (not streamed, or held whole by a hop).
EVENT_TOKEN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512)

# An event carrying k tokens is k observations of gap/k. Observing one at a time costs ~2.5 us
# each on the proxy's event loop (5 ms for a 2,000-token flow, measured here), so weighted values
# are counted into buckets first and each bucket is incremented once (_observe_weighted).

# --- bounded label values ---------------------------------------------------------------------
OTHER = "other"
NO_MODEL = "none"
# Label values that come from records are taken only from hopmeter's own vocabulary.
APIS = frozenset(Api)
ENDINGS = frozenset(Ended)
TOKEN_SOURCES = frozenset(TokenSource)
FINDING_KINDS = frozenset(FindingKind)
# Hop, segment and error-site names come from configuration, not traffic; the cap guards against
# a misconfiguration (a name per request) turning into a series per request.
MAX_NAMES_PER_LABEL = 32
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:>-]{1,64}$")
# Trace ids are 32 hex digits (W3C); the OpenMetrics exemplar label set is capped at 128 chars.
_TRACE_ID_RE = re.compile(r"^[0-9a-fA-F]{1,64}$")

# Model families (normalised prefix -> label value). Longest prefix wins; a prefix matches when
# the character after it is not a letter ("gpt-4" matches "gpt-4-turbo" but not "gpt-4o").
DEFAULT_MODEL_FAMILIES: Mapping[str, str] = {p: p for p in (
    "gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o",
    "gpt-4o-mini", "gpt-4", "gpt-3.5", "gpt-oss", "o1", "o1-mini", "o3", "o3-mini", "o4-mini",
    "claude-opus-4", "claude-sonnet-4", "claude-haiku-4", "claude-3-7-sonnet",
    "claude-3-5-sonnet", "claude-3-5-haiku", "claude-3-opus", "claude-3-sonnet", "claude-3-haiku",
    "claude", "gemini-3", "gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.0-flash",
    "gemini-1.5-pro", "gemini-1.5-flash", "gemini", "gemma", "llama", "mistral", "mixtral",
    "magistral", "codestral", "ministral", "devstral", "qwen", "qwq", "deepseek-r1",
    "deepseek-v3", "deepseek-reasoner", "deepseek-chat", "deepseek", "phi", "command", "grok",
    "kimi", "glm", "granite", "nemotron", "minimax", "falcon", "olmo",
    "demo",  # hopmeter's own demo upstream ("demo-1")
)} | {"meta-llama": "llama"}

# Bedrock-style ids ("us.anthropic.claude-...") carry the vendor before a dot.
_VENDOR_PREFIX_RE = re.compile(r"^(?:[a-z]{2}\.)?(?:anthropic|meta|mistral|amazon|cohere|ai21)\.")

# Known LLM routes: (pattern over the path without query, label). Anything else is "other".
# Variable segments (Azure deployments, Gemini model names, thread ids) collapse into the label.
DEFAULT_ROUTES: Sequence[tuple[str, str]] = (
    (r"/(?:openai/|api/)?v1/chat/completions", "/v1/chat/completions"),
    (r"/chat/completions", "/chat/completions"),
    (r"/openai/deployments/[^/]+/chat/completions",
     "/openai/deployments/{deployment}/chat/completions"),
    (r"/(?:openai/)?v1/completions", "/v1/completions"),
    (r"/v1/messages", "/v1/messages"),
    (r"/(?:openai/)?v1/responses", "/v1/responses"),
    (r"/v1/threads/(?:[^/]+/)?runs", "/v1/threads/{thread}/runs"),
    (r"/api/chat", "/api/chat"),
    (r"/api/generate", "/api/generate"),
    (r"/generate_stream", "/generate_stream"),
    (r"/generate", "/generate"),
    (r"/v1(?:beta|alpha)?/models/[^/:]+:streamGenerateContent",
     "/v1beta/models/{model}:streamGenerateContent"),
    (r"/v1(?:beta|alpha)?/models/[^/:]+:generateContent",
     "/v1beta/models/{model}:generateContent"),
    (r"/v1/projects/[^/]+/locations/[^/]+/publishers/[^/]+/models/[^/:]+:streamGenerateContent",
     "/v1/projects/{project}/.../models/{model}:streamGenerateContent"),
)
# fmt: on

FLOW_LABELS = ("hop", "api", "model", "route")
# Labelled children kept by Metrics._child; more than the capped label sets make in practice.
MAX_CACHED_CHILDREN = 20_000


class MetricsPortError(Exception):
    """The metrics endpoint could not bind its address."""


def new_registry() -> CollectorRegistry:
    """A fresh registry for one hopmeter process (never prometheus_client's global one)."""
    return CollectorRegistry(auto_describe=True)


def _name(value: object, seen: set[str], lock: threading.Lock) -> str:
    """A configured name (hop, segment, error site) if well formed and among the first few seen."""
    text = str(value) if value is not None else ""
    if not _NAME_RE.match(text):
        return OTHER
    if text in seen:
        return text
    with lock:
        if len(seen) >= MAX_NAMES_PER_LABEL:
            return OTHER
        seen.add(text)
    return text


def normalise_model(model: str) -> str:
    """Lower-case, drop a provider or org path ("models/", "meta-llama/") and a Bedrock vendor."""
    text = model.strip().lower()
    text = text.rsplit("/", 1)[-1]
    return _VENDOR_PREFIX_RE.sub("", text)


class ModelLabels:
    """Maps a model id to a bounded label: its allow-listed family, "none", or "other"."""

    def __init__(self, families: Mapping[str, str] | Iterable[str]) -> None:
        table = dict(families) if isinstance(families, Mapping) else {f: f for f in families}
        self._table = {normalise_model(k): v for k, v in table.items() if k.strip()}
        self._prefixes = sorted(self._table, key=len, reverse=True)
        self._cache: dict[str, str] = {}

    def label(self, model: object) -> str:
        """The label value for `model` (cached: the same ids recur on every request)."""
        if not isinstance(model, str) or not model.strip():
            return NO_MODEL
        hit = self._cache.get(model)
        if hit is not None:
            return hit
        text = normalise_model(model)
        result = OTHER
        for prefix in self._prefixes:
            rest = text[len(prefix) : len(prefix) + 1]
            if text.startswith(prefix) and not rest.isalpha():
                result = self._table[prefix]
                break
        if len(self._cache) < 4096:  # bounded: random ids must not grow memory
            self._cache[model] = result
        return result


class RouteLabels:
    """Maps a request path to one of a fixed set of route templates, else "other"."""

    def __init__(self, routes: Sequence[tuple[str, str]]) -> None:
        self._routes = [(re.compile(pattern + "/?"), label) for pattern, label in routes]

    def label(self, path: object) -> str:
        """The template of the first known route `path` matches in full."""
        if not isinstance(path, str):
            return OTHER
        path = path.split("?", 1)[0]
        for pattern, label in self._routes:
            if pattern.fullmatch(path):
                return label
        return OTHER


def _status_class(status: object) -> str:
    if isinstance(status, int) and 100 <= status <= 599:
        return f"{status // 100}xx"
    return "none" if status is None else OTHER


def _exemplar(trace_id: object) -> dict[str, str] | None:
    if isinstance(trace_id, str) and _TRACE_ID_RE.match(trace_id):
        return {"trace_id": trace_id}
    return None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


class Metrics:
    """hopmeter's metrics on an explicit registry (DESIGN.md §8)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        models: Mapping[str, str] | Iterable[str] | None = None,
        routes: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        self.registry = registry
        self.models = ModelLabels(DEFAULT_MODEL_FAMILIES if models is None else models)
        self.routes = RouteLabels(DEFAULT_ROUTES if routes is None else routes)
        self._names: dict[str, set[str]] = {"hop": set(), "segment": set(), "where": set()}
        self._lock = threading.Lock()
        self._initialised: set[str] = set()
        # Labelled children by (metric, label values): prometheus_client's labels() validates and
        # locks on every call, ~4 µs each, 16 per flow. Bounded like the label sets themselves.
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

        def hist(name: str, doc: str, buckets: Sequence[float], labels: Sequence[str]) -> Histogram:
            return Histogram(f"hopmeter_{name}", doc, labels, registry=registry, buckets=buckets)

        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(f"hopmeter_{name}", doc, labels, registry=registry)

        self.ttfb = hist(
            "time_to_first_byte_seconds",
            "Request start to first response body byte.",
            FIRST_BUCKETS_S,
            FLOW_LABELS,
        )
        self.ttfe = hist(
            "time_to_first_event_seconds",
            "Request start to first complete event.",
            FIRST_BUCKETS_S,
            FLOW_LABELS,
        )
        self.ttft = hist(
            "time_to_first_token_seconds",
            "Request start to first event with visible content.",
            FIRST_BUCKETS_S,
            FLOW_LABELS,
        )
        self.itl = hist(
            "inter_token_latency_seconds",
            "Token-weighted inter-token latency: an event of k tokens after a gap g "
            "is k observations of g/k.",
            GAP_BUCKETS_S,
            FLOW_LABELS,
        )
        self.duration = hist(
            "stream_duration_seconds",
            "Request start to last response byte.",
            DURATION_BUCKETS_S,
            FLOW_LABELS,
        )
        self.max_gap = hist(
            "max_gap_seconds",
            "Largest gap between token events, per flow.",
            GAP_BUCKETS_S,
            FLOW_LABELS,
        )
        self.event_tokens = hist(
            "event_tokens",
            "Tokens carried by each token-carrying event.",
            EVENT_TOKEN_BUCKETS,
            FLOW_LABELS,
        )
        self.hold = hist(
            "hold_seconds",
            "Per-token hold of one segment between two listeners.",
            HOLD_BUCKETS_S,
            ("segment",),
        )
        self.flows = counter(
            "flows_total", "Finished flows.", (*FLOW_LABELS, "status_class", "ended")
        )
        self.tokens = counter(
            "tokens_total",
            "Tokens streamed, by how they were counted.",
            ("hop", "api", "model", "source"),
        )
        self.events = counter(
            "events_total",
            "Events dispatched (preludes, pings, [DONE] too).",
            ("hop", "api", "model"),
        )
        self.bytes = counter(
            "bytes_total",
            "Response bytes: in from upstream, out to the client; "
            "payload is visible text, framing the rest.",
            ("hop", "api", "direction", "part"),
        )
        self.findings = counter(
            "findings_total", "Findings of the detectors, by kind.", ("hop", "api", "kind")
        )
        self.stalls = counter(
            "stalls_total", "Gaps at or above the stall threshold.", ("hop", "api", "model")
        )
        self.internal_errors = counter(
            "internal_errors_total",
            "Errors inside hopmeter's measuring (traffic unaffected).",
            ("where",),
        )
        self.streams_active = Gauge(
            "hopmeter_streams_active", "Responses being streamed now.", registry=registry
        )

    # --- observing ------------------------------------------------------------------------------
    def observe_flow(
        self,
        record: Mapping[str, Any],
        *,
        gaps: Gaps | None = None,
        event_tokens: Sequence[int] | None = None,
    ) -> None:
        """Observe one finished flow record (DESIGN.md §4).

        `gaps` and `event_tokens` (the token-weighted gaps and the tokens of each event, as
        finish_flow computed them) spare reading them again from the record's events.
        """
        request = record.get("request") or {}
        response = record.get("response") or {}
        figures = record.get("figures") or {}
        api: str = record["api"] if record.get("api") in APIS else OTHER
        hop = _name(record.get("hop"), self._names["hop"], self._lock)
        model = self.models.label(record.get("model"))
        labels = (hop, api, model, self.routes.label(request.get("path")))  # FLOW_LABELS
        child = self._child
        exemplar = _exemplar(record.get("trace_id"))
        for hist, key in (
            (self.ttfb, "ttfb_s"),
            (self.ttfe, "ttfe_s"),
            (self.ttft, "ttft_s"),
            (self.duration, "duration_s"),
            (self.max_gap, "max_gap_s"),
        ):
            value = _num(figures.get(key))
            if value is not None:
                child(hist, labels).observe(value, exemplar)
        if gaps is not None and event_tokens is not None:
            weighted = list(zip(gaps.values_s, gaps.weights, strict=True))
            self._observe_tokens(event_tokens, weighted, labels, exemplar)
        else:
            self._observe_events(record.get("events") or (), labels, exemplar)

        ended = response.get("ended", record.get("ended"))
        status_class = _status_class(response.get("status"))
        ended = ended if ended in ENDINGS else OTHER
        child(self.flows, (*labels, status_class, ended)).inc(1, exemplar)
        short = (hop, api, model)
        tokens = _num(figures.get("tokens"))
        if tokens:
            source = figures.get("tokens_source")
            source = source if source in TOKEN_SOURCES else OTHER
            child(self.tokens, (*short, source)).inc(tokens)
        events = _num(figures.get("events"))
        events = float(len(record.get("events") or ())) if events is None else events
        if events:
            child(self.events, short).inc(events)
        stalls = _num(figures.get("stalls"))
        stalls_child = child(self.stalls, short)  # created at 0: see _initialise
        if stalls:
            stalls_child.inc(stalls, exemplar)
        self._initialise(hop, api)
        self._observe_bytes(hop, api, response, figures)
        for finding in record.get("findings") or ():
            kind = finding.get("kind") if isinstance(finding, Mapping) else None
            kind = kind if kind in FINDING_KINDS else OTHER
            child(self.findings, (hop, api, kind)).inc(1, exemplar)

    def _child(self, metric: Any, values: tuple[str, ...]) -> Any:
        """`metric.labels(*values)`, remembered; values in the order of the metric's labels."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= MAX_CACHED_CHILDREN:
                self._children.clear()
            found = self._children[key] = metric.labels(*values)
        return found

    def _initialise(self, hop: str, api: str) -> None:
        """Create every finding kind's series at 0 the first time a hop/api pair is seen.

        A counter born at 1 hides its first increase from rate() and increase(), so an alert on
        the first whole-body hold would never fire; and "no data" on a dashboard should mean no
        traffic, not no findings (prometheus.io/docs/practices/instrumentation, "Avoid missing
        metrics"). Bounded: kinds x hops x apis, all capped.
        """
        key = f"{hop}\0{api}"
        if key in self._initialised:
            return
        self._initialised.add(key)
        for kind in (*FINDING_KINDS, OTHER):
            self.findings.labels(hop=hop, api=api, kind=kind)

    def _observe_events(
        self,
        events: Iterable[Sequence[Any]],
        labels: tuple[str, ...],
        exemplar: dict[str, str] | None,
    ) -> None:
        # (time, tokens) of each event that carries tokens; the others are transparent
        # (DESIGN.md §6). Records hopmeter writes take the comprehension; anything odd in a
        # record read from elsewhere, the careful loop.
        try:
            pts = [(float(t), k) for t, k, *_ in events if type(k) is int and k > 0 and t >= 0]
        except (TypeError, ValueError):
            pts = _token_events(events)
        gaps = [(max(0.0, b[0] - a[0]) / b[1], b[1]) for a, b in pairwise(pts)]
        self._observe_tokens([k for _, k in pts], gaps, labels, exemplar)

    def _observe_tokens(
        self,
        event_tokens: Iterable[int],
        gaps: Sequence[tuple[float, int]],
        labels: tuple[str, ...],
        exemplar: dict[str, str] | None,
    ) -> None:
        """Events by the tokens they carry (most carry one), and the token-weighted gaps."""
        per_k = CountOf(k for k in event_tokens if k > 0)
        _observe_weighted(
            self._child(self.event_tokens, labels),
            [(float(k), n) for k, n in per_k.items()],
            None,
        )
        _observe_weighted(self._child(self.itl, labels), gaps, exemplar)

    def _observe_bytes(
        self, hop: str, api: str, response: Mapping[str, Any], figures: Mapping[str, Any]
    ) -> None:
        payload = _num(figures.get("payload_bytes")) or 0.0
        for direction, key in (("in", "bytes_wire"), ("out", "bytes_out")):
            wire = _num(response.get(key))
            if not wire:
                continue
            # framing = everything on the wire that is not visible text (envelopes, event
            # fields, compression effects); payload is capped at the wire count.
            part_payload = min(payload, wire)
            if part_payload:
                self._child(self.bytes, (hop, api, direction, "payload")).inc(part_payload)
            if wire > part_payload:
                self._child(self.bytes, (hop, api, direction, "framing")).inc(wire - part_payload)

    def observe_holds(self, segment: str, holds_s: Iterable[float], trace_id: str | None) -> None:
        """Observe the per-token holds of one segment ("edge>origin") for one stream."""
        child = self.hold.labels(segment=_name(segment, self._names["segment"], self._lock))
        exemplar = _exemplar(trace_id)
        values = [(v, 1) for v in (_num(h) for h in holds_s) if v is not None]
        _observe_weighted(child, values, exemplar)

    def internal_error(self, where: str) -> None:
        """Count one error inside hopmeter's measuring code, by site."""
        self.internal_errors.labels(where=_name(where, self._names["where"], self._lock)).inc()

    def stream_started(self) -> None:
        """A response began streaming through a listener."""
        self.streams_active.inc()

    def stream_finished(self) -> None:
        """A response that began streaming has ended, however it ended."""
        self.streams_active.dec()


def _token_events(events: Iterable[Sequence[Any]]) -> list[tuple[float, int]]:
    """(time, tokens) of each well-formed event with tokens, from a record of any origin."""
    out = []
    for event in events:
        if len(event) < 2:
            continue
        t, k = _num(event[0]), event[1]
        if t is not None and type(k) is int and k > 0:
            out.append((t, k))
    return out


def _observe_weighted(
    child: Histogram, values: Sequence[tuple[float, int]], exemplar: dict[str, str] | None
) -> None:
    """Observe each value `weight` times, the largest value once with the exemplar.

    prometheus_client has no "observe n times"; counting into buckets here and incrementing each
    bucket once gives exactly what n observe() calls give, at a cost per bucket instead of per
    token. It reads the child's bucket bounds and values, which prometheus_client has kept since
    0.4; without them it falls back to observe() in a loop. A test compares the two.
    """
    if not values:
        return
    plain = [value for value, _ in values]
    widest_value = max(plain)
    widest = plain.index(widest_value)
    child.observe(widest_value, exemplar)  # the trace worth opening: its widest gap
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for i, (value, weight) in enumerate(values):
            for _ in range(weight - (i == widest)):
                child.observe(value)
        return
    counts = [0] * len(bounds)
    # the first bucket whose bound is >= each value, found in C (bisect over map)
    slots = list(map(partial(bisect_left, bounds), plain))
    weights = [weight for _, weight in values]
    if len(weights) == sum(weights) and min(weights) == 1:  # one observation each, the usual
        for slot, n in CountOf(slots).items():
            counts[slot] += n
        summed = math.fsum(plain) - widest_value
    else:
        summed = 0.0
        for slot, value, weight in zip(slots, plain, weights, strict=True):
            counts[slot] += weight
            summed += value * weight
        summed -= widest_value
    counts[slots[widest]] -= 1  # observed above, with the exemplar
    for bucket, n in zip(buckets, counts, strict=True):
        if n:
            bucket.inc(n)
    total.inc(summed)


# --- the endpoint -----------------------------------------------------------------------------
class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not news; stay silent."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight must not keep the process alive
    block_on_close = False

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, a DNS query per start; nothing here
        # needs a server name, so bind and set the WSGI environment without it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that hangs up mid-response is not an error worth a traceback."""


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _app(registry: CollectorRegistry) -> WSGIApp:
    metrics_app: WSGIApp = prometheus_client.make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics or /healthz\n"]

    return app


@dataclass(slots=True)
class MetricsServer:
    """A running metrics endpoint; `close()` stops it and frees the port."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """Where /metrics is served."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    target: Metrics | CollectorRegistry, host: str = "127.0.0.1", port: int = 9464
) -> MetricsServer:
    """Serve /metrics and /healthz on host:port (0 picks a free port) in a daemon thread."""
    registry = target.registry if isinstance(target, Metrics) else target
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise MetricsPortError(
            f"metrics address {host}:{port} does not resolve ({exc.strerror}); choose another "
            "with --metrics HOST:PORT or turn the endpoint off with --metrics off"
        ) from exc
    family, _, _, _, sockaddr = infos[0]
    address = str(sockaddr[0])

    class Server(_Server):
        address_family = family

    try:
        server = Server((address, port), _QuietHandler)
    except OSError as exc:
        what = "is already in use" if exc.errno == errno.EADDRINUSE else f"failed: {exc.strerror}"
        raise MetricsPortError(
            f"metrics port {port} on {host} {what}; choose another with --metrics HOST:PORT "
            "or turn the endpoint off with --metrics off"
        ) from exc
    server.set_app(_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="hopmeter-metrics", daemon=True)
    thread.start()
    return MetricsServer(host=host, port=server.server_address[1], _server=server, _thread=thread)


def exported_names(registry: CollectorRegistry) -> Iterator[str]:
    """Every sample name the registry's metric families can expose (for dashboards and tests)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}
    for family in registry.collect():
        for suffix in suffixes.get(family.type, ("",)):
            yield family.name + suffix
