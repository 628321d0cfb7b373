"""Bad input to a real `hopmeter join --serve`: clear OTLP statuses, every span counted, memory
bounded by the window under a flood of one-sided traces."""

from __future__ import annotations

import gzip
from pathlib import Path

import grpc
import orjson
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.harness.otlp import (
    PROTOBUF,
    JoinServe,
    hop_span,
    join_serve,
    post,
    request_of,
)
from tests.harness.procs import rss_mib, wait_for

pytestmark = pytest.mark.integration
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")


def _counted(join: JoinServe, key: str, value: float) -> None:
    """Wait until the service's metric `key` reads `value`."""
    wait_for(lambda: join.metrics().get(key) == value, 15, f"{key} == {value}")


def test_bad_requests_get_otlp_statuses_and_are_counted(tmp_path: Path) -> None:
    """Undecodable bodies are 400 with a google.rpc.Status, unknown types and encodings 415,
    bodies over 20 MiB (on the wire or unzipped) 413, other methods 405 and paths 404; gRPC
    garbage is INVALID_ARGUMENT; each is counted by status."""
    with join_serve(tmp_path, grpc_port=True) as join:
        status, headers, body = post(join.port, b"\xff\xff\xff not protobuf")
        assert status == 400 and headers["content-type"] == PROTOBUF
        assert "not a protobuf trace export" in Status.FromString(body).message
        status, headers, body = post(join.port, b"{not json", "application/json")
        assert status == 400 and orjson.loads(body)["message"].startswith("the body is not JSON")
        status, _, body = post(join.port, b"{}", "text/plain")
        assert status == 415 and b"application/x-protobuf" in body
        assert post(join.port, b"x", encoding="br")[0] == 415
        assert post(join.port, b"not gzip", encoding="gzip")[0] == 400
        bomb = gzip.compress(bytes(21 * 2**20))  # 21 MiB of zeros in ~21 KB
        assert post(join.port, bomb, encoding="gzip")[0] == 413
        assert post(join.port, bytes(21 * 2**20))[0] == 413  # read on, then closed
        assert post(join.port, b"", method="GET")[0] == 405
        assert post(join.port, b"", path="/v1/metrics")[0] == 404
        with grpc.insecure_channel(f"127.0.0.1:{join.grpc_port}") as channel:
            call = channel.unary_unary(EXPORT)
            with pytest.raises(grpc.RpcError) as exc:
                call(b"\xff\xff\xff not protobuf", timeout=10)
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        metrics = join.metrics()
    expect = {"400": 3, "415": 2, "413": 2, "405": 1, "404": 1}
    for status_code, n in expect.items():
        assert (
            metrics[f'hopmeter_join_requests_total{{status="{status_code}",transport="http"}}'] == n
        )
    grpc_bad = 'hopmeter_join_requests_total{status="INVALID_ARGUMENT",transport="grpc"}'
    assert metrics[grpc_bad] == 1
    assert metrics['hopmeter_join_spans_total{outcome="accepted"}'] == 0


