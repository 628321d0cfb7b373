"""Prometheus instruments: finished flow records in, histograms and counters out (design §8).

`Metrics` observes each record (docs/design.md §4) on a registry the caller passes in, never the
global one; hopmeter.export.server serves that registry. Label values come bounded from
hopmeter.export.labels; trace ids travel as exemplars, never as labels. The token-weighted
histograms are `WeightedHistogram`s: k observations per call, read by the registry as a custom
collector. Importing this module changes nothing in prometheus_client or the environment: the
`_created` series are left out of the exposition by the server, not switched off process-wide.
"""

from __future__ import annotations

import math
import operator
import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections import Counter as CountOf
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import pairwise, repeat
from operator import itemgetter
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar

from hopmeter.core.figures import Gaps
from hopmeter.core.hops import Segment
from hopmeter.core.measure import Measurement
from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import TraceReceived
from hopmeter.export.labels import (
    APIS,
    BEACON_OUTCOMES,
    BODY_CLIP_REASONS,
    DEFAULT_MODEL_FAMILIES,
    DEFAULT_ROUTES,
    ENDINGS,
    FINDING_KINDS,
    FOLD_REASONS,
    MAX_NAMES_PER_LABEL,
    OTHER,
    PAIRED_BY,
    PAIRING_MATCHES,
    TOKEN_SOURCES,
    ModelLabels,
    NameLabels,
    RouteLabels,
    status_class,
    vocabulary_label,
)
from hopmeter.export.outlets import OutputState

# Tables read better as rows than as one item per line.
# fmt: off
# --- buckets (seconds unless named otherwise), docs/design.md §8 -------------------------------
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
# Paint lag, a page's read -> the frame that painted it: a frame is 16.7 ms, a client that writes
# once per frame lands within one or two (8-17 ms, measured), a smoothing buffer 30-110 ms, a
# re-render of a long reply or a reveal after the end seconds.
PAINT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.0167, 0.025, 0.0333, 0.05, 0.075, 0.1, 0.15,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Tokens per event: 1 is a token-per-event stream, 2-8 a coalescing provider, hundreds a body
# reconciled from a usage total (not streamed, or held whole by a hop).
EVENT_TOKEN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512)

# fmt: on

FLOW_LABELS = ("hop", "api", "model", "route")
# Each label is bounded alone (hops, model families, route templates), but a client chooses the
# model and the route of its requests: every family on every route would be ~2,000 sets of ~170
# series each. Past this many sets, a new set's model and route are said as "other" (counted in
# hopmeter_label_sets_collapsed_total): a real deployment has a few dozen.
MAX_FLOW_LABEL_SETS = 128
# What a negative duration was (`hopmeter_negative_durations_total{what}`): never observed into
# its histogram, counted here; the record says why (core.hops' suspect findings, the screen's
# and the delivery's counts).
NEGATIVE_WHATS = ("hold", "request_delay", "added_ttft", "paint_lag", "own_hold")
# Labelled children kept by Metrics._child; more than the capped label sets make in practice.
MAX_CACHED_CHILDREN = 20_000
# Trace ids are 32 hex digits (W3C); the OpenMetrics exemplar label set is capped at 128 chars.
_TRACE_ID_RE = re.compile(r"^[0-9a-fA-F]{1,64}$")


# what `hopmeter_measure_dropped_total` counts, in the order _observe_dropped reads them
MEASURE_DROPPED = (
    "events",
    "chunks",
    "oversized_events",
    "errors",
    "undecoded_bodies",
    "model_names",
)


class ProcessCounters:
    """Counters a part of the process keeps as plain numbers (nothing done per increment but
    the increment), read when scraped: `read()` gives (name without `hopmeter_`, help, value),
    the value a number, or a counter by one label as (label name, {label value: number})."""

    def __init__(
        self,
        read: Callable[[], Iterable[tuple[str, str, float | tuple[str, Mapping[str, float]]]]],
    ) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        for name, doc, value in self.read():
            if not isinstance(value, tuple):
                yield CounterMetricFamily(f"hopmeter_{name}", doc, value=value)
                continue
            label, counts = value
            family = CounterMetricFamily(f"hopmeter_{name}", doc, labels=[label])
            for key, count in counts.items():
                family.add_metric([key], count)
            yield family


