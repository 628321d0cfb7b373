"""The hold each hop adds, live in one process and joined from two, through a real nginx."""

from __future__ import annotations

import contextvars
import dataclasses
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider

from tests.harness.nginx import GZIP_HOLD, NginxConfig, NginxServer
from tests.harness.procs import HOPMETER, free_port, hopmeter, read_records

pytestmark = pytest.mark.integration
# Long enough for gzip to hold (docs/nginx-holds.md): 120 tokens at 60 tokens/s, 2 s.
SCENARIO = "tokens=120;rate=60"


def _send(port: int) -> None:
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "gpt-4o", "stream": True},
        headers={"x-hopmeter-scenario": SCENARIO},
        timeout=30,
    )
    assert r.status_code == 200


def _live(
    tmp: Path, config: str | NginxConfig, send: Callable[[int], int] | None = None
) -> list[dict[str, Any]]:
    """Records of the requests `send(edge port)` makes (it says how many; default: one)
    through edge listener → nginx → origin listener → upstream."""
    up, edge, origin = free_port(), free_port(), free_port()
    records = tmp / "records.jsonl"
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        NginxServer(origin, config, prefix=tmp) as nginx,
        hopmeter(
            tmp,
            "run",
            "--listener",
            f"edge=reverse:http://127.0.0.1:{nginx.port}@127.0.0.1:{edge}",
            "--listener",
            f"origin=reverse:http://127.0.0.1:{up}@127.0.0.1:{origin}",
            "--records",
            str(records),
            "--metrics",
            "off",
            ports=(edge, origin),
        ),
    ):
        if send is None:
            _send(edge)
            return read_records(records, 2)
        return read_records(records, 2 * send(edge))


def _outer(recs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in recs if r["hop"] == "edge")


def _span(rec: dict[str, Any]) -> float:
    times = [t for t, k, _ in rec["events"] if k]
    return times[-1] - times[0]


def test_streaming_nginx_holds_nothing(tmp_path: Path) -> None:
    """Through a streaming nginx the segment holds each token a tiny share of the stream."""
    recs = _live(tmp_path, "streaming")
    outer, inner = _outer(recs), next(r for r in recs if r["hop"] == "origin")
    assert outer["trace_id"] == inner["trace_id"]
    (seg,) = outer["hops"]
    assert seg["segment"] == "edge>origin" and seg["inner_hop"] == "origin"
    assert seg["tokens_aligned"] == 120
    assert not seg["whole_body"]
    assert seg["hold_p99_s"] < 0.1 * _span(inner)
    assert not [f for f in seg["findings"] if f["kind"] in ("whole_body_hold", "burst_gaps")]
    assert "hops" not in inner


def test_gzip_nginx_holds_the_whole_body_on_its_segment(tmp_path: Path) -> None:
    """Buffering with gzip holds the first token about as long as the stream lasts."""
    recs = _live(tmp_path, "gzip_hold")
    outer, inner = _outer(recs), next(r for r in recs if r["hop"] == "origin")
    (seg,) = outer["hops"]
    assert seg["whole_body"]
    assert seg["first_token_hold_s"] >= 0.9 * _span(inner)
    assert "whole_body_hold" in [f["kind"] for f in seg["findings"]]
    # the model-side segment (origin) is clean
    assert not [f for f in inner["findings"] if f["kind"] in ("whole_body_hold", "burst_gaps")]


# gzip_hold behind an nginx that also drops the client's traceparent, as an LLM gateway as
# shipped does (docs/gateways.md): the two listeners see different trace ids.
GZIP_DROPS_TRACE = dataclasses.replace(
    GZIP_HOLD,
    name="gzip_drops_trace",
    location=GZIP_HOLD.location + '    proxy_set_header traceparent "";\n',
)


def test_a_segment_that_drops_the_trace_and_gzips_is_paired_by_content(tmp_path: Path) -> None:
    """Through an nginx that gzips and drops traceparent, the edge saw a compressed stream under
    a trace id of its own; paired by the reply's decoded text, the segment still shows the
    whole-body hold, and says the trace context was dropped."""
    recs = _live(tmp_path, GZIP_DROPS_TRACE)
    outer, inner = _outer(recs), next(r for r in recs if r["hop"] == "origin")
    assert outer["trace_id"] != inner["trace_id"]
    assert (outer["response"]["content_encoding"], inner["response"]["content_encoding"]) == (
        "gzip",
        None,
    )
    assert outer["fingerprint"] == inner["fingerprint"]
    (seg,) = outer["hops"]
    assert seg["paired_by"] == "content" and seg["inner_flow_id"] == inner["flow_id"]
    assert seg["whole_body"] and seg["tokens_aligned"] == 120
    assert "trace_context_dropped" in [f["kind"] for f in outer["findings"]]
    assert outer["pairing"]["match"] == inner["pairing"]["match"] == "unique"


