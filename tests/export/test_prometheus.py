"""Tests for hopmeter.export.prometheus: records in, exposition text out."""

from __future__ import annotations

import math
import os
import random
import re
import string
import subprocess
import sys
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from hopmeter.core.record import FlowResult
from hopmeter.export import prometheus
from hopmeter.export.labels import MAX_NAMES_PER_LABEL
from hopmeter.export.outlets import OutputState
from hopmeter.export.prometheus import (
    FLOW_LABELS,
    GAP_BUCKETS_S,
    Metrics,
    WeightedHistogram,
    exported_names,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def flow_record(**overrides: Any) -> dict[str, Any]:
    """A finished OpenAI chat stream as the addon writes it (docs/design.md §4)."""
    record: dict[str, Any] = {
        "schema": "hopmeter.flow/1",
        "trace_id": TRACE,
        "flow_id": "f1",
        "hop": "edge",
        "listener": "edge",
        "request": {
            "method": "POST",
            "scheme": "http",
            "host": "127.0.0.1",
            "path": "/v1/chat/completions",
            "t_start": 1700000000.0,
            "t_end": 1700000000.01,
            "bytes": 120,
        },
        "response": {"status": 200, "ended": "complete", "bytes_wire": 1000, "bytes_out": 1000},
        "api": "openai.chat",
        "model": "gpt-4o-2024-08-06",
        # a role prelude, then 1, 3 and 2 tokens, a zero-token ping between them, then [DONE]
        "events": [
            [0.05, 0, 0],
            [0.1, 1, 3],
            [0.37, 3, 12],
            [0.45, 0, 12],
            [0.75, 2, 20],
            [0.81, 0, 20],
        ],
        "figures": {
            "ttfb_s": 0.04,
            "ttfe_s": 0.05,
            "ttft_s": 0.1,
            "duration_s": 0.82,
            "tokens": 6,
            "tokens_source": "stream",
            "max_gap_s": 0.38,
            "stalls": 0,
            "itl_p50_s": 0.1,
            "events": 6,
            "payload_bytes": 20,
            "framing_overhead": 50.0,
        },
        "findings": [
            {
                "kind": "buffering_headers",
                "severity": "warning",
                "evidence": {},
                "fix": "send the headers",
            }
        ],
    }
    record.update(overrides)
    return record


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the registry's text exposition, keyed by name and label set.

    prometheus_client's `_created` series (creation times, left out by the server) are skipped.
    """
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sum of all samples named `name` whose labels include `labels`."""
    return sum(
        v for (n, ls), v in samples(registry).items() if n == name and set(labels.items()) <= ls
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh registry per test: no state leaks between tests."""
    return CollectorRegistry()


def test_first_byte_event_token_times_land_in_their_buckets(registry: CollectorRegistry) -> None:
    """TTFB, TTFE and TTFT are observed once each with hop/api/model/route labels."""
    Metrics(registry).observe_flow(flow_record())
    labels = {
        "hop": "edge",
        "api": "openai.chat",
        "model": "gpt-4o",
        "route": "/v1/chat/completions",
    }
    assert value(registry, "hopmeter_time_to_first_byte_seconds_bucket", le="0.04", **labels) == 1
    assert value(registry, "hopmeter_time_to_first_byte_seconds_bucket", le="0.02", **labels) == 0
    assert value(registry, "hopmeter_time_to_first_event_seconds_count", **labels) == 1
    assert value(registry, "hopmeter_time_to_first_token_seconds_sum", **labels) == pytest.approx(
        0.1
    )
    assert value(registry, "hopmeter_stream_duration_seconds_bucket", le="1.0", **labels) == 1
    assert value(registry, "hopmeter_max_gap_seconds_bucket", le="0.4", **labels) == 1


def test_inter_token_latency_is_token_weighted(registry: CollectorRegistry) -> None:
    """An event of k tokens after a gap g is k observations of g/k; zero-token events skip."""
    Metrics(registry).observe_flow(flow_record())
    name = "hopmeter_inter_token_latency_seconds"
    # gaps: 0.27 s before 3 tokens (3 x 0.09 s), 0.38 s before 2 (2 x 0.19 s; the ping ignored)
    assert value(registry, f"{name}_count") == 5
    assert value(registry, f"{name}_sum") == pytest.approx(0.65)
    assert value(registry, f"{name}_bucket", le="0.075") == 0
    assert value(registry, f"{name}_bucket", le="0.1") == 3
    assert value(registry, f"{name}_bucket", le="0.2") == 5
    assert value(registry, "hopmeter_event_tokens_count") == 3
    assert value(registry, "hopmeter_event_tokens_sum") == 6


def test_an_event_with_many_tokens_counts_every_token(registry: CollectorRegistry) -> None:
    """A reconciled burst of 5,000 tokens after 5 s is 5,000 observations of 1 ms, exactly."""
    Metrics(registry).observe_flow(flow_record(events=[[0.1, 1, 1], [5.1, 5000, 9000]]))
    name = "hopmeter_inter_token_latency_seconds"
    assert value(registry, f"{name}_count") == 5000
    assert value(registry, f"{name}_bucket", le="0.001") == 5000
    assert value(registry, f"{name}_sum") == pytest.approx(5.0)


def test_bucket_counting_equals_observing_one_by_one(registry: CollectorRegistry) -> None:
    """The token-weighted histogram exposes what one Histogram.observe() per token exposes."""
    rng = random.Random(3)
    events, t = [], 0.0
    for i in range(300):
        t += rng.choice([0.0, 0.0004, 0.003, 0.02, 0.1, 0.9])
        events.append([round(t, 6), rng.choice([0, 1, 1, 2, 5, 40]), i])
    Metrics(registry).observe_flow(flow_record(events=events, trace_id=None))
    name = "hopmeter_inter_token_latency_seconds"
    reference = CollectorRegistry()
    itl = Histogram(name, "-", FLOW_LABELS, registry=reference, buckets=GAP_BUCKETS_S).labels(
        hop="edge", api="openai.chat", model="gpt-4o", route="/v1/chat/completions"
    )
    previous = None
    for t_s, k, _ in events:
        if k:
            if previous is not None:
                for _ in range(k):
                    itl.observe(max(0.0, t_s - previous) / k)
            previous = t_s
    got = {key: v for key, v in samples(registry).items() if key[0].startswith(name)}
    want = {key: v for key, v in samples(reference).items() if key[0].startswith(name)}
    assert got.keys() == want.keys()
    for key, expected in want.items():
        assert got[key] == pytest.approx(expected), key


BUCKET_TABLES = [v for k, v in vars(prometheus).items() if k.endswith(("_BUCKETS", "_BUCKETS_S"))]


@pytest.mark.parametrize("ones", [False, True], ids=["weighted", "one each"])
@pytest.mark.parametrize("buckets", BUCKET_TABLES)
def test_a_weighted_histogram_writes_the_bytes_a_histogram_does(
    buckets: Sequence[float], ones: bool
) -> None:
    """Same observations, same text and OpenMetrics bytes (exemplar times aside) as
    prometheus_client's Histogram, `_created` aside: names, `le` values, counts, sums; values
    of several observations each, and of one each (counted from the sorted values)."""
    values = [(0.5, 3), (0.0001, 1), (2.0, 2), (0.125, 1), (1000.0, 1)]  # exact binary sums
    if ones:
        values = [(v, 1) for v, k in values for _ in range(k)] + [(0.0025, 1), (0.25, 1)]
    exemplar = {"trace_id": TRACE}
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    weighted = WeightedHistogram("h_seconds", "Doc.", ("segment",), buckets, ours)
    histogram = Histogram("h_seconds", "Doc.", ("segment",), registry=theirs, buckets=buckets)
    WeightedHistogram("empty_seconds", "Doc.", ("segment",), buckets, ours)
    Histogram("empty_seconds", "Doc.", ("segment",), registry=theirs, buckets=buckets)
    for segment in ("a>b", "c>d"):
        weighted.observe((segment,), values, exemplar)
        child = histogram.labels(segment=segment)
        child.observe(1000.0, exemplar)  # the widest value carries the exemplar
        for value, weight in values:
            for _ in range(weight - (value == 1000.0)):
                child.observe(value)

    def text(registry: CollectorRegistry, generate: Any) -> str:
        lines = generate(registry).decode().splitlines()
        return "\n".join(
            re.sub(r'(# \{trace_id="\w+"\} \S+) \S+$', r"\1 T", line)
            for line in lines
            if "_created" not in line
        )

    assert text(ours, generate_latest) == text(theirs, generate_latest)
    assert text(ours, generate_openmetrics) == text(theirs, generate_openmetrics)


@given(
    st.lists(
        st.one_of(
            st.floats(0.0, 100.0),
            st.sampled_from([0.0, 0.001, 0.0025, 0.5, 60.0, math.inf]),  # on a bound, past all
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(BUCKET_TABLES),
)
def test_values_of_one_observation_each_are_counted_as_one_by_one(
    values: list[float], buckets: Sequence[float]
) -> None:
    """Counting sorted values per bucket bound gives each bucket the values a search per value
    puts there (bounds and infinity included), the same sum and the widest value's bucket."""
    hist = WeightedHistogram("h_seconds", "Doc.", (), buckets, CollectorRegistry())
    counted = hist._count(values, [1] * len(values))
    bounds = (*map(float, buckets), math.inf)
    slots = [bisect_left(bounds, v) for v in values]
    assert counted.counts == [slots.count(i) for i in range(len(bounds))]
    assert counted.widest_value == max(values)
    assert counted.widest_slot == slots[values.index(max(values))]
    rest = math.fsum(values) - max(values)
    assert counted.rest == rest or (math.isnan(rest) and math.isnan(counted.rest))


def test_observing_columns_writes_what_observing_pairs_does() -> None:
    """A flow's gaps given as two columns (values, weights) expose the same bytes as the same
    gaps given as (value, weight) pairs: buckets, sum, count and the exemplar's bucket."""
    values = [(0.5, 3), (0.0001, 1), (2.0, 2), (0.125, 1), (1000.0, 1), (0.01, 1), (0.01, 1)]
    exemplar = {"trace_id": TRACE}
    pairs, columns = CollectorRegistry(), CollectorRegistry()
    by_pairs = WeightedHistogram("h_seconds", "Doc.", ("x",), prometheus.GAP_BUCKETS_S, pairs)
    by_columns = WeightedHistogram("h_seconds", "Doc.", ("x",), prometheus.GAP_BUCKETS_S, columns)
    for rows in (values, values[1:2], [], [(v, 1) for v, _ in values]):
        by_pairs.observe(("a",), rows, exemplar)
        by_columns.observe_columns(("a",), [v for v, _ in rows], [k for _, k in rows], exemplar)

    def text(registry: CollectorRegistry) -> str:
        return re.sub(r"(# \{[^}]*\} \S+) \S+", r"\1 T", generate_openmetrics(registry).decode())

    assert text(pairs) == text(columns)
    assert "h_seconds_count" in text(columns)


def test_weighted_series_exist_at_zero_from_the_first_flow(registry: CollectorRegistry) -> None:
    """A flow with no token gaps still creates its inter-token and tokens-per-event series, at 0,
    and a segment without holds its hold series, as a Histogram's labels() would."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record(events=[[0.1, 1, 1]]))
    metrics.observe_holds("edge>origin", [], None)
    series = samples(registry)
    for name in ("hopmeter_inter_token_latency_seconds", "hopmeter_hold_seconds"):
        assert value(registry, f"{name}_count") == 0
        assert any(n == f"{name}_bucket" for n, _ in series), name
    assert value(registry, "hopmeter_event_tokens_count") == 1


def test_missing_figures_are_not_observed(registry: CollectorRegistry) -> None:
    """A flow without a visible token (or without any response) observes no TTFT, yet counts."""
    metrics = Metrics(registry)
    metrics.observe_flow(
        flow_record(figures={"ttfb_s": 0.2, "ttft_s": None, "tokens": 0}, events=[])
    )
    metrics.observe_flow(
        {
            "hop": "edge",
            "request": {"path": "/v1/messages"},
            "api": "other",
            "model": None,
            "findings": [],
        }
    )
    assert value(registry, "hopmeter_time_to_first_token_seconds_count") == 0
    assert value(registry, "hopmeter_time_to_first_byte_seconds_count") == 1
    assert value(registry, "hopmeter_flows_total") == 2
    assert (
        value(
            registry,
            "hopmeter_flows_total",
            status_class="none",
            model="none",
            route="/v1/messages",
            ended="other",
        )
        == 1
    )


def test_counters_count_flows_tokens_events_findings_and_stalls(
    registry: CollectorRegistry,
) -> None:
    """Each counter moves by what the record says, with its bounded labels."""
    Metrics(registry).observe_flow(
        flow_record(
            response={
                "status": 200,
                "ended": "upstream_reset",
                "bytes_wire": 1000,
                "bytes_out": 900,
            },
            findings=[{"kind": "truncated"}, {"kind": "stall"}, {"kind": "made_up"}],
            figures={**flow_record()["figures"], "stalls": 2, "tokens_source": "usage"},
        )
    )
    assert value(registry, "hopmeter_flows_total", status_class="2xx", ended="upstream_reset") == 1
    assert value(registry, "hopmeter_tokens_total", source="usage") == 6
    assert value(registry, "hopmeter_events_total") == 6
    assert value(registry, "hopmeter_stalls_total") == 2
    assert value(registry, "hopmeter_findings_total", kind="truncated", hop="edge") == 1
    assert value(registry, "hopmeter_findings_total", kind="other") == 1


def test_a_flow_the_proxy_answered_counts_its_cause_and_the_status_sent(
    registry: CollectorRegistry,
) -> None:
    """No response, a top-level `ended` and the 502 the proxy answered: flows_total has the
    cause as `ended` and 5xx as the status class, and the finding is counted."""
    Metrics(registry).observe_flow(
        {
            "hop": "edge",
            "request": {"path": "/v1/chat/completions"},
            "ended": "connect_refused",
            "upstream_error": {"cause": "connect_refused", "status_sent": 502},
            "api": "other",
            "model": None,
            "findings": [{"kind": "upstream_unreachable"}],
        }
    )
    assert value(registry, "hopmeter_flows_total", status_class="5xx", ended="connect_refused") == 1
    assert value(registry, "hopmeter_findings_total", kind="upstream_unreachable") == 1


def test_finding_and_stall_series_exist_at_zero_from_the_first_flow(
    registry: CollectorRegistry,
) -> None:
    """Every finding kind and the stall counter start at 0, so a first increase is seen."""
    Metrics(registry).observe_flow(flow_record(findings=[]))
    series = samples(registry)
    kinds = {dict(ls)["kind"]: v for (n, ls), v in series.items() if n == "hopmeter_findings_total"}
    assert {"whole_body_hold", "truncated", "stall", "other"} <= kinds.keys()
    assert set(kinds.values()) == {0.0}
    assert value(registry, "hopmeter_stalls_total", hop="edge") == 0
    assert any(n == "hopmeter_stalls_total" for n, _ in series)


def test_malformed_events_are_counted_from_the_stream_facts(registry: CollectorRegistry) -> None:
    """stream.malformed_events adds to its hop/api counter; absent, the series exists at 0."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record(stream={"terminal_seen": True}))
    assert ("hopmeter_malformed_events_total", frozenset(
        {("hop", "edge"), ("api", "openai.chat")})) in samples(registry)  # fmt: skip
    assert value(registry, "hopmeter_malformed_events_total") == 0
    metrics.observe_flow(flow_record(stream={"malformed_events": 3}))
    metrics.observe_flow(flow_record(stream={"malformed_events": 2}, api="anthropic.messages"))
    metrics.observe_flow(flow_record(stream={"malformed_events": "x"}))  # not a count: ignored
    metrics.observe_flow(flow_record(stream=None))
    assert value(registry, "hopmeter_malformed_events_total", api="openai.chat", hop="edge") == 3
    assert value(registry, "hopmeter_malformed_events_total", api="anthropic.messages") == 2
    assert "hopmeter_malformed_events_total" in set(exported_names(registry))


def test_clipped_body_copies_are_counted_by_reason(registry: CollectorRegistry) -> None:
    """A record whose kept body was clipped adds to its hop and reason; both reasons exist at
    0 from the first flow; an unknown reason is "other"."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record())
    assert value(registry, "hopmeter_bodies_clipped_total", reason="flow_cap") == 0
    assert value(registry, "hopmeter_bodies_clipped_total", reason="total_cap") == 0
    metrics.observe_flow(flow_record(mitmproxy={"stream": "hopmeter", "body_clipped": "flow_cap"}))
    metrics.observe_flow(flow_record(mitmproxy={"stream": "hopmeter", "body_clipped": None}))
    metrics.observe_flow(flow_record(mitmproxy={"stream": "hopmeter", "body_clipped": "x"}))
    assert value(registry, "hopmeter_bodies_clipped_total", reason="flow_cap", hop="edge") == 1
    assert value(registry, "hopmeter_bodies_clipped_total", reason="other") == 1


def test_what_a_record_does_not_list_is_counted(registry: CollectorRegistry) -> None:
    """Events past the timeline's cap, chunks past the chunk list's, events too large to read:
    each record's counts add to its hop's series, all three there at 0 from the first flow."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record())
    whats = ("events", "chunks", "oversized_events", "errors", "undecoded_bodies", "model_names")
    for what in whats:
        assert value(registry, "hopmeter_measure_dropped_total", what=what, hop="edge") == 0
    stream = {**(flow_record().get("stream") or {}), "overflows": 1, "unread_bytes": 1444}
    stream |= {"errors": ["overloaded_error"] * 5, "errors_seen": 12, "decode_error": "x"}
    metrics.observe_flow(
        flow_record(
            events_dropped=51_799, chunks_dropped=55_895, stream=stream, model_clipped_chars=9
        )
    )
    assert value(registry, "hopmeter_measure_dropped_total", what="events") == 51_799
    assert value(registry, "hopmeter_measure_dropped_total", what="chunks") == 55_895
    assert value(registry, "hopmeter_measure_dropped_total", what="oversized_events") == 1
    assert value(registry, "hopmeter_measure_unread_bytes_total", hop="edge") == 1444
    assert value(registry, "hopmeter_measure_dropped_total", what="errors") == 7
    assert value(registry, "hopmeter_measure_dropped_total", what="undecoded_bodies") == 1
    assert value(registry, "hopmeter_measure_dropped_total", what="model_names") == 1
    collapsed = "hopmeter_label_sets_collapsed_total"
    assert value(registry, collapsed, hop="edge", api="openai.chat") == 0  # there from 0


def test_model_and_route_tables_can_be_replaced(registry: CollectorRegistry) -> None:
    """Metrics labels models and routes with the tables passed to it instead of the defaults."""
    Metrics(registry, models=["my-model"], routes=[("/infer", "/infer")]).observe_flow(
        flow_record(model="My-Model-v2", request={"path": "/infer"})
    )
    assert value(registry, "hopmeter_flows_total", model="my-model", route="/infer") == 1


def test_bytes_split_into_payload_and_framing(registry: CollectorRegistry) -> None:
    """Wire bytes in and out split into visible payload and everything else (framing)."""
    Metrics(registry).observe_flow(
        flow_record(
            response={"status": 200, "ended": "complete", "bytes_wire": 1000, "bytes_out": 900}
        )
    )
    assert value(registry, "hopmeter_bytes_total", direction="in", part="payload") == 20
    assert value(registry, "hopmeter_bytes_total", direction="in", part="framing") == 980
    assert value(registry, "hopmeter_bytes_total", direction="out", part="payload") == 20
    assert value(registry, "hopmeter_bytes_total", direction="out", part="framing") == 880


def test_label_values_are_bounded_under_random_traffic(registry: CollectorRegistry) -> None:
    """10,000 random paths, models, hops and segments stop adding series once the caps are hit."""
    metrics = Metrics(registry)
    rng = random.Random(7)

    def word() -> str:
        return "".join(rng.choices(string.ascii_letters + string.digits + "/-_.:", k=12))

    def traffic(n: int) -> None:
        for i in range(n):
            metrics.observe_flow(
                flow_record(
                    hop=f"hop{rng.randrange(100)}",
                    model="zz" + word(),
                    api=word(),
                    request={"path": f"/v1/{word()}/{i}"},
                    trace_id=f"{i:032x}",
                    response={"status": rng.randint(0, 999), "ended": word(), "bytes_wire": 10},
                    findings=[{"kind": word()}],
                    events=[],
                    figures={"ttfb_s": 0.1},
                )
            )
            metrics.observe_holds(word(), [0.001], None)
            metrics.internal_error(word())

    traffic(5_000)
    before = samples(registry)
    traffic(5_000)
    series = samples(registry)
    assert series.keys() == before.keys()  # 5,000 more random requests added no series
    hops = {dict(ls).get("hop") for _, ls in series} - {None}
    assert len(hops) == MAX_NAMES_PER_LABEL + 1  # the first names seen, then "other"
    folded = "hopmeter_label_values_folded_total"
    # each said on /metrics: 68 of the 100 hop names came after the first 32 kept
    assert value(registry, folded, label="hop", why="limit") > 6_000
    assert value(registry, folded, label="hop", why="malformed") == 0  # there from 0
    assert value(registry, folded, label="segment", why="limit") > 0
    assert value(registry, folded, label="site", why="malformed") > 0  # "/" is not in a name
    assert {dict(ls).get("model") for _, ls in series} - {None} == {"other"}
    assert {dict(ls).get("route") for _, ls in series} - {None} == {"other"}
    assert {dict(ls).get("api") for _, ls in series} - {None} == {"other"}
    assert len({dict(ls).get("segment") for _, ls in series} - {None}) <= MAX_NAMES_PER_LABEL + 1


def test_trace_ids_are_exemplars_never_labels(registry: CollectorRegistry) -> None:
    """The trace id appears in OpenMetrics exemplars and in no label value."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record())
    metrics.observe_holds("edge>origin", [0.001, 0.5], TRACE)
    assert all(TRACE not in ls_value for _, ls in samples(registry) for _, ls_value in ls)
    text = generate_openmetrics(registry).decode()
    exemplars = {
        s.name: s.exemplar.labels["trace_id"]
        for family in parse_openmetrics(text)
        for s in family.samples
        if s.exemplar
    }
    for name in (
        "hopmeter_time_to_first_token_seconds_bucket",
        "hopmeter_flows_total",
        "hopmeter_inter_token_latency_seconds_bucket",
        "hopmeter_hold_seconds_bucket",
    ):
        assert exemplars.get(name) == TRACE, name


def test_a_malformed_trace_id_is_no_exemplar(registry: CollectorRegistry) -> None:
    """A trace id that is not hex (or too long for an exemplar) is dropped, not an error."""
    Metrics(registry).observe_flow(flow_record(trace_id="x" * 200))
    assert "trace_id" not in generate_openmetrics(registry).decode()


def test_the_global_registry_is_left_alone(registry: CollectorRegistry) -> None:
    """Metrics registers only on the registry passed in."""
    Metrics(registry).observe_flow(flow_record())
    assert not any(name.startswith("hopmeter_") for name in REGISTRY._names_to_collectors)


@pytest.mark.integration
def test_importing_changes_no_global_state() -> None:
    """Importing the instruments leaves os.environ, prometheus_client's switches and its
    global registry as they were (a user's own mitmdump keeps its `_created` series)."""
    code = (
        "import os, sys\n"
        "env = dict(os.environ)\n"
        "import prometheus_client, prometheus_client.metrics as pm\n"
        "names = set(prometheus_client.REGISTRY._names_to_collectors)\n"
        "import hopmeter.export.prometheus, hopmeter.export.server, hopmeter.export.labels\n"
        "assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())\n"
        "assert pm._use_created is True, 'created series switched off'\n"
        "assert set(prometheus_client.REGISTRY._names_to_collectors) == names\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_DISABLE_CREATED_SERIES"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # and imported first, before prometheus_client: no environment variable set for it either
    code = (
        "import os\n"
        "import hopmeter.export.prometheus, prometheus_client.metrics as pm\n"
        "assert 'PROMETHEUS_DISABLE_CREATED_SERIES' not in os.environ\n"
        "assert pm._use_created is True\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_holds_are_observed_per_token(registry: CollectorRegistry) -> None:
    """Each token's hold is one observation under its segment."""
    Metrics(registry).observe_holds("edge>origin", [0.0002, 0.003, 4.0], TRACE)
    assert value(registry, "hopmeter_hold_seconds_count", segment="edge>origin") == 3
    assert value(registry, "hopmeter_hold_seconds_bucket", segment="edge>origin", le="0.005") == 2


def test_a_segment_observes_its_holds_and_counts_its_findings(registry: CollectorRegistry) -> None:
    """observe_segment: one hold per token, one count per finding the segment introduced, and
    every finding kind's series for the segment from 0."""
    from hopmeter.core.hops import HopFlow, align

    def view(hop: str, first: float, kinds: frozenset[str]) -> HopFlow:
        events = [[first + i * 0.05, 1, 4 * (i + 1)] for i in range(4)]
        return HopFlow(
            hop=hop, t_start=10.0, t_first_byte=None, events=events, ttft_s=first,
            itl_p50_s=0.05, finding_kinds=kinds,
        )  # fmt: skip

    segment = align(view("edge", 0.3, frozenset({"burst_gaps"})), view("origin", 0.1, frozenset()))
    Metrics(registry).observe_segment(segment, TRACE)
    assert value(registry, "hopmeter_hold_seconds_count", segment="edge>origin") == 4
    findings = "hopmeter_segment_findings_total"
    assert value(registry, findings, segment="edge>origin", kind="burst_gaps") == 1
    assert (
        "hopmeter_segment_findings_total",
        frozenset({("segment", "edge>origin"), ("kind", "stall")}),
    ) in samples(registry)


def test_what_a_segment_adds_on_the_way_in_is_observed(registry: CollectorRegistry) -> None:
    """A segment's request delay and added time to first token are one observation each; a
    segment whose request starts are unknown observes neither."""
    from hopmeter.core.hops import Segment

    def seg(bounds: tuple[float | None, float | None]) -> Segment:
        return Segment(
            segment="edge>origin", inner_hop="origin", holds_s=(0.007,), first_token_hold_s=0.007,
            whole_body=False, skew_s=0.0, skew_bounds_s=bounds, findings=(),
        )  # fmt: skip

    metrics = Metrics(registry)
    metrics.observe_segment(seg((-0.007, 0.012)), TRACE)
    metrics.observe_segment(seg((None, None)), TRACE)
    delay = "hopmeter_segment_request_delay_seconds"
    assert value(registry, f"{delay}_count", segment="edge>origin") == 1
    assert value(registry, f"{delay}_bucket", segment="edge>origin", le="0.01") == 0
    assert value(registry, f"{delay}_bucket", segment="edge>origin", le="0.025") == 1
    assert value(registry, "hopmeter_segment_added_ttft_seconds_sum") == pytest.approx(0.019)


def test_pairings_are_counted_by_how_and_how_sure(registry: CollectorRegistry) -> None:
    """A flow's `pairing` counts once under its hop, how it was paired and how sure; an
    ambiguous one under paired_by "none"; a record without the field not at all."""
    metrics = Metrics(registry)
    metrics.observe_flow(
        flow_record(pairing={"paired_by": "content", "match": "unique", "candidates": 1})
    )
    metrics.observe_flow(
        flow_record(pairing={"paired_by": None, "match": "ambiguous", "candidates": 2})
    )
    metrics.observe_flow(flow_record())
    name = "hopmeter_pairings_total"
    assert value(registry, name, paired_by="content", match="unique") == 1
    assert value(registry, name, paired_by="none", match="ambiguous") == 1
    assert value(registry, name) == 2


def test_internal_errors_and_active_streams(registry: CollectorRegistry) -> None:
    """Internal errors count by site; the active-streams gauge goes up and down."""
    metrics = Metrics(registry)
    metrics.internal_error("stream_tap")
    metrics.stream_started()
    metrics.stream_started()
    metrics.stream_finished()
    assert value(registry, "hopmeter_internal_errors_total", where="stream_tap") == 1
    assert value(registry, "hopmeter_streams_active") == 1


def test_exported_names_cover_every_family(registry: CollectorRegistry) -> None:
    """exported_names lists the sample names dashboards may query, before anything is observed."""
    names = set(exported_names(Metrics(registry).registry))
    assert {
        "hopmeter_flows_total",
        "hopmeter_hold_seconds_bucket",
        "hopmeter_streams_active",
    } <= names


def measured_results() -> list[Any]:
    """Results as the proxy measures them: a chat stream followed to its client, one the
    upstream failed, one whose response was not measured, one mitmproxy buffered and edited."""
    import math

    from hopmeter.core.delivery import DeliverySeen
    from hopmeter.core.ledger import FlowChunks, Ledger, new_chunk
    from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
    from hopmeter.core.meter import FlowMeter
    from hopmeter.core.passage import PassageSeen
    from hopmeter.core.record import finish
    from hopmeter.core.tokens import estimate_counter
    from hopmeter.core.upstream import UpstreamFailure

    class Counters:
        def for_model(self, model: str | None) -> Any:
            return estimate_counter()

    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    led, chunks = Ledger(), FlowChunks()
    body = [b'data: {"choices":[{"delta":{"content":" tok tok"}}]}\n\n'] * 40
    for i, data in enumerate([*body, b"data: [DONE]\n\n"]):
        meter.feed(data, 0.20000037 + i * 0.0213)  # not on the microsecond: rounded
        c = new_chunk(len(data), 100.2 + i * 0.0213)
        chunks.add(c)
        led.arm(c)
        led.wrote(len(data), c[1] + 0.0003, False)
    led.sample(101.5, -math.inf, 0, 58)
    led.sample(101.501, 101.5, 0, 0)
    meter.close(1.2)
    request = RequestInfo(
        method="POST", scheme="http", host="h", path="/v1/chat/completions", t_start=1.7e9,
        t_end=1.7e9, bytes=10, model="gpt-4o",
    )  # fmt: skip
    response = ResponseInfo(
        status=200, http_version="HTTP/1.1", headers={"content-type": "text/event-stream"},
        t_headers_s=0.1,
    )  # fmt: skip
    followed = DeliverySeen(
        reason=None, measured=True, chunks=chunks, mono0=100.0, skew_s=0.0,
        http_version="HTTP/1.1",
    )  # fmt: skip
    base = {
        "flow_id": "f", "trace_id": TRACE, "hop": "edge", "listener": "edge", "request": request,
        "ended": "complete", "bytes_out": meter.bytes_wire, "stall_threshold_s": 0.02,
    }  # fmt: skip
    failure = UpstreamFailure(cause="connect_refused", detail="refused", status_sent=502)
    edited = PassageSeen(
        section={"stream": "buffered", "buffered_by": "modify_body", "body_clipped": "flow_cap"},
        error="E: x", cause="mitmproxy_error", edited_after_streaming=False, streamed_bytes=None,
    )  # fmt: skip
    seens = [
        Seen(**base, response=response, meter=meter, delivery=followed),  # type: ignore[arg-type]
        Seen(**{**base, "ended": "connect_refused"}, response=None, meter=None, failure=failure),  # type: ignore[arg-type]
        Seen(**base, response=response, meter=None, delivery=followed),  # type: ignore[arg-type]
        Seen(**base, response=response, meter=meter, passage=edited),  # type: ignore[arg-type]
    ]
    return [finish(seen, Counters()) for seen in seens]


def test_a_measured_result_observes_what_its_record_says() -> None:
    """Reading the typed measurement gives exactly the samples reading its record does, for
    flows measured, followed to the client, failed, unmeasured and moved by mitmproxy."""
    results = measured_results()
    assert results[0].delivery.measured and results[0].delivery.holds  # followed
    typed, from_record = CollectorRegistry(), CollectorRegistry()
    by_type, by_record = Metrics(typed), Metrics(from_record)
    for result in results:
        by_type.observe_result(result)
        by_record.observe_flow(
            result.record,
            gaps=result.figures.gaps if result.figures is not None else None,
            event_tokens=result.tokens.per_event if result.tokens is not None else None,
            own_holds=result.delivery.holds if result.delivery is not None else None,
        )
    assert samples(typed) == samples(from_record)
    assert value(typed, "hopmeter_client_wait_seconds_count") == 1
    assert value(typed, "hopmeter_flows_total", status_class="5xx") == 1  # the 502 sent
    assert value(typed, "hopmeter_bodies_clipped_total", reason="flow_cap") == 1
    assert value(typed, "hopmeter_stalls_total") > 0


def test_a_result_read_back_is_observed_from_its_record() -> None:
    """A result with no measurement (a record read back) is observed from its record alone."""
    record = measured_results()[0].record
    alone, from_record = CollectorRegistry(), CollectorRegistry()
    Metrics(alone).observe_result(FlowResult(record=record, figures=None, tokens=None))
    Metrics(from_record).observe_flow(record)
    assert samples(alone) == samples(from_record)
    assert value(alone, "hopmeter_flows_total") == 1


def test_gaps_from_the_flow_end_observe_what_the_record_does() -> None:
    """Passing the gaps and per-event tokens measuring computed gives the same histograms as
    reading them again from the record's events (the addon passes them; replays do not)."""
    from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
    from hopmeter.core.meter import FlowMeter
    from hopmeter.core.record import finish
    from hopmeter.core.tokens import estimate_counter

    class Counters:
        def for_model(self, model: str | None) -> Any:
            return estimate_counter()

    rng = random.Random(7)
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    t = 0.2
    for _ in range(120):
        text = " tok" * rng.choice([0, 1, 1, 1, 3])  # pings, single tokens, coalesced events
        t += rng.choice([0.0, 0.0031, 0.0213, 0.0213, 0.307])  # no gap near a bucket bound
        meter.feed(b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % text.encode(), t)
    meter.feed(b"data: [DONE]\n\n", t + 0.01)
    meter.close(t + 0.02)
    result = finish(Seen(
        flow_id="f",
        trace_id=TRACE,
        hop="edge",
        listener="edge",
        request=RequestInfo(
            method="POST", scheme="http", host="h", path="/v1/chat/completions",
            t_start=1.7e9, t_end=1.7e9, bytes=10,
        ),
        response=ResponseInfo(
            status=200, http_version="HTTP/1.1",
            headers={"content-type": "text/event-stream"}, t_headers_s=0.1,
        ),
        meter=meter,
        ended="complete",
        bytes_out=meter.bytes_wire,
        stall_threshold_s=0.5,
    ), Counters())  # fmt: skip
    assert result.figures is not None and result.tokens is not None
    from_record, passed = CollectorRegistry(), CollectorRegistry()
    Metrics(from_record).observe_flow(result.record)
    Metrics(passed).observe_flow(
        result.record, gaps=result.figures.gaps, event_tokens=result.tokens.per_event
    )
    a, b = samples(from_record), samples(passed)
    assert a.keys() == b.keys()
    for key, v in a.items():
        assert b[key] == pytest.approx(v, rel=1e-9, abs=1e-9), key
    assert value(passed, "hopmeter_inter_token_latency_seconds_count") > 100


def test_client_wait_per_flow_and_own_hold_per_token(registry: CollectorRegistry) -> None:
    """A followed flow adds one client wait and one own-hold observation per token."""
    rec = flow_record(delivery={"measured": True, "client_wait_s": 1.7})
    Metrics(registry).observe_flow(rec, own_holds=[(0.00008, 1), (0.0004, 3), (0.06, 2)])
    labels = {"hop": "edge", "api": "openai.chat", "route": "/v1/chat/completions"}
    assert value(registry, "hopmeter_client_wait_seconds_count", **labels) == 1
    assert value(registry, "hopmeter_client_wait_seconds_bucket", le="2.5", **labels) == 1
    assert value(registry, "hopmeter_client_wait_seconds_bucket", le="1.0", **labels) == 0
    assert value(registry, "hopmeter_own_hold_seconds_count", **labels) == 6
    assert value(registry, "hopmeter_own_hold_seconds_bucket", le="0.0005", **labels) == 4


def test_own_holds_that_are_not_numbers_or_weigh_nothing_are_left_out() -> None:
    """Holds of NaN, below zero or of no token are not observed: the same exposition as the
    holds without them (every hold passes in the usual flow, taken apart without a filter)."""
    rec = flow_record(delivery={"measured": True, "client_wait_s": 1.7})
    clean = [(0.00008, 1), (0.0004, 3), (0.06, 2)]
    odd = [(math.nan, 2), clean[0], (-0.001, 1), clean[1], (0.5, 0), clean[2]]
    exposed = []
    for holds in (clean, odd):
        registry = CollectorRegistry()
        Metrics(registry).observe_flow(rec, own_holds=holds)
        exposed.append(
            [
                line
                for line in generate_latest(registry).decode().splitlines()
                if "own_hold_seconds" in line and "_created" not in line
            ]
        )
    assert exposed[0] == exposed[1]
    assert any("_count" in line and line.endswith(" 6.0") for line in exposed[0])


def test_flows_not_followed_add_no_delivery_observation(registry: CollectorRegistry) -> None:
    """A flow whose bytes were not followed to the client says nothing about client wait."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record(delivery={"measured": False, "client_wait_s": None}))
    metrics.observe_flow(flow_record())
    assert value(registry, "hopmeter_client_wait_seconds_count", hop="edge") == 0


def test_the_page_s_first_painted_token_and_paint_lags(registry: CollectorRegistry) -> None:
    """A record with a joined beacon: time to first painted token once, paint lag per token,
    both with the flow's labels; client findings counted with the others."""
    record = flow_record(
        browser={"joined": True, "findings": [{"kind": "client_writes_per_token"}]},
        screen={"ttft_s": 0.31},
    )
    Metrics(registry).observe_flow(record, paint_lags=[0.004, 0.009, 0.03])
    first = "hopmeter_time_to_first_painted_token_seconds"
    assert value(registry, f"{first}_count", hop="edge", route="/v1/chat/completions") == 1
    assert value(registry, f"{first}_sum") == pytest.approx(0.31)
    assert value(registry, "hopmeter_paint_lag_seconds_count", api="openai.chat") == 3
    assert value(registry, "hopmeter_paint_lag_seconds_bucket", le="0.0167") == 2
    assert value(registry, "hopmeter_findings_total", kind="client_writes_per_token") == 1


def test_a_record_without_a_screen_observes_no_paint(registry: CollectorRegistry) -> None:
    """No screen section (no beacon, or no element watched): no painted-token series grow."""
    Metrics(registry).observe_flow(flow_record(browser={"joined": False}), paint_lags=None)
    assert value(registry, "hopmeter_time_to_first_painted_token_seconds_count") == 0
    assert value(registry, "hopmeter_paint_lag_seconds_count") == 0


def test_beacon_outcomes_count_from_zero(registry: CollectorRegistry) -> None:
    """The first beacon creates every outcome's series at 0; an unknown outcome is "other"."""
    metrics = Metrics(registry)
    assert value(registry, "hopmeter_beacons_total") == 0
    metrics.beacon("joined")
    metrics.beacon("flood")
    metrics.beacon("flood")
    metrics.beacon("made_up")
    names = {
        dict(ls).get("outcome") for n, ls in samples(registry) if n == "hopmeter_beacons_total"
    }
    assert {"joined", "missing", "too_large", "flood", "other"} <= names
    assert value(registry, "hopmeter_beacons_total", outcome="flood") == 2
    assert value(registry, "hopmeter_beacons_total", outcome="missing") == 0


def test_negative_durations_are_counted_by_what_they_were(registry: CollectorRegistry) -> None:
    """A segment's negative holds and request delay, a page's negative paint lags and a
    delivery's negative own holds are never observed: each is counted under what it was, by the
    same counts the record gives (every kind's series from 0)."""
    from hopmeter.core.hops import Segment, with_suspects

    seg = with_suspects(
        Segment(
            segment="edge>origin", inner_hop="origin", holds_s=(-0.002, 0.001, -0.001),
            first_token_hold_s=-0.002, whole_body=False, skew_s=0.0, skew_bounds_s=(0.0, -0.003),
            findings=(),
        )
    )  # fmt: skip
    metrics = Metrics(registry)
    assert value(registry, "hopmeter_negative_durations_total", what="paint_lag") == 0
    metrics.observe_segment(seg, TRACE)
    record = flow_record(
        screen={"ttft_s": 0.3, "paint_lags_negative": 2},
        delivery={"measured": True, "client_wait_s": 0.0, "negative_holds": 4},
    )
    metrics.observe_flow(record, paint_lags=[-0.004, 0.009, -0.001], own_holds=[(0.001, 1)])
    (finding,) = seg.findings
    assert finding["evidence"]["negative"] == {"hold": 2, "request_delay": 1, "added_ttft": 1}
    negative = "hopmeter_negative_durations_total"
    for what, n in (("hold", 2), ("request_delay", 1), ("added_ttft", 1)):
        assert value(registry, negative, what=what) == n
    assert value(registry, negative, what="paint_lag") == 2
    assert value(registry, negative, what="own_hold") == 4
    assert value(registry, "hopmeter_hold_seconds_count", segment="edge>origin") == 1
    assert value(registry, "hopmeter_paint_lag_seconds_count") == 1
    assert value(registry, "hopmeter_segment_request_delay_seconds_count") == 0


def test_an_unordered_pair_observes_no_hold(registry: CollectorRegistry) -> None:
    """Two hops whose order nothing told: their finding is counted, no hold series is made."""
    from hopmeter.core.hops import HopFlow, unordered

    def view(hop: str) -> HopFlow:
        return HopFlow(
            hop=hop, t_start=10.0, t_first_byte=None, events=[[0.1, 1, 4]], ttft_s=0.1,
            itl_p50_s=None, finding_kinds=frozenset(),
        )  # fmt: skip

    Metrics(registry).observe_segment(unordered(view("origin"), view("edge")), TRACE)
    kind = {"segment": "edge~origin", "kind": "segment_unordered"}
    assert value(registry, "hopmeter_segment_findings_total", **kind) == 1
    assert not [s for s in samples(registry) if s[0].startswith("hopmeter_hold_seconds")]


def test_outputs_are_exposed_by_output_and_reason(registry: CollectorRegistry) -> None:
    """What the watched outputs wrote, lost (by reason) and hold now is read at each scrape;
    the families exist, empty, before any output is watched."""
    metrics = Metrics(registry)
    names = set(exported_names(registry))
    assert {"hopmeter_output_lost_lines_total", "hopmeter_output_written_lines_total",
            "hopmeter_output_queued_bytes"} <= names  # fmt: skip
    states = [
        OutputState(output="records", written=5, lost={"queue_full": 0, "enospc": 3},
                    queued_bytes=120),
        OutputState(output="log", written=9, lost={"queue_full": 2}, queued_bytes=0),
    ]  # fmt: skip
    metrics.watch_outputs(lambda: states)
    assert (
        value(registry, "hopmeter_output_lost_lines_total", output="records", reason="enospc") == 3
    )
    assert (
        value(registry, "hopmeter_output_lost_lines_total", output="log", reason="queue_full") == 2
    )
    assert value(registry, "hopmeter_output_written_lines_total", output="log") == 9
    assert value(registry, "hopmeter_output_queued_bytes", output="records") == 120
    states[0] = OutputState(output="records", written=6, lost={"queue_full": 1}, queued_bytes=0)
    assert value(registry, "hopmeter_output_written_lines_total", output="records") == 6


@given(st.lists(st.sampled_from([0, 0, 1, 1, 1, 2, 5]), max_size=40))
def test_event_tokens_are_what_observing_each_token_carrying_event_gives(tokens: list[int]) -> None:
    """Events by the tokens they carry, observed from a flow's per-event counts (one token or
    none each, counted without a Counter; or any counts), expose what one Histogram.observe()
    per token-carrying event exposes."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ("edge", "openai.chat", "m", "/r")
    Metrics(ours)._observe_tokens(tuple(tokens), [], [], labels, None)
    name = "hopmeter_event_tokens"
    reference = Histogram(
        name, "-", FLOW_LABELS, registry=theirs, buckets=prometheus.EVENT_TOKEN_BUCKETS
    ).labels(*labels)
    for k in tokens:
        if k > 0:
            reference.observe(float(k))
    got = {key: v for key, v in samples(ours).items() if key[0].startswith(name)}
    want = {key: v for key, v in samples(theirs).items() if key[0].startswith(name)}
    assert got == want


@given(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40))
def test_values_given_sorted_count_as_values_sorted_here(values: list[float]) -> None:
    """A weighted histogram given its values already sorted (the figures' gaps) exposes what it
    exposes when it sorts them itself."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    given_sorted = WeightedHistogram("h_seconds", "Doc.", ("x",), GAP_BUCKETS_S, ours)
    sorted_here = WeightedHistogram("h_seconds", "Doc.", ("x",), GAP_BUCKETS_S, theirs)
    ones = [1] * len(values)
    given_sorted.observe_columns(("a",), values, ones, None, ordered=sorted(values))
    sorted_here.observe_columns(("a",), values, ones, None)
    assert samples(ours) == samples(theirs)


def test_a_registry_carries_the_processs_descriptors_and_memory() -> None:
    """A sidecar is watched for descriptors and memory as any exporter is: the process's own
    standard series are on every hopmeter registry."""
    from hopmeter.export.prometheus import new_registry

    registry = new_registry()
    fds = registry.get_sample_value("process_open_fds")
    assert fds is not None and fds > 0
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 0


def test_label_sets_past_the_bound_are_said_as_other_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Clients choose the model and the route: every family on every route would be thousands
    of label sets. Past MAX_FLOW_LABEL_SETS, a new set's model and route are said as other (the
    flow still observed), counted by hop and api; sets already in use keep their labels."""
    from hopmeter.export import prometheus

    monkeypatch.setattr(prometheus, "MAX_FLOW_LABEL_SETS", 2)
    metrics = Metrics(CollectorRegistry())
    for model in ("gpt-4o", "claude-3-5-sonnet", "llama-3.1", "gpt-4o", "mistral-large"):
        metrics.observe_flow(flow_record(model=model))
    flows = "hopmeter_flows_total"
    base = {"hop": "edge", "api": "openai.chat", "status_class": "2xx", "ended": "complete"}
    route = "/v1/chat/completions"

    def count(model: str, on: str = route) -> float | None:
        return metrics.registry.get_sample_value(flows, {**base, "model": model, "route": on})

    assert count("gpt-4o") == 2  # a set in use keeps its labels
    assert count("claude-3-5-sonnet") == 1
    assert count("llama-3.1") is None and count("mistral-large") is None
    assert count("other", "other") == 2  # both flows still observed
    collapsed = "hopmeter_label_sets_collapsed_total"
    assert metrics.registry.get_sample_value(collapsed, {"hop": "edge", "api": "openai.chat"}) == 2


def test_a_malformed_traceparent_is_counted_per_hop(registry: CollectorRegistry) -> None:
    """A request whose traceparent was malformed (its client's trace lost) counts on its hop;
    one that sent none, or a valid one, does not; the series is there at 0 from the first flow."""
    metrics = Metrics(registry)
    metrics.observe_flow(flow_record(traceparent_received="valid"))
    assert value(registry, "hopmeter_traceparent_malformed_total", hop="edge") == 0
    for received in ("malformed", "absent", "malformed", None):
        metrics.observe_flow(flow_record(traceparent_received=received))
    assert value(registry, "hopmeter_traceparent_malformed_total", hop="edge") == 2
