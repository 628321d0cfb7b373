"""Hops on different hosts joined live: hopmeters export OTLP to real `hopmeter join --serve`s.

The origin's clock is shifted for real where a test says so: libfaketime (Debian's `libfaketime`,
preloaded into the origin's process) moves its wall clock by seconds and leaves the monotonic
clock alone, as a host whose NTP is off would be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hopmeter.core.hops import HopFlow, align, chain
from tests.harness.nginx import NginxServer
from tests.harness.otlp import JoinServe, TraceRouter, join_serve
from tests.harness.procs import free_port, hopmeter, read_records, wait_for

pytestmark = pytest.mark.integration
# Long enough for gzip to hold (docs/nginx-holds.md): 120 tokens at 60 tokens/s, 2 s.
SCENARIO = "tokens=120;rate=60"
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # spans leave within 0.1 s, not the SDK's 5 s
HOLDS = ("first_token_hold_s", "hold_p50_s", "hold_p99_s", "hold_max_s")
TOLERANCE_S = 0.001
# Debian's libfaketime: FAKETIME="+2.5" moves time(), gettimeofday() and CLOCK_REALTIME by 2.5 s;
# FAKETIME_DONT_FAKE_MONOTONIC leaves CLOCK_MONOTONIC (hopmeter's event offsets) alone.
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def _send(port: int, scenario: str = SCENARIO) -> None:
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "gpt-4o", "stream": True},
        headers={"x-hopmeter-scenario": scenario},
        timeout=30,
    )
    assert r.status_code == 200


@contextlib.contextmanager
def _two_hosts(
    tmp: Path, config: str | None, collector: str, *, origin_shift_s: float = 0.0
) -> Iterator[tuple[int, Path, Path]]:
    """upstream <- origin hopmeter [<- nginx] <- edge hopmeter, two processes exporting OTLP to
    `collector`, the origin's wall clock `origin_shift_s` off: (the edge port, the edge's
    records, the origin's records)."""
    up, origin, edge = free_port(), free_port(), free_port()

    def host(
        name: str, port: int, target: int, env: dict[str, str]
    ) -> contextlib.AbstractContextManager[Any]:
        return hopmeter(
            tmp,
            "run",
            f"http://127.0.0.1:{target}",
            *("--listen", f"127.0.0.1:{port}", "--hop", name, "--metrics", "off"),
            *("--records", str(tmp / f"{name}.jsonl"), "--otel-endpoint", collector),
            name=name,
            ports=(port,),
            env={**FAST_EXPORT, **env},
        )

    shifted = {}
    if origin_shift_s:
        shifted = {
            "LD_PRELOAD": str(FAKETIME_LIB),
            "FAKETIME": f"{origin_shift_s:+g}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,))
        )
        stack.enter_context(host("origin", origin, up, shifted))
        middle = origin
        if config is not None:
            middle = stack.enter_context(NginxServer(origin, config, prefix=tmp)).port
        stack.enter_context(host("edge", edge, middle, {}))
        yield edge, tmp / "edge.jsonl", tmp / "origin.jsonl"


def _close(seg: dict[str, Any], expected: dict[str, Any]) -> None:
    """The segment's holds are the expected ones within a millisecond; the rest is equal."""
    for key in HOLDS:
        assert abs(seg[key] - expected[key]) <= TOLERANCE_S, key
    for key in ("segment", "inner_hop", "whole_body", "tokens_aligned"):
        assert seg[key] == expected[key], key
    assert {f["kind"] for f in seg["findings"]} == {f["kind"] for f in expected["findings"]}


def _within_bounds(seg: dict[str, Any], shift_s: float, truth: dict[str, Any]) -> None:
    """A segment joined across shifted clocks says what it can know: the true skew lies within
    its causal bounds, and each true hold (the two flows aligned on one clock) within the hold
    the segment gives plus its stated uncertainty. The estimate misses the truth by the fastest
    token's hold (docs: `estimate_skew`), a tenth of a millisecond through a quiet nginx and a
    few on a loaded machine, which these bounds carry and a fixed tolerance does not."""
    lower, upper = seg["skew_bounds_s"]
    assert lower - TOLERANCE_S <= shift_s <= upper + TOLERANCE_S, (lower, shift_s, upper)
    assert lower - TOLERANCE_S <= seg["skew_s"] <= upper + TOLERANCE_S
    lo, hi = seg["hold_uncertainty_s"]
    for key in HOLDS:
        assert seg[key] + lo - TOLERANCE_S <= truth[key] <= seg[key] + hi + TOLERANCE_S, key
    for key in ("segment", "inner_hop", "whole_body", "tokens_aligned"):
        assert seg[key] == truth[key], key