class OutputFamilies:
    """`hopmeter_output_*`: what each output (records, console, log) wrote, lost and holds now,
    read from the outputs it watches at each scrape (hopmeter.export.outlets.Outlets.states)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._reads: list[Callable[[], Iterable[OutputState]]] = []
        registry.register(self)

    def watch(self, read: Callable[[], Iterable[OutputState]]) -> None:
        """Also expose the outputs `read` returns."""
        self._reads.append(read)

    def collect(self) -> Iterator[Metric]:
        lost = CounterMetricFamily(
            "hopmeter_output_lost_lines",
            "Lines an output (records, console, log) could not write, by reason: queue_full "
            "(its queue was full: the reader or disk is slower than the traffic), the error of a "
            "failed write (enospc, epipe, eio, ...), shutdown (still queued at exit).",
            labels=("output", "reason"),
        )
        written = CounterMetricFamily(
            "hopmeter_output_written_lines",
            "Lines an output (records, console, log) wrote.",
            labels=("output",),
        )
        queued = GaugeMetricFamily(
            "hopmeter_output_queued_bytes",
            "Bytes of lines an output holds now, waiting to be written (bounded per output by "
            "hopmeter_output_queue).",
            labels=("output",),
        )
        for read in self._reads:
            for state in read():
                for reason, n in state.lost.items():
                    lost.add_metric((state.output, reason), n)
                written.add_metric((state.output,), state.written)
                queued.add_metric((state.output,), state.queued_bytes)
        yield lost
        yield written
        yield queued


def new_registry() -> CollectorRegistry:
    """A fresh registry for one hopmeter process (never prometheus_client's global one), with
    the process's own standard series (`process_open_fds`, `process_resident_memory_bytes`,
    `process_cpu_seconds_total`, ...: read from /proc at each scrape, where there is one): a
    sidecar that runs for weeks is watched for descriptors and memory as any exporter is."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry


def _exemplar(trace_id: object) -> dict[str, str] | None:
    if isinstance(trace_id, str) and _TRACE_ID_RE.match(trace_id):
        return {"trace_id": trace_id}
    return None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _name_labels(folded: Counter) -> tuple[NameLabels, NameLabels, NameLabels]:
    """The hop, segment and site names' labels, each name said as other counted in `folded` by
    label and why (every pair there from 0)."""

    def names(label: str) -> NameLabels:
        children = {why: folded.labels(label, why) for why in FOLD_REASONS}
        return NameLabels(folded=lambda why: children[why].inc())

    return names("hop"), names("segment"), names("site")


