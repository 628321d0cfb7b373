"""The join service: spans filed, segments aligned after the answer, observed and written."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from hopmeter.core.spans import SpanView
from hopmeter.join import service as service_module
from hopmeter.join.otlp import decode_request
from hopmeter.join.service import MALFORMED_WHY, OVERFLOW_WHY, JoinService
from tests.harness.otlp import hop_span, join_serve, request_of
from tests.harness.procs import wait_for
from tests.join.conftest import config

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
EDGE = bytes.fromhex("00f067aa0ba902b7")
ORIGIN = bytes.fromhex("b7ad6b7169203331")
START = 1_800_000_000_000_000_000


def spans(*built: object) -> list[SpanView]:
    return decode_request(request_of(built).SerializeToString())  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_pair_is_aligned_observed_and_written(tmp_path: Path) -> None:
    """The edge's and the origin's spans give one segment: holds in the histogram, findings
    counted, and a hopmeter.join/1 line in the records."""
    svc = JoinService(config(tmp_path))
    edge = hop_span(
        TRACE, EDGE, start_ns=START, t_us=[310_000, 330_000], offsets=[4, 8],
        hopmeter__findings="burst_gaps",
    )  # fmt: skip
    origin = hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE, start_ns=START + 1_000_000)
    assert svc.accept(spans(edge)) == (0, "")
    svc.settle()
    assert svc.accept(spans(origin)) == (0, "")
    assert (tmp_path / "joined.jsonl").read_bytes() == b""  # aligned only at settle()
    svc.settle()
    svc.stop()
    (line,) = [orjson.loads(ln) for ln in (tmp_path / "joined.jsonl").read_bytes().splitlines()]
    assert line["schema"] == "hopmeter.join/1" and line["trace_id"] == TRACE.hex()
    assert line["linked"] is True
    (seg,) = line["hops"]
    assert seg["segment"] == "edge>origin" and seg["tokens_aligned"] == 2
    assert seg["first_token_hold_s"] == 0.009  # 0.310 s at the edge, 0.301 s at the origin
    assert seg["findings"] == [{"kind": "burst_gaps", "introduced_by": "edge>origin"}]
    counts = svc.counts()
    assert counts.segments == {"true": 1, "false": 0}
    assert counts.spans["accepted"] == 2 and counts.traces["joined"] == 1
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in svc.metrics.registry.collect()
        for s in family.samples
    }
    assert samples["hopmeter_hold_seconds_count", (("segment", "edge>origin"),)] == 2
    kind = (("kind", "burst_gaps"), ("segment", "edge>origin"))
    assert samples["hopmeter_segment_findings_total", kind] == 1
    assert samples["hopmeter_join_traces_total", (("outcome", "joined"),)] == 1


def test_rejected_spans_are_reported_for_partial_success(tmp_path: Path) -> None:
    """Absurd spans are rejected with a reason; foreign and timeline-less ones are not."""
    svc = JoinService(config(tmp_path, records=""))
    bad = hop_span(TRACE, EDGE, t_us=[2, 1], offsets=[1, 2])
    foreign = hop_span(TRACE, ORIGIN, hop=None)
    rejected, why = svc.accept(spans(bad, foreign))
    assert (rejected, why) == (1, MALFORMED_WHY.format(n=1))
    assert svc.counts().spans["foreign"] == 1
    svc.stop()


def test_spans_refused_for_room_are_told_apart_from_malformed_ones(tmp_path: Path) -> None:
    """A span the window has no room for is not absurd: partial_success says which were
    refused for room (and the limit to raise), apart from the malformed ones."""
    svc = JoinService(config(tmp_path, records="", max_events=3))
    big = hop_span(TRACE, EDGE, t_us=[1, 2, 3, 4], offsets=[1, 2, 3, 4])  # 4 events > 3
    bad = hop_span(TRACE, ORIGIN, hop="origin", t_us=[2, 1], offsets=[1, 2])
    rejected, why = svc.accept(spans(big, bad))
    assert rejected == 2
    assert why == MALFORMED_WHY.format(n=1) + "; " + OVERFLOW_WHY.format(n=1, max=3)
    assert "raise --max-events" in why
    svc.stop()


@pytest.mark.parametrize("declared", [False, True])
def test_tick_ends_traces_and_orders_unlinked_ones(tmp_path: Path, declared: bool) -> None:
    """After the window a trace without parent links is written unlinked: unordered (no holds
    observed, a segment_unordered finding counted) unless --order declares its hops' order; at
    stop what still waits is counted lost."""
    clock = Clock()
    order = ("edge", "origin") if declared else ()
    svc = JoinService(config(tmp_path, window_s=5.0, order=order), clock=clock)
    other = bytes.fromhex("aa" * 8)
    svc.accept(
        spans(
            hop_span(TRACE, EDGE, start_ns=START),
            hop_span(TRACE, ORIGIN, hop="origin", parent=other, start_ns=START + 10),
        )
    )
    clock.now = 2.0
    svc.accept(spans(hop_span(bytes.fromhex("cc" * 16), EDGE)))
    clock.now = 5.0
    svc.tick()
    clock.now = 6.0
    svc.stop()
    (line,) = [orjson.loads(ln) for ln in (tmp_path / "joined.jsonl").read_bytes().splitlines()]
    (seg,) = line["hops"]
    counts = svc.counts()
    assert counts.traces["unlinked"] == 1 and counts.traces["lost"] == 1
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in svc.metrics.registry.collect()
        for s in family.samples
    }
    assert line["linked"] is False
    if declared:
        assert (seg["segment"], seg["order"]) == ("edge>origin", "declared")
        assert counts.segments == {"true": 0, "false": 1}
        assert samples["hopmeter_hold_seconds_count", (("segment", "edge>origin"),)] > 0
    else:
        assert (seg["segment"], seg["order"], seg["tokens_aligned"]) == (
            "edge~origin",
            "unknown",
            0,
        )
        assert [f["kind"] for f in seg["findings"]] == ["segment_unordered"]
        assert counts.segments == {"true": 0, "false": 0}
        kind = (("kind", "segment_unordered"), ("segment", "edge~origin"))
        assert samples["hopmeter_segment_findings_total", kind] == 1
        assert ("hopmeter_hold_seconds_count", (("segment", "edge~origin"),)) not in samples
    assert samples["hopmeter_join_segment_orders_total", (("order", seg["order"]),)] == 1


def test_an_unwritable_records_file_is_counted_not_raised(tmp_path: Path) -> None:
    """When the records file cannot take a line the service goes on and counts the loss."""
    svc = JoinService(config(tmp_path, records="/dev/full"))
    svc.accept(spans(hop_span(TRACE, EDGE), hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE)))
    svc.settle()
    svc.stop()
    assert svc.lost_records == 1 and svc.segments["true"] == 1


def test_reopen_writes_the_next_joined_lines_to_a_new_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After the records file is moved away, reopen (SIGHUP) sends the next joined line to a new
    file at the path; the one before stays in the moved file; the written lines are counted."""
    svc = JoinService(config(tmp_path))
    other = bytes.fromhex("cc" * 16)
    svc.accept(spans(hop_span(TRACE, EDGE), hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE)))
    svc.settle()
    wait_for(lambda: svc.outlets.states()[0].written == 1, what="the first line")
    (tmp_path / "joined.jsonl").rename(tmp_path / "joined.jsonl.1")
    with caplog.at_level("WARNING", logger="hopmeter"):
        svc.reopen()
    assert f"reopening {tmp_path / 'joined.jsonl'} (SIGHUP or SIGUSR1)" in caplog.text
    svc.accept(spans(hop_span(other, EDGE), hop_span(other, ORIGIN, hop="origin", parent=EDGE)))
    svc.settle()
    svc.stop()
    (old,) = (tmp_path / "joined.jsonl.1").read_bytes().splitlines()
    (new,) = (tmp_path / "joined.jsonl").read_bytes().splitlines()
    assert orjson.loads(old)["trace_id"] == TRACE.hex()
    assert orjson.loads(new)["trace_id"] == other.hex()
    samples = {
        (s.name, tuple(s.labels.items())): s.value
        for family in svc.metrics.registry.collect()
        for s in family.samples
    }
    assert samples["hopmeter_output_written_lines_total", (("output", "records"),)] == 2