@pytest.mark.parametrize("config", ["streaming", "gzip_hold"])
def test_two_hosts_joined_live_give_the_pairings_holds(tmp_path: Path, config: str) -> None:
    """Edge and origin hopmeters in two processes, a real nginx between them, both exporting to
    a join service: its segment has the holds the one-process pairing computes from the same
    flows' records (within 1 ms), and its metrics count every token's hold."""
    with join_serve(tmp_path) as join, _two_hosts(tmp_path, config, join.url) as hosts:
        edge, edge_records, origin_records = hosts
        _send(edge)
        (line,) = join.joined(1)
        outer = read_records(edge_records, 1)[0]
        inner = read_records(origin_records, 1)[0]
        metrics = join.metrics()
    (pairing,) = chain([outer, inner])
    assert line["schema"] == "hopmeter.join/1"
    assert line["trace_id"] == outer["trace_id"] == inner["trace_id"]
    assert line["linked"] is True  # the origin's span is the edge's child
    (seg,) = line["hops"]
    _close(seg, pairing.as_dict())
    assert seg["tokens_aligned"] == 120
    if config == "gzip_hold":
        assert seg["whole_body"]
        assert "whole_body_hold" in {f["kind"] for f in seg["findings"]}
    else:
        assert not seg["whole_body"]
    assert metrics['hopmeter_hold_seconds_count{segment="edge>origin"}'] == 120
    assert metrics['hopmeter_join_spans_total{outcome="accepted"}'] == 2
    assert metrics['hopmeter_join_segments_total{linked="true"}'] == 1
    kind = 'hopmeter_segment_findings_total{kind="whole_body_hold",segment="edge>origin"}'
    assert metrics[kind] == (1 if config == "gzip_hold" else 0)


def test_one_process_pairing_and_the_join_service_agree(tmp_path: Path) -> None:
    """Two listeners of one process around a holding nginx pair the stream live; the spans the
    same process exports give the join service the same holds within 1 ms."""
    up, edge, origin = free_port(), free_port(), free_port()
    records = tmp_path / "records.jsonl"
    with (
        join_serve(tmp_path) as join,
        hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        NginxServer(origin, "gzip_hold", prefix=tmp_path) as nginx,
        hopmeter(
            tmp_path,
            "run",
            *("--listener", f"edge=reverse:http://127.0.0.1:{nginx.port}@127.0.0.1:{edge}"),
            *("--listener", f"origin=reverse:http://127.0.0.1:{up}@127.0.0.1:{origin}"),
            *("--records", str(records), "--metrics", "off", "--otel-endpoint", join.url),
            ports=(edge, origin),
            env=FAST_EXPORT,
        ),
    ):
        _send(edge)
        (line,) = join.joined(1)
        recs = read_records(records, 2)
    live = next(r for r in recs if r["hop"] == "edge")["hops"][0]
    (seg,) = line["hops"]
    _close(seg, live)
    assert seg["whole_body"]


def _joined_traces(joins: list[JoinServe], count: int) -> list[list[str]]:
    """The trace ids each service joined, once `count` were joined between them."""

    def enough() -> list[list[str]] | None:
        seen = [
            [ln for ln in j.records.read_bytes().splitlines() if ln.strip()]
            if j.records.exists()
            else []
            for j in joins
        ]
        if sum(map(len, seen)) < count:
            return None
        return [[orjson.loads(ln)["trace_id"] for ln in s] for s in seen]

    return wait_for(enough, 30, f"{count} joined traces")