class Metrics:
    """hopmeter's metrics on an explicit registry (docs/design.md §8)."""

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
        self._initialised: set[str] = set()
        self._label_sets: set[tuple[str, ...]] = set()  # FLOW_LABELS values seen, bounded
        # Labelled children by (metric, label values): prometheus_client's labels() validates and
        # locks on every call, ~4 µs each, a dozen or more per flow. Bounded like the label sets.
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

        def hist(name: str, doc: str, buckets: Sequence[float], labels: Sequence[str]) -> Histogram:
            return Histogram(f"hopmeter_{name}", doc, labels, registry=registry, buckets=buckets)

        def weighted(
            name: str, doc: str, buckets: Sequence[float], labels: Sequence[str]
        ) -> WeightedHistogram:
            return WeightedHistogram(f"hopmeter_{name}", doc, labels, buckets, registry)

        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(f"hopmeter_{name}", doc, labels, registry=registry)

        # hop, segment and error-site names (the site: where an internal error was caught)
        self.hops, self.segments, self.sites = _name_labels(
            counter(
                "label_values_folded_total",
                f"Observations whose name was said as other: `limit` when {MAX_NAMES_PER_LABEL} "
                "other names were in use already, `malformed` when not a name; by label: hop (a "
                "flow), segment (a pair of hops' segment), site (an internal error).",
                ("label", "why"),
            )
        )

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
        self.itl = weighted(
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
        # one observation per flow each, in the order of TIMINGS
        self._timings = (self.ttfb, self.ttfe, self.ttft, self.duration, self.max_gap)
        self.event_tokens = weighted(
            "event_tokens",
            "Tokens carried by each token-carrying event.",
            EVENT_TOKEN_BUCKETS,
            FLOW_LABELS,
        )
        self.hold = weighted(
            "hold_seconds",
            "Per-token hold of one segment between two listeners.",
            HOLD_BUCKETS_S,
            ("segment",),
        )
        self.own_hold = weighted(
            "own_hold_seconds",
            "Per-token hold of this hop's own process: from reading a chunk to handing it to "
            "the client's socket.",
            HOLD_BUCKETS_S,
            FLOW_LABELS,
        )
        self.client_wait = hist(
            "client_wait_seconds",
            "Per flow: how long its bytes waited on the client to take them.",
            HOLD_BUCKETS_S,
            FLOW_LABELS,
        )
        self.request_delay = hist(
            "segment_request_delay_seconds",
            "From the outer listener seeing a request to the inner one seeing it, per segment.",
            HOLD_BUCKETS_S,
            ("segment",),
        )
        self.added_ttft = hist(
            "segment_added_ttft_seconds",
            "What a segment added to the time to first token: request delay + first-token hold.",
            HOLD_BUCKETS_S,
            ("segment",),
        )
        self.pairings = counter(
            "pairings_total",
            "Flows of a process with listeners of several hops, by how they were paired "
            '(paired_by "none" with match "ambiguous": several replies alike, left unpaired).',
            ("hop", "paired_by", "match"),
        )
        self.first_painted = hist(
            "time_to_first_painted_token_seconds",
            "The page's fetch() to the first frame that painted reply text (browser measuring).",
            FIRST_BUCKETS_S,
            FLOW_LABELS,
        )
        self.paint_lag = weighted(
            "paint_lag_seconds",
            "Per token: the page's body reader got it -> the frame that painted it (browser "
            "measuring).",
            PAINT_BUCKETS_S,
            FLOW_LABELS,
        )
        self.beacons = counter(
            "beacons_total", "Browser beacons, by what became of them.", ("outcome",)
        )
        self._beacons_initialised = False
        self.flows = counter(
            "flows_total", "Finished flows.", (*FLOW_LABELS, "status_class", "ended")
        )
        self.collapsed = counter(
            "label_sets_collapsed_total",
            f"Flows whose model and route were said as other: {MAX_FLOW_LABEL_SETS} label "
            "sets of hop, api, model and route were in use already.",
            ("hop", "api"),
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
        self.segment_findings = counter(
            "segment_findings_total",
            "Findings attributed to a segment between two hops, by kind.",
            ("segment", "kind"),
        )
        self.negative = counter(
            "negative_durations_total",
            "Measured durations that came out below zero, by what they were (hold, "
            "request_delay, added_ttft, paint_lag, own_hold): never observed into their "
            "histograms; the record says why (a clock_skew_suspect or alignment_suspect finding, "
            "screen.paint_lags_negative, delivery.negative_holds).",
            ("what",),
        )
        for what in NEGATIVE_WHATS:
            self.negative.labels(what=what)
        self.malformed_events = counter(
            "malformed_events_total",
            "Event payloads hopmeter could not read as their API's format (counted, never fatal).",
            ("hop", "api"),
        )
        self.bodies_clipped = counter(
            "bodies_clipped_total",
            "Streamed bodies whose copy for mitmproxy (-w, export, mitmweb) was cut at a bound: "
            "flow_cap (hopmeter_keep_body) or total_cap (hopmeter_keep_body_total).",
            ("hop", "reason"),
        )
        self.measure_dropped = counter(
            "measure_dropped_total",
            "What of a stream its record does not list, each counted in it: `events` past the "
            "timeline's cap (their tokens still counted), `chunks` past the chunk list's cap, "
            "`oversized_events` too large to read (their bytes still forwarded), `errors` "
            "events past the five a record keeps (all counted in its stream.errors_seen), "
            "`undecoded_bodies` timed but not read (stream.decode_error says why: a corrupt "
            "or unknown encoding, past the decoded cap), `model_names` clipped to 256 characters "
            "(the record's model_clipped_chars says by how much).",
            ("hop", "what"),
        )
        self.traceparent_malformed = counter(
            "traceparent_malformed_total",
            "Requests whose traceparent was not W3C trace context: the client's trace was "
            "lost, and the flow's trace is one hopmeter started (the record's "
            "traceparent_received says malformed).",
            ("hop",),
        )
        self.measure_unread = counter(
            "measure_unread_bytes_total",
            "Bytes of streams forwarded unread: a chunk to decode gave more events than its "
            "read budget (a compression bomb), and the rest of its flow went unread.",
            ("hop",),
        )
        self.outputs = OutputFamilies(registry)

    # --- observing ------------------------------------------------------------------------------
    def observe_result(
        self, result: FlowResult, *, paint_lags: Sequence[float] | None = None
    ) -> None:
        """Observe one finished flow as the proxy measured it: its figures, tokens, bytes and
        delivery from the typed measurement (hopmeter.core.measure), never parsed back from its
        record; what the waits after measuring added (pairing, a joined beacon, the findings
        they add) from the record. A result without a measurement is read from its record.
        `paint_lags` as in `observe_flow`."""
        m = result.measurement
        if m is None:
            self.observe_flow(
                result.record,
                gaps=result.figures.gaps if result.figures is not None else None,
                event_tokens=result.tokens.per_event if result.tokens is not None else None,
                own_holds=result.delivery.holds if result.delivery is not None else None,
                paint_lags=paint_lags,
            )
            return
        self._observe(
            result.record,
            _measured_facts(m),
            gaps=m.figures.gaps if m.figures is not None else None,
            event_tokens=m.tokens.per_event if m.tokens is not None else None,
            own_holds=m.delivery.holds if m.delivery is not None else None,
            paint_lags=paint_lags,
        )

    def observe_flow(
        self,
        record: Mapping[str, Any],
        *,
        gaps: Gaps | None = None,
        event_tokens: Sequence[int] | None = None,
        own_holds: Sequence[tuple[float, int]] | None = None,
        paint_lags: Sequence[float] | None = None,
    ) -> None:
        """Observe one finished flow record (docs/design.md §4): one read back, or written
        elsewhere.

        `gaps` and `event_tokens` (the token-weighted gaps and the tokens of each event, as
        measuring computed them) spare reading them again from the record's events;
        `own_holds` are the hop's own holds, (seconds, tokens) per chunk, when the proxy followed
        the flow's bytes to the client (FlowResult.delivery.holds); `paint_lags` the per-token
        lags from the page's read to the screen, when a beacon was joined (the `screen>browser`
        segment's holds).
        """
        self._observe(
            record,
            _record_facts(record),
            gaps=gaps,
            event_tokens=event_tokens,
            own_holds=own_holds,
            paint_lags=paint_lags,
        )

    def _observe(
        self,
        record: Mapping[str, Any],
        facts: _Facts,
        *,
        gaps: Gaps | None,
        event_tokens: Sequence[int] | None,
        own_holds: Sequence[tuple[float, int]] | None,
        paint_lags: Sequence[float] | None,
    ) -> None:
        """One flow: `facts` as measured (or read from its record), the rest from its record."""
        api = vocabulary_label(facts.api, APIS)
        hop = self.hops.label(facts.hop)
        model = self.models.label(facts.model)
        labels = (hop, api, model, self.routes.label(facts.path))  # FLOW_LABELS
        if labels not in self._label_sets:
            if len(self._label_sets) >= MAX_FLOW_LABEL_SETS:
                self._child(self.collapsed, (hop, api)).inc()
                model = OTHER
                labels = (hop, api, OTHER, OTHER)
            self._label_sets.add(labels)  # (the collapsed sets: one per hop and api at most)
        child = self._child
        exemplar = _exemplar(facts.trace_id)
        for hist, timing in zip(self._timings, facts.timings, strict=True):
            value = _num(timing)
            if value is not None:
                child(hist, labels).observe(value, exemplar)
        if gaps is not None and event_tokens is not None:
            self._observe_tokens(
                event_tokens, gaps.values_s, gaps.weights, labels, exemplar, ordered=gaps.ordered_s
            )
        else:
            self._observe_events(record.get("events") or (), labels, exemplar)

        ended = vocabulary_label(facts.ended, ENDINGS)
        # no response: the status the proxy answered in its place (502, 504), if it did
        child(self.flows, (*labels, status_class(facts.status), ended)).inc(1, exemplar)
        short = (hop, api, model)
        tokens = _num(facts.tokens)
        if tokens:
            source = vocabulary_label(facts.tokens_source, TOKEN_SOURCES)
            child(self.tokens, (*short, source)).inc(tokens)
        if facts.events:
            child(self.events, short).inc(facts.events)
        stalls = _num(facts.stalls)
        stalls_child = child(self.stalls, short)  # created at 0: see _initialise
        if stalls:
            stalls_child.inc(stalls, exemplar)
        malformed = _num(facts.malformed)
        malformed_child = child(self.malformed_events, (hop, api))  # created at 0, as stalls
        if malformed:
            malformed_child.inc(malformed, exemplar)
        self._initialise(hop, api)
        self._observe_bytes(hop, api, facts)
        if facts.delivered:
            self._observe_delivery(facts, own_holds, labels, exemplar)
        browser = record.get("browser")
        client = browser.get("findings") if isinstance(browser, Mapping) else None
        for finding in (*(record.get("findings") or ()), *(client or ())):
            kind = finding.get("kind") if isinstance(finding, Mapping) else None
            kind = vocabulary_label(kind, FINDING_KINDS)
            child(self.findings, (hop, api, kind)).inc(1, exemplar)
        self._observe_pairing(hop, record.get("pairing"), exemplar)
        self._observe_passage(hop, record.get("mitmproxy"), exemplar)
        self._observe_dropped(hop, record)
        self._observe_screen(record.get("screen"), paint_lags, labels, exemplar)

    def _observe_dropped(self, hop: str, record: Mapping[str, Any]) -> None:
        """Count what of the stream the record says it does not list (its `*_dropped` counts,
        its stream's `overflows`), and a client's trace context lost (a malformed traceparent)."""
        if record.get("traceparent_received") == TraceReceived.MALFORMED:
            self._child(self.traceparent_malformed, (hop,)).inc()
        stream = record.get("stream")
        stream = stream if isinstance(stream, Mapping) else {}
        errors, seen = stream.get("errors"), _num(stream.get("errors_seen"))
        errors_dropped = seen - len(errors) if seen and isinstance(errors, list) else None
        for what, n in zip(
            MEASURE_DROPPED,
            (
                record.get("events_dropped"),
                record.get("chunks_dropped"),
                stream.get("overflows"),
                errors_dropped,
                1 if stream.get("decode_error") else None,
                1 if _num(record.get("model_clipped_chars")) else None,  # clipped, not dropped
            ),
            strict=True,
        ):
            count = _num(n)
            if count:
                self._child(self.measure_dropped, (hop, what)).inc(count)
        unread = _num(stream.get("unread_bytes"))
        if unread:
            self._child(self.measure_unread, (hop,)).inc(unread)

    def _observe_screen(
        self,
        section: object,
        paint_lags: Sequence[float] | None,
        labels: tuple[str, ...],
        exemplar: dict[str, str] | None,
    ) -> None:
        """Time to first painted token per flow, paint lag per token (browser measuring)."""
        if not isinstance(section, Mapping):
            return
        first = _num(section.get("ttft_s"))
        if first is not None:
            self._child(self.first_painted, labels).observe(first, exemplar)
        if paint_lags:
            values = [(v, 1) for v in (_num(x) for x in paint_lags) if v is not None]
            self.paint_lag.observe(labels, values, exemplar)
            below = sum(1 for x in paint_lags if _below_zero(x))
            if below:  # the record's screen.paint_lags_negative says the same count
                self._child(self.negative, ("paint_lag",)).inc(below)

    def beacon(self, outcome: str) -> None:
        """Count what became of one browser beacon (every outcome's series starts at 0)."""
        if not self._beacons_initialised:
            self._beacons_initialised = True
            for name in BEACON_OUTCOMES:
                self.beacons.labels(outcome=name)
        self._child(self.beacons, (vocabulary_label(outcome, BEACON_OUTCOMES),)).inc()

    def _observe_delivery(
        self,
        facts: _Facts,
        own_holds: Sequence[tuple[float, int]] | None,
        labels: tuple[str, ...],
        exemplar: dict[str, str] | None,
    ) -> None:
        """Client wait per flow and the hop's own hold per token, for flows that were followed."""
        wait = _num(facts.client_wait_s)
        if wait is not None:
            self._child(self.client_wait, labels).observe(wait, exemplar)
        if own_holds:
            # floats from core.delivery.summarize, one per chunk, none negative (those are
            # counted in the section's negative_holds): taken apart and compared in C; only when
            # one fails (NaN, below zero, no weight) are they filtered one by one (`_num` per
            # chunk was a call each); NaN is dropped as `_num` drops it
            values = list(map(itemgetter(0), own_holds))
            weights = list(map(itemgetter(1), own_holds))
            if not all(map(operator.ge, values, repeat(0.0))) or min(weights) <= 0:
                kept = [(v, k) for v, k in own_holds if k > 0 and v >= 0]
                values, weights = [v for v, _ in kept], [k for _, k in kept]
            self.own_hold.observe_columns(labels, values, weights, exemplar)
        below = _num(facts.negative_holds)
        if below:
            self._child(self.negative, ("own_hold",)).inc(below)

    def _observe_pairing(self, hop: str, pairing: object, exemplar: dict[str, str] | None) -> None:
        """Count how a flow was paired across listeners (a record without `pairing`: not)."""
        if not isinstance(pairing, Mapping):
            return
        by = pairing.get("paired_by")
        by = "none" if by is None else vocabulary_label(by, PAIRED_BY)
        match = vocabulary_label(pairing.get("match"), PAIRING_MATCHES)
        self._child(self.pairings, (hop, by, match)).inc(1, exemplar)

    def _observe_passage(self, hop: str, section: object, exemplar: dict[str, str] | None) -> None:
        """Count a body copy cut at a bound (the record's `mitmproxy` section)."""
        clipped = section.get("body_clipped") if isinstance(section, Mapping) else None
        if clipped is not None:
            reason = vocabulary_label(clipped, BODY_CLIP_REASONS)
            self._child(self.bodies_clipped, (hop, reason)).inc(1, exemplar)

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
        for reason in BODY_CLIP_REASONS:  # per hop; again for each api is a dictionary lookup
            self.bodies_clipped.labels(hop=hop, reason=reason)
        for what in MEASURE_DROPPED:
            self.measure_dropped.labels(hop=hop, what=what)
        self.measure_unread.labels(hop=hop)
        self.traceparent_malformed.labels(hop=hop)
        self.collapsed.labels(hop=hop, api=api)

    def _observe_events(
        self,
        events: Iterable[Sequence[Any]],
        labels: tuple[str, ...],
        exemplar: dict[str, str] | None,
    ) -> None:
        # (time, tokens) of each event that carries tokens; the others are transparent
        # (docs/design.md §6). Records hopmeter writes take the comprehension; anything odd in a
        # record read from elsewhere, the careful loop.
        try:
            pts = [(float(t), k) for t, k, *_ in events if type(k) is int and k > 0 and t >= 0]
        except (TypeError, ValueError):
            pts = _token_events(events)
        gaps = [(max(0.0, b[0] - a[0]) / b[1], b[1]) for a, b in pairwise(pts)]
        values = [g for g, _ in gaps]
        weights = [k for _, k in gaps]
        self._observe_tokens([k for _, k in pts], values, weights, labels, exemplar)

    def _observe_tokens(
        self,
        event_tokens: Sequence[int],
        gaps: Sequence[float],
        weights: Sequence[int],
        labels: tuple[str, ...],
        exemplar: dict[str, str] | None,
        *,
        ordered: Sequence[float] | None = None,
    ) -> None:
        """Events by the tokens they carry (most carry one), and the token-weighted gaps
        (`gaps[i]` observed `weights[i]` times; `ordered`: the gaps sorted, if they are)."""
        ones = event_tokens.count(1)
        if ones + event_tokens.count(0) == len(event_tokens):
            # every event carries one token or none (the usual stream): two counts in C, no
            # Counter; the one value with tokens is 1
            per_token = [(1.0, ones)] if ones else []
        else:
            # every event counted in C, then the ones without tokens left out (the same counts,
            # in the same order of first appearance, as counting only those with tokens)
            per_k = CountOf(event_tokens)
            per_token = [(float(k), n) for k, n in per_k.items() if k > 0]
        self.event_tokens.observe(labels, per_token, None)
        self.itl.observe_columns(labels, gaps, weights, exemplar, ordered=ordered)

    def _observe_bytes(self, hop: str, api: str, facts: _Facts) -> None:
        payload = _num(facts.payload_bytes) or 0.0
        for direction, count in (("in", facts.bytes_wire), ("out", facts.bytes_out)):
            wire = _num(count)
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
        # align's holds are floats; anything else (NaN, not a number) is left out, and negative
        # ones are counted by observe_segment from the segment itself (Segment.negatives)
        self._observe_holds(self.segments.label(segment), holds_s, trace_id)

    def _observe_holds(self, label: str, holds_s: Iterable[float], trace_id: str | None) -> None:
        """`observe_holds` for a segment already labelled (a name said as other once)."""
        values = [(float(h), 1) for h in holds_s if type(h) in (float, int) and h >= 0]
        self.hold.observe((label,), values, _exemplar(trace_id))

    def observe_segment(self, segment: Segment, trace_id: str | None) -> None:
        """One segment of one stream: its per-token holds, what it added on the way in (request
        delay, time to first token) and the findings it introduced. An unordered pair has no
        holds to observe, only its finding; a negative duration is counted, not observed (its
        finding in the record says how many)."""
        label = self.segments.label(segment.segment)
        if segment.ordered:
            self._observe_holds(label, segment.holds_s, trace_id)
        for hist, value in (
            (self.request_delay, segment.request_delay_s),
            (self.added_ttft, segment.added_ttft_s),
        ):
            v = _num(value)
            if v is not None:
                self._child(hist, (label,)).observe(v, _exemplar(trace_id))
        for what, n in segment.negatives().items():
            self._child(self.negative, (what,)).inc(n)
        if f"segment\0{label}" not in self._initialised:  # every kind from 0, as _initialise
            self._initialised.add(f"segment\0{label}")
            for kind in (*FINDING_KINDS, OTHER):
                self._child(self.segment_findings, (label, kind))
        for finding in segment.findings:
            kind = vocabulary_label(finding.get("kind"), FINDING_KINDS)
            self._child(self.segment_findings, (label, kind)).inc(1, _exemplar(trace_id))

    def watch_outputs(self, read: Callable[[], Iterable[OutputState]]) -> None:
        """Expose what the outputs `read` returns (`hopmeter_output_*`)."""
        self.outputs.watch(read)

    def internal_error(self, where: str) -> None:
        """Count one error inside hopmeter's measuring code, by site."""
        self.internal_errors.labels(where=self.sites.label(where)).inc()

    def stream_started(self) -> None:
        """A response began streaming through a listener."""
        self.streams_active.inc()

    def stream_finished(self) -> None:
        """A response that began streaming has ended, however it ended."""
        self.streams_active.dec()


# The per-flow timings, in the order of Metrics._timings: the record's figures of those names.
TIMINGS = ("ttfb_s", "ttfe_s", "ttft_s", "duration_s", "max_gap_s")
NO_TIMINGS = (None,) * len(TIMINGS)


class _Facts(NamedTuple):
    """What the metrics read of one flow besides what the end's waits add to its record: from
    its typed measurement, or from a record of any origin (so each may be anything)."""

    hop: object
    api: object
    model: object
    path: object
    trace_id: object
    timings: tuple[object, ...]  # TIMINGS, to the microsecond as the record has them
    ended: object
    status: object  # the response's, else the one the proxy answered in its place
    tokens: object
    tokens_source: object
    events: float
    stalls: object
    malformed: object
    payload_bytes: object
    bytes_wire: object
    bytes_out: object
    delivered: bool  # the proxy followed the flow's bytes to the client
    client_wait_s: object
    negative_holds: object


def _measured_facts(m: Measurement) -> _Facts:
    """The facts of a flow the proxy measured, as its record would say them."""
    seen, f, meter, response = m.seen, m.figures, m.seen.meter, m.seen.response
    timings: tuple[object, ...] = NO_TIMINGS
    tokens = stalls = malformed = payload = None
    events, wire = 0.0, 0 if response is not None else None
    if f is not None and meter is not None:  # measured: the record has figures and a stream
        timings = (_us(f.ttfb_s), _us(f.ttfe_s), _us(f.ttft_s), _us(f.duration_s), _us(f.max_gap_s))
        tokens, stalls, events = f.tokens, f.stalls, float(meter.events_seen)
        malformed, payload = meter.malformed_events, meter.facts.payload_bytes
        wire = meter.bytes_wire
    failure, d = seen.failure, m.delivery
    if response is not None:
        status: object = response.status
    else:  # the status the proxy answered in its place, if it did
        status = failure.status_sent if failure is not None else None
    return _Facts(
        hop=seen.hop,
        api=m.api,
        model=m.model,
        path=seen.request.path,
        trace_id=seen.trace_id,
        timings=timings,
        ended=seen.ended,
        status=status,
        tokens=tokens,
        tokens_source=m.tokens.source if m.tokens is not None else None,
        events=events,
        stalls=stalls,
        malformed=malformed,
        payload_bytes=payload,
        bytes_wire=wire,
        bytes_out=seen.bytes_out if response is not None else None,
        delivered=d is not None and d.measured,
        client_wait_s=_us(d.client_wait_s) if d is not None else None,
        negative_holds=d.negative_holds if d is not None else None,
    )


def _record_facts(record: Mapping[str, Any]) -> _Facts:
    """The facts a record says (one of any origin: every value is checked where it is read)."""
    request = record.get("request") or {}
    response = record.get("response") or {}
    figures = record.get("figures") or {}
    delivery = record.get("delivery")
    d = delivery if isinstance(delivery, Mapping) else {}
    events = _num(figures.get("events"))
    return _Facts(
        hop=record.get("hop"),
        api=record.get("api"),
        model=record.get("model"),
        path=request.get("path"),
        trace_id=record.get("trace_id"),
        timings=tuple(figures.get(key) for key in TIMINGS),
        ended=response.get("ended", record.get("ended")),
        status=response.get("status", (record.get("upstream_error") or {}).get("status_sent")),
        tokens=figures.get("tokens"),
        tokens_source=figures.get("tokens_source"),
        events=float(len(record.get("events") or ())) if events is None else events,
        stalls=figures.get("stalls"),
        malformed=(record.get("stream") or {}).get("malformed_events"),
        payload_bytes=figures.get("payload_bytes"),
        bytes_wire=response.get("bytes_wire"),
        bytes_out=response.get("bytes_out"),
        delivered=d.get("measured") is True,
        client_wait_s=d.get("client_wait_s"),
        negative_holds=d.get("negative_holds"),
    )


def _us(x: float | None) -> float | None:
    """To the microsecond, as the record writes a duration (hopmeter.core.record)."""
    return None if x is None else round(x, 6)


def _below_zero(value: object) -> bool:
    """A number (not a bool) below zero."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value < 0


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


class WeightedHistogram:
    """A labelled histogram that takes each value with a weight: k observations in one call.

    An event of k tokens after a gap g is k observations of g/k, and a segment's holds are one per
    token; observe() once per token costs ~2.5 µs on the proxy's event loop (5 ms for a
    2,000-token flow), and prometheus_client has no "observe n times". So the values are counted
    into buckets here, under one lock per call, and the registry reads them as a custom collector
    (client_python's route for values counted elsewhere: docs/content/collector/custom.md). Its
    samples are those of a prometheus_client Histogram given the same observations one by one,
    without `_created`; a test compares the two.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = (*(float(b) for b in buckets), math.inf)
        self._le = tuple(_go_float(b) for b in self._bounds)
        self._lock = threading.Lock()  # observe() on the proxy's side, collect() on a scrape's
        self._series: dict[tuple[str, ...], _Series] = {}
        registry.register(self)

    def observe(
        self,
        labelvalues: tuple[str, ...],
        values: Sequence[tuple[float, int]],
        exemplar: dict[str, str] | None,
    ) -> None:
        """Observe each (value, weight) `weight` times; the widest value carries the exemplar.

        The label set's series exists from the first call, values or not, as a Histogram's
        child does from labels(): at 0, so a first increase shows in rate().
        """
        self.observe_columns(
            labelvalues,
            [value for value, _ in values],
            [weight for _, weight in values],
            exemplar,
        )

    def observe_columns(
        self,
        labelvalues: tuple[str, ...],
        values: Sequence[float],
        weights: Sequence[int],
        exemplar: dict[str, str] | None,
        *,
        ordered: Sequence[float] | None = None,
    ) -> None:
        """`observe` with the values and their weights as two columns of one length (a flow's
        gaps come that way: no pair built per value, nor taken apart again). `ordered` is
        `values` sorted, when every weight is 1 and the caller sorted them already (the
        figures' gaps): they are not sorted again."""
        counted = self._count(values, weights, ordered) if values else None
        marked = None
        if counted is not None and exemplar is not None:
            marked = Exemplar(exemplar, counted.widest_value, time.time())
        with self._lock:
            series = self._series.get(labelvalues)
            if series is None:
                series = self._series[labelvalues] = _Series(len(self._bounds))
            if counted is None:
                return
            if marked is not None:  # the trace worth opening: the one with the widest gap
                series.exemplars[counted.widest_slot] = marked
            series.total += counted.widest_value
            series.total += counted.rest
            for slot, n in enumerate(counted.counts):
                if n:
                    series.counts[slot] += n

    def _count(
        self, plain: Sequence[float], weights: Sequence[int], ordered: Sequence[float] | None = None
    ) -> _Counted:
        """Observations per bucket for `plain` values of `weights`, without touching any
        series."""
        if len(plain) != len(weights):
            raise ValueError("values and weights differ in length")
        widest_value = max(plain)
        bounds = self._bounds
        counts = [0] * len(bounds)
        once = len(weights) == sum(weights) and min(weights) == 1  # one observation each
        if once:  # the usual: a flow's gaps, one token per event
            total = math.fsum(plain)
            if not math.isnan(total):  # no NaN among them: they sort
                # a value's bucket is the first whose bound is >= it, so the values up to a
                # bound are those of its bucket and the ones before: one search per bucket in
                # the sorted values instead of one per value
                if ordered is None:
                    ordered = sorted(plain)
                below = 0
                for slot, bound in enumerate(bounds):
                    upto = bisect_right(ordered, bound)
                    counts[slot] = upto - below
                    below = upto
                widest_slot = bisect_left(bounds, widest_value)
                return _Counted(counts, widest_slot, widest_value, total - widest_value)
        # the first bucket whose bound is >= each value, found in C (bisect over map)
        slots = list(map(partial(bisect_left, bounds), plain))
        if once:
            for slot, n in CountOf(slots).items():
                counts[slot] += n
            rest = math.fsum(plain) - widest_value
        else:
            rest = 0.0
            for slot, value, weight in zip(slots, plain, weights, strict=True):
                counts[slot] += weight
                rest += value * weight
            rest -= widest_value
        widest_slot = slots[plain.index(widest_value)]
        return _Counted(counts, widest_slot, widest_value, rest)

    def collect(self) -> Iterator[Metric]:
        """The family with one cumulative bucket list, count and sum per label set."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            taken = [
                (labels, list(s.counts), s.total, list(s.exemplars))
                for labels, s in self._series.items()
            ]
        for labels, counts, total, exemplars in taken:
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            cumulative = 0.0
            for le, n, exemplar in zip(self._le, counts, exemplars, strict=True):
                cumulative += n
                buckets.append((le, cumulative) if exemplar is None else (le, cumulative, exemplar))
            family.add_metric(labels, buckets, total)
        yield family


class _Counted(NamedTuple):
    """One observe() call's values counted into buckets, before they are added to a series."""

    counts: list[int]  # observations per bucket, the widest value's included
    widest_slot: int
    widest_value: float
    rest: float  # the sum of every observation but the widest value


class _Series:
    """One label set of a WeightedHistogram: counts per bucket (not cumulative), sum, exemplars."""

    __slots__ = ("counts", "exemplars", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.total = 0.0
        self.exemplars: list[Exemplar | None] = [None] * buckets


def _go_float(bound: float) -> str:
    """A bucket bound as the `le` label prometheus_client writes ("+Inf", else Python's repr).

    Go's format, which prometheus_client follows, switches to an exponent from 1e6 on; no bucket
    of hopmeter's is that large, and a test compares every bucket table's `le` values.
    """
    return "+Inf" if bound == math.inf else repr(bound)


def exported_names(registry: CollectorRegistry) -> Iterator[str]:
    """Every sample name the registry's metric families can expose (for dashboards and tests)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}
    for family in registry.collect():
        for suffix in suffixes.get(family.type, ("",)):
            yield family.name + suffix