def test_foreign_absurd_duplicate_and_late_spans_are_counted(tmp_path: Path) -> None:
    """Foreign spans are accepted and ignored; absurd timelines are rejected in partial_success;
    a repeated span is a duplicate and one after its trace left the window is late."""
    ids = [bytes([i]) * 8 for i in range(1, 12)]
    with join_serve(tmp_path, window_s=1.0) as join:
        spans = [
            hop_span(TRACE, ids[0], hop=None),  # foreign: some other service's span
            hop_span(TRACE, ids[1], hop=None, **{"http.route": "/x"}),
            hop_span(TRACE, ids[2], t_us=[1, 2, 3], offsets=[1, 2]),  # unequal lengths
            hop_span(TRACE, ids[3], t_us=[5, 4], offsets=[1, 2]),  # back in time
            hop_span(TRACE, ids[4], t_us=list(range(20_000)), offsets=list(range(20_000))),
            hop_span(TRACE, ids[5], t_us=["1", "2"], offsets=[1, 2]),  # not integers
            hop_span(TRACE, ids[6], t_us=[-1, 2], offsets=[1, 2]),  # negative
            hop_span(TRACE, ids[7], hop=""),  # an empty hop name
            hop_span(TRACE, ids[8]),  # a good one-sided span
            hop_span(TRACE, ids[8]),  # ... sent twice
        ]
        status, _, body = post(join.port, request_of(spans).SerializeToString())
        assert status == 200
        partial = ExportTraceServiceResponse.FromString(body).partial_success
        assert partial.rejected_spans == 6
        assert "hopmeter.timeline" in partial.error_message
        _counted(join, 'hopmeter_join_traces_total{outcome="one_sided"}', 1)
        late = request_of([hop_span(TRACE, ids[9], parent=ids[8], hop="origin")])
        assert post(join.port, late.SerializeToString())[0] == 200
        metrics = join.metrics()
    outcomes = {"foreign": 2, "malformed": 6, "accepted": 1, "duplicate": 1, "late": 1}
    for outcome, n in outcomes.items():
        assert metrics[f'hopmeter_join_spans_total{{outcome="{outcome}"}}'] == n, outcome
    assert metrics["hopmeter_join_window_traces{}"] == 0


# -- the flood ------------------------------------------------------------------------------------
FLOOD_TRACES = 60_000
SPANS_PER_REQUEST = 2_000


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _flood_bodies(salt: int) -> list[bytes]:
    """FLOOD_TRACES one-sided traces as export requests, built by splicing trace ids into one
    serialized span (protobuf field order puts trace_id first), fast enough for a test."""
    template = hop_span(TRACE, b"\x01" * 8).SerializeToString()
    assert template[:2] == b"\x0a\x10" and template[2:18] == TRACE
    head, tail = template[:2], template[18:]
    resource = request_of([]).resource_spans[0].resource.SerializeToString()
    bodies = []
    for first in range(0, FLOOD_TRACES, SPANS_PER_REQUEST):
        spans = b"".join(
            _field(2, head + (salt << 64 | n).to_bytes(16, "big") + tail)
            for n in range(first, first + SPANS_PER_REQUEST)
        )
        resource_spans = _field(1, resource) + _field(2, spans)
        bodies.append(_field(1, resource_spans))
    return bodies


def _flood(join: JoinServe, salt: int, ended: int) -> float:
    """Send one flood, wait until its traces and their tombstones have left the window (so the
    next flood starts from the same empty window); the service's RSS then."""
    for body in _flood_bodies(salt):
        assert post(join.port, body)[0] == 200
    _counted(join, 'hopmeter_join_traces_total{outcome="one_sided"}', ended)
    _counted(join, "hopmeter_join_window_tombstones{}", 0)
    assert join.metrics()["hopmeter_join_window_traces{}"] == 0
    return rss_mib(join.proc.popen.pid)


def test_a_flood_of_one_sided_traces_is_bounded_by_the_window(tmp_path: Path) -> None:
    """60,000 one-sided traces fill the window and leave it, each counted one-sided; a second
    flood as large, sent once the first's tombstones are gone too, grows the service's memory by
    much less than the first did.

    Measured here: the first flood grows the service by 33-45 MiB, the second by -1 to +7. A
    service that kept each ended trace grows by ~83 MiB on each flood; one that kept the ids of
    ended traces never brings its tombstone gauge to 0. (Sent without waiting for the tombstones,
    the second flood's peak stacked on the first's tombstones and grew 13-15 MiB now and then.)"""
    with join_serve(tmp_path, window_s=1.0) as join:
        before = rss_mib(join.proc.popen.pid)
        first = _flood(join, 1, FLOOD_TRACES)
        second = _flood(join, 2, 2 * FLOOD_TRACES)
        metrics = join.metrics()
    assert metrics['hopmeter_join_spans_total{outcome="accepted"}'] == 2 * FLOOD_TRACES
    assert metrics["hopmeter_join_window_events{}"] == 0
    grown = first - before
    assert second - first <= grown / 3 + 4, (before, first, second)