def test_a_loss_is_said_by_the_next_tick(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A joined line that could not be written is said by the next tick, with its reason."""
    svc = JoinService(config(tmp_path, records="/dev/full"))
    svc.accept(spans(hop_span(TRACE, EDGE), hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE)))
    svc.settle()
    wait_for(lambda: svc.lost_records == 1, what="the failed write")
    with caplog.at_level("WARNING", logger="hopmeter"):
        svc.tick()
    assert "records 1 lines (enospc 1)" in caplog.text
    svc.stop()


def test_a_bug_reading_one_span_loses_only_that_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception while filing a span is counted as an internal error and that span rejected;
    the rest of the request is filed."""
    svc = JoinService(config(tmp_path, records=""))
    real = service_module.read_span

    def flaky(view: SpanView) -> object:
        if view.span_id == ORIGIN:
            raise RuntimeError("a bug")
        return real(view)

    monkeypatch.setattr(service_module, "read_span", flaky)
    rejected, _ = svc.accept(spans(hop_span(TRACE, ORIGIN, hop="origin"), hop_span(TRACE, EDGE)))
    assert rejected == 1 and svc.counts().spans["accepted"] == 1
    samples = {
        (s.name, tuple(s.labels.items())): s.value
        for family in svc.metrics.registry.collect()
        for s in family.samples
    }
    assert samples["hopmeter_internal_errors_total", (("where", "join_accept"),)] == 1
    svc.stop()


@pytest.mark.integration
def test_the_service_loads_no_mitmproxy() -> None:
    """The join service imports neither mitmproxy nor the proxy layer."""
    code = (
        "import sys, hopmeter.join.service, hopmeter.join.files, hopmeter.report.join\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'mitmproxy']\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_a_stop_with_exporter_connections_open_prints_no_traceback(tmp_path: Path) -> None:
    """SIGTERM while exporters hold connections open (idle keep-alive, a body half sent, an
    HTTP/2 connection for gRPC): the service closes them, says goodbye and exits 0, with no
    traceback on stderr."""
    with join_serve(tmp_path, grpc_port=True) as join:
        assert join.grpc_port is not None
        answered = socket.create_connection(("127.0.0.1", join.port))
        answered.sendall(
            b"POST /v1/traces HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        )
        assert answered.recv(100).startswith(b"HTTP/1.1 200")
        idle = socket.create_connection(("127.0.0.1", join.port))
        half = socket.create_connection(("127.0.0.1", join.port))
        half.sendall(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
        h2c = socket.create_connection(("127.0.0.1", join.grpc_port))
        h2c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert h2c.recv(100)  # the server's SETTINGS: the connection is being served
        assert join.proc.stop() == 0
        for s in (answered, idle, half, h2c):
            s.close()
    err = join.proc.output()
    assert "hopmeter join: stopped" in err
    assert "Traceback" not in err and "CancelledError" not in err
