"""OTLP protobuf for the join: requests and files in as spans, responses and statuses out."""

from __future__ import annotations

import struct

import orjson
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from hopmeter.core.spans import read_span
from hopmeter.core.vocab import SpanOutcome
from hopmeter.errors import OtlpError
from hopmeter.join.otlp import decode_file, decode_request, export_response, status_body
from tests.harness.otlp import hop_span, request_of

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
EDGE = bytes.fromhex("00f067aa0ba902b7")
ORIGIN = bytes.fromhex("b7ad6b7169203331")


def test_a_request_reads_to_spans_with_hopmeters_attributes() -> None:
    """Ids, times, service and (for hopmeter spans only) every attribute as Python values."""
    spans = [
        hop_span(
            TRACE,
            ORIGIN,
            hop="origin",
            parent=EDGE,
            hopmeter__ttft_s=0.3,
            hopmeter__findings="stall",
        ),
        hop_span(TRACE, EDGE, hop=None, **{"http.route": "/x"}),
    ]
    origin, foreign = decode_request(request_of(spans, service="hm").SerializeToString())
    assert (origin.trace_id, origin.span_id, origin.parent_span_id) == (TRACE, ORIGIN, EDGE)
    assert origin.service == "hm" and origin.start_ns == 1_800_000_000_000_000_000
    assert origin.attrs is not None
    assert origin.attrs["hopmeter.timeline.t_us"] == [300_000, 320_000]
    assert origin.attrs["hopmeter.ttft_s"] == 0.3 and origin.attrs["hopmeter.findings"] == "stall"
    assert foreign.attrs is None and foreign.span_id == EDGE


@pytest.mark.parametrize(
    "values",
    [
        [AnyValue(int_value=3), AnyValue(string_value="4")],  # a string hiding among ints
        [AnyValue(int_value=3), AnyValue()],  # an empty value
        [AnyValue(int_value=5), AnyValue(int_value=4)],  # falling
        [AnyValue(int_value=-1), AnyValue(int_value=4)],  # negative
        [AnyValue(int_value=2**40), AnyValue(double_value=2.5)],
        [AnyValue(bool_value=False), AnyValue(int_value=5)],  # a bool reads as int 0
        [AnyValue(bool_value=True), AnyValue(int_value=5)],
        [AnyValue(string_value=""), AnyValue(int_value=5)],  # so does an empty string
        [AnyValue(), AnyValue(), AnyValue(int_value=7)],  # and nothing at all
        [AnyValue(int_value=0), AnyValue(bytes_value=b""), AnyValue(int_value=1)],
    ],
)
def test_arrays_that_are_not_rising_ints_are_read_exactly(values: list[AnyValue]) -> None:
    """The fast path for timelines never turns a non-int element into an int."""
    span = hop_span(TRACE, EDGE)
    span.attributes.append(
        KeyValue(key="odd", value=AnyValue(array_value=ArrayValue(values=values)))
    )
    (view,) = decode_request(request_of([span]).SerializeToString())
    assert view.attrs is not None
    expected = [
        getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None for v in values
    ]
    assert view.attrs["odd"] == expected


def test_a_timeline_of_booleans_or_empty_strings_is_malformed_as_in_json() -> None:
    """`[false, 5]` or `["", 5]` as a timeline array is refused over protobuf as it is over
    JSON, never read as `[0, 5]`."""
    for first in (AnyValue(bool_value=False), AnyValue(string_value="")):
        span = hop_span(TRACE, EDGE, t_us=[1, 5], offsets=[1, 5])
        for kv in span.attributes:
            if kv.key == "hopmeter.timeline.t_us":
                kv.value.array_value.values[0].CopyFrom(first)
        (view,) = decode_request(request_of([span]).SerializeToString())
        assert read_span(view) is SpanOutcome.MALFORMED


def test_large_rising_ints_take_the_fast_path_exactly() -> None:
    """Values across every varint size come back as they were sent."""
    values = [0, 1, 127, 128, 16_383, 16_384, 2**21, 2**28, 2**35, 2**42, 2**49, 2**56, 2**62]
    span = hop_span(TRACE, EDGE, t_us=values, offsets=values)
    (view,) = decode_request(request_of([span]).SerializeToString())
    assert view.attrs is not None and view.attrs["hopmeter.timeline.t_us"] == values


def test_garbage_is_an_otlp_error() -> None:
    """Bytes that are no protobuf trace export raise OtlpError (a 400)."""
    with pytest.raises(OtlpError, match="not a protobuf trace export"):
        decode_request(b"\xff\xff\xff\xff")


def test_files_framed_or_bare_read_alike() -> None:
    """The file exporter's length-framed messages and one bare message give the same spans."""
    one = request_of([hop_span(TRACE, EDGE)]).SerializeToString()
    two = request_of([hop_span(TRACE, ORIGIN, parent=EDGE)]).SerializeToString()
    framed = b"".join(struct.pack(">I", len(m)) + m for m in (one, two))
    assert [s.span_id for s in decode_file(framed)] == [EDGE, ORIGIN]
    assert [s.span_id for s in decode_file(one)] == [EDGE]


def test_a_cut_framed_file_names_where() -> None:
    """A framed file whose last message is cut says so rather than reading half of it."""
    one = request_of([hop_span(TRACE, EDGE)]).SerializeToString()
    with pytest.raises(OtlpError, match="cut short"):
        decode_file(struct.pack(">I", len(one)) + one + struct.pack(">I", 999) + b"\x0a")


def test_responses_report_rejected_spans_only_when_there_are_some() -> None:
    """Full success leaves partial_success unset (the spec); rejections fill it, in either
    encoding."""
    assert (
        ExportTraceServiceResponse.FromString(export_response(0, "", json=False)).HasField(
            "partial_success"
        )
        is False
    )
    assert export_response(0, "", json=True) == b"{}"
    partial = ExportTraceServiceResponse.FromString(
        export_response(3, "bad", json=False)
    ).partial_success
    assert (partial.rejected_spans, partial.error_message) == (3, "bad")
    assert orjson.loads(export_response(3, "bad", json=True)) == {
        "partialSuccess": {"rejectedSpans": "3", "errorMessage": "bad"}
    }


def test_status_bodies_are_google_rpc_status() -> None:
    """A failure's body is a google.rpc.Status in protobuf, or its JSON form."""
    status = Status.FromString(status_body(3, "no", json=False))
    assert (status.code, status.message) == (3, "no")
    assert orjson.loads(status_body(3, "no", json=True)) == {"code": 3, "message": "no"}
