"""The join service's own counters, exposed as Prometheus metrics (docs/design.md §8).

The service counts in plain ints on its event loop; this collector reads a snapshot of them at
each scrape (client_python's custom-collector route, docs/content/collector/custom.md), so a
span costs no lock and no labelled child. The holds and segment findings themselves are
hopmeter.export.prometheus.Metrics' `hold_seconds` and `segment_findings_total`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinCounts:
    """What the join service has counted so far."""

    requests: Mapping[tuple[str, str], int]  # (transport, status) -> requests answered
    spans: Mapping[str, int]  # SpanOutcome -> spans
    traces: Mapping[str, int]  # TraceOutcome -> traces that left the window
    segments: Mapping[str, int]  # "true" (by parent link) / "false" (by hop order) -> aligned
    out_of_order: int
    window_traces: int
    window_events: int
    window_tombstones: int = 0  # ids of ended traces remembered, so late spans count late
    orders: Mapping[str, int] | None = None  # SegmentOrder -> segments written


class JoinMetrics:
    """A collector of the join service's counters, registered on the caller's registry."""

    def __init__(self, registry: CollectorRegistry, counts: Callable[[], JoinCounts]) -> None:
        self._counts = counts
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """The families, from one snapshot of the counts."""
        counts = self._counts()
        requests = CounterMetricFamily(
            "hopmeter_join_requests",
            "OTLP export requests answered, by transport and status (HTTP code or gRPC name).",
            labels=("transport", "status"),
        )
        for (transport, status), n in sorted(counts.requests.items()):
            requests.add_metric((transport, status), n)
        yield requests
        yield _by_label(
            "hopmeter_join_spans",
            "Spans received, by what became of them (accepted, foreign, malformed, duplicate, "
            "late, no_timeline, overflow).",
            "outcome",
            counts.spans,
        )
        yield _by_label(
            "hopmeter_join_traces",
            "Traces that left the window, by how (joined, partly_joined, unlinked, one_sided, "
            "evicted, lost).",
            "outcome",
            counts.traces,
        )
        yield _by_label(
            "hopmeter_join_segments",
            "Segments aligned, by whether the hops were paired by parent link.",
            "linked",
            counts.segments,
        )
        yield _by_label(
            "hopmeter_join_segment_orders",
            "Segments written, by how their direction was known (link, learned, declared; "
            "unknown: reported unordered, holds not observed).",
            "order",
            counts.orders or {},
        )
        yield CounterMetricFamily(
            "hopmeter_join_out_of_order_spans",
            "Inner hops' spans that arrived before their outer hop's (handled).",
            value=counts.out_of_order,
        )
        yield GaugeMetricFamily(
            "hopmeter_join_window_traces", "Traces held in the window now.", counts.window_traces
        )
        yield GaugeMetricFamily(
            "hopmeter_join_window_events",
            "Timeline events held in the window now.",
            counts.window_events,
        )
        yield GaugeMetricFamily(
            "hopmeter_join_window_tombstones",
            "Ids of traces that left the window, remembered one more window so that a span "
            "arriving after its trace is counted late.",
            counts.window_tombstones,
        )


def _by_label(name: str, doc: str, label: str, values: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=(label,))
    for value, n in sorted(values.items()):
        family.add_metric((value,), n)
    return family
