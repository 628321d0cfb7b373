"""The join service's counters as Prometheus metrics, read from a snapshot at each scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hopmeter.export.join_metrics import JoinCounts, JoinMetrics


def test_each_scrape_reads_the_counts_of_that_moment() -> None:
    """Requests by transport and status, spans and traces by outcome, segments by link, and the
    window's size, as counters and gauges; a later scrape shows later counts."""
    counts = {"accepted": 3, "foreign": 1}
    registry = CollectorRegistry()

    def snapshot() -> JoinCounts:
        return JoinCounts(
            requests={("http", "200"): 2, ("grpc", "INVALID_ARGUMENT"): 1},
            spans=dict(counts),
            traces={"joined": 1, "one_sided": 0},
            segments={"true": 1, "false": 0},
            out_of_order=1,
            window_traces=4,
            window_events=400,
            window_tombstones=7,
        )

    JoinMetrics(registry, snapshot)

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    first = scrape()
    assert first["hopmeter_join_requests_total", (("status", "200"), ("transport", "http"))] == 2
    assert first["hopmeter_join_spans_total", (("outcome", "accepted"),)] == 3
    assert first["hopmeter_join_traces_total", (("outcome", "one_sided"),)] == 0
    assert first["hopmeter_join_segments_total", (("linked", "true"),)] == 1
    assert first["hopmeter_join_out_of_order_spans_total", ()] == 1
    assert first["hopmeter_join_window_traces", ()] == 4
    assert first["hopmeter_join_window_events", ()] == 400
    assert first["hopmeter_join_window_tombstones", ()] == 7
    counts["accepted"] = 5
    assert scrape()["hopmeter_join_spans_total", (("outcome", "accepted"),)] == 5