# What a segment says that does not depend on one stream's timing.
SHAPE = ("segment", "inner_hop", "order", "paired_by", "skew_basis", "tokens_aligned", "whole_body")


def test_traced_and_untraced_clients_give_the_same_hops(tmp_path: Path) -> None:
    """One process, two listeners around nginx: a plain client, and an OpenTelemetry-instrumented
    one making two calls at once inside one trace (as an app's request handler does), give the
    same hops: each edge flow carries the segment to the origin flow that names it as parent,
    with the same shape."""
    provider = TracerProvider()

    def send(edge: int) -> int:
        _send(edge)  # untraced: hopmeter makes the trace up
        with httpx.Client(timeout=30) as client:
            HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
            with provider.get_tracer("app").start_as_current_span("handler"):
                post = lambda _: client.post(  # noqa: E731 - the two calls of one handler
                    f"http://127.0.0.1:{edge}/v1/chat/completions",
                    json={"model": "gpt-4o", "stream": True},
                    headers={"x-hopmeter-scenario": SCENARIO},
                )
                with ThreadPoolExecutor(2) as pool:  # each call in the handler's context
                    calls = [pool.submit(contextvars.copy_context().run, post, i) for i in (0, 1)]
                    assert all(c.result().status_code == 200 for c in calls)
        return 3

    recs = _live(tmp_path, "streaming", send)
    by_span = {r["span_id"]: r for r in recs}
    outers = [r for r in recs if r["hop"] == "edge"]
    untraced = next(r for r in outers if r["parent_span_id"] is None)
    traced = [r for r in outers if r["parent_span_id"] is not None]
    assert len(traced) == 2 and traced[0]["trace_id"] == traced[1]["trace_id"]
    for rec in outers:
        (seg,) = rec["hops"]
        inner = next(r for r in recs if r["flow_id"] == seg["inner_flow_id"])
        assert by_span[inner["parent_span_id"]] is rec  # its own origin flow
        for key in SHAPE:
            assert seg[key] == untraced["hops"][0][key], key
    assert untraced["hops"][0]["order"] == "link"


def _join(*paths: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [*HOPMETER, "join", "--json", *map(str, paths)], capture_output=True, check=True, timeout=60
    )
    return [orjson.loads(line) for line in out.stdout.splitlines()]


def test_join_of_live_records_matches_live(tmp_path: Path) -> None:
    """`hopmeter join` on the records a live run wrote gives the live segment figures."""
    recs = _live(tmp_path, "gzip_hold")
    live = _outer(recs)["hops"][0]
    (joined,) = _join(tmp_path / "records.jsonl")
    seg = joined["hops"][0]
    for key in ("first_token_hold_s", "hold_p50_s", "hold_p99_s", "hold_max_s"):
        assert abs(seg[key] - live[key]) <= 0.001, key
    assert seg["whole_body"] == live["whole_body"]


def test_join_across_two_processes(tmp_path: Path) -> None:
    """Two separate hopmeters around nginx, joined, show the hold on the nginx segment."""
    up, edge, origin = free_port(), free_port(), free_port()
    with (
        hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        NginxServer(origin, "gzip_hold", prefix=tmp_path) as nginx,
        hopmeter(
            tmp_path,
            "run",
            f"http://127.0.0.1:{up}",
            "--listen",
            f"127.0.0.1:{origin}",
            "--hop",
            "origin",
            "--records",
            str(tmp_path / "origin.jsonl"),
            "--metrics",
            "off",
            name="origin",
            ports=(origin,),
        ),
        hopmeter(
            tmp_path,
            "run",
            f"http://127.0.0.1:{nginx.port}",
            "--listen",
            f"127.0.0.1:{edge}",
            "--hop",
            "edge",
            "--records",
            str(tmp_path / "edge.jsonl"),
            "--metrics",
            "off",
            name="edge",
            ports=(edge,),
        ),
    ):
        _send(edge)
        inner = read_records(tmp_path / "origin.jsonl", 1)[0]
        outer = read_records(tmp_path / "edge.jsonl", 1)[0]
    assert "hops" not in outer  # separate processes: only join can pair them
    (joined,) = _join(tmp_path / "edge.jsonl", tmp_path / "origin.jsonl")
    (seg,) = joined["hops"]
    assert seg["segment"] == "edge>origin"
    assert seg["whole_body"]
    assert seg["first_token_hold_s"] >= 0.9 * _span(inner)
    lower, upper = seg["skew_bounds_s"]
    assert lower <= 0 <= upper  # one machine, one clock
    assert outer["trace_id"] == inner["trace_id"]