def test_traces_sharded_over_two_join_services_are_joined_once(tmp_path: Path) -> None:
    """A trace-id router in front of two join services (OTLP/gRPC, as the Collector's
    load-balancing exporter speaks): every trace is joined once, by one service, and both
    services get a share."""
    requests = 20
    with (
        join_serve(tmp_path, name="join-0", grpc_port=True) as j0,
        join_serve(tmp_path, name="join-1", grpc_port=True) as j1,
        TraceRouter([f"127.0.0.1:{j0.grpc_port}", f"127.0.0.1:{j1.grpc_port}"]) as router,
        _two_hosts(tmp_path, "streaming", router.url) as (edge, edge_records, _),
    ):
        with httpx.Client(timeout=30) as client:
            for _ in range(requests):
                r = client.post(
                    f"http://127.0.0.1:{edge}/v1/chat/completions",
                    json={"model": "gpt-4o", "stream": True},
                    headers={"x-hopmeter-scenario": "tokens=8;rate=400"},
                )
                assert r.status_code == 200
        per_service = _joined_traces([j0, j1], requests)
        edges = {r["trace_id"] for r in read_records(edge_records, requests)}
        metrics = [j0.metrics(), j1.metrics()]
    joined = [t for ids in per_service for t in ids]
    assert sorted(joined) == sorted(edges)  # every trace once, none twice
    assert all(per_service), "one service got no trace"
    for ids, m in zip(per_service, metrics, strict=True):
        assert m['hopmeter_join_spans_total{outcome="accepted"}'] == 2 * len(ids)
        assert m['hopmeter_join_requests_total{status="OK",transport="grpc"}'] >= 1
    assert sum(router.forwarded) == 2 * requests


@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="libfaketime is not installed")
@pytest.mark.parametrize("shift_s", [2.5, -2.5])
def test_an_instrumented_client_s_traces_join_linked_whatever_the_origin_s_clock(
    tmp_path: Path, shift_s: float
) -> None:
    """An OpenTelemetry-instrumented httpx client (its own traceparent on every request) through
    edge hopmeter, nginx and origin hopmeter, each in its own process, the origin's wall clock
    2.5 s ahead or behind, exporting to a join service: every trace is linked (the edge's span is
    the client's child, the origin's the edge's), every segment is edge>origin, the shift lies
    within its skew bounds and the holds of the same two flows aligned on one clock (the shift
    taken out) within its holds and their stated uncertainty."""
    requests = 4
    provider = TracerProvider()
    client_spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(client_spans))
    with (
        join_serve(tmp_path) as join,
        _two_hosts(tmp_path, "streaming", join.url, origin_shift_s=shift_s) as hosts,
    ):
        edge, edge_records, origin_records = hosts
        with httpx.Client(timeout=30) as client:
            HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
            for _ in range(requests):
                r = client.post(
                    f"http://127.0.0.1:{edge}/v1/chat/completions",
                    json={"model": "gpt-4o", "stream": True},
                    headers={"x-hopmeter-scenario": "tokens=30;rate=100"},
                )
                assert r.status_code == 200
        lines = join.joined(requests)
        edges = {r["trace_id"]: r for r in read_records(edge_records, requests)}
        origins = {r["trace_id"]: r for r in read_records(origin_records, requests)}
        metrics = join.metrics()
    sent = {s.context.trace_id: s.context.span_id for s in client_spans.get_finished_spans()}
    assert {f"{t:032x}" for t in sent} == set(edges) == set(origins)
    for line in lines:
        assert line["linked"] is True
        (seg,) = line["hops"]
        assert (seg["segment"], seg["order"]) == ("edge>origin", "link")
        outer, inner = edges[line["trace_id"]], origins[line["trace_id"]]
        assert outer["parent_span_id"] == f"{sent[int(line['trace_id'], 16)]:016x}"
        assert inner["parent_span_id"] == outer["span_id"]  # hopmeter's own span, forwarded
        shift = (shift_s, shift_s)
        one_clock = align(HopFlow.from_record(outer), HopFlow.from_record(inner), shift)
        _within_bounds(seg, shift_s, one_clock.as_dict())
    assert metrics['hopmeter_join_segment_orders_total{order="link"}'] == requests
    assert metrics['hopmeter_negative_durations_total{what="hold"}'] == 0
