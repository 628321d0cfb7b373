"""OTLP protobuf for the join: requests and files in as `SpanView`s, responses and statuses out.

The one module of the join that imports opentelemetry-proto (and googleapis-common-protos, which
it depends on), both in the `otel` extra: its importers catch the ImportError and name the install.
Reads a binary `ExportTraceServiceRequest` (OTLP/HTTP `application/x-protobuf`, the OTLP/gRPC
message), the Collector file exporter's `format: proto` files (a 4-byte big-endian length before
each message) and a bare `TracesData` (a trace backend's protobuf download: the same bytes).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator
from operator import le
from typing import Any

import orjson
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from hopmeter.core.spans import HOP_KEY, SpanView
from hopmeter.errors import OtlpError


def decode_request(body: bytes) -> list[SpanView]:
    """The spans of a binary ExportTraceServiceRequest (or TracesData: the same fields)."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except Exception as exc:  # protobuf's DecodeError, and upb's own variants
        raise OtlpError(f"the body is not a protobuf trace export ({exc})") from None
    out: list[SpanView] = []
    for rs in request.resource_spans:
        service = next(
            (kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"), ""
        )
        for ss in rs.scope_spans:
            for s in ss.spans:
                values = {kv.key: kv.value for kv in s.attributes}  # one pass over the wrappers
                out.append(
                    SpanView(
                        trace_id=s.trace_id,
                        span_id=s.span_id,
                        parent_span_id=s.parent_span_id,
                        name=s.name,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        service=service,
                        attrs={k: _value(v) for k, v in values.items()}
                        if HOP_KEY in values
                        else None,
                    )
                )
    return out


def decode_file(data: bytes) -> list[SpanView]:
    """The spans of a protobuf file: length-framed requests, else one bare message."""
    try:
        return [span for message in _framed(data) for span in decode_request(message)]
    except OtlpError as framed:
        try:
            return decode_request(data)
        except OtlpError:
            raise framed from None


def _framed(data: bytes) -> Iterator[bytes]:
    """The messages of the file exporter's proto framing (big-endian uint32 length, message)."""
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise OtlpError(f"a length prefix is cut short at byte {pos}")
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if pos + size > len(data):
            raise OtlpError(f"a message of {size} bytes is cut short at byte {pos}")
        yield data[pos : pos + size]
        pos += size


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return _int_array(v) or [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return None if kind is None else getattr(v, kind)


def _int_array(v: AnyValue) -> list[int] | None:
    """A timeline's fast path: non-negative ints in rising order; None for anything else.

    Reading `int_value` alone costs ~0.5 µs an element; asking each element which value it holds
    doubles that. An element that holds anything but an int (a bool, a string, a double, an
    empty string or nothing) reads as int_value 0, and in a rising run of non-negative values
    the zeros come first: only those are asked what they hold, so `[false, 5]` and `["", 5]`
    are never read as `[0, 5]`, as the JSON path refuses them too.
    """
    array = v.array_value
    values = [x.int_value for x in array.values]
    n = len(values)
    if not n or values[0] < 0 or not all(map(le, values, values[1:])):
        return None
    zeros = bisect_right(values, 0)
    items = array.values
    if any(items[i].WhichOneof("value") != "int_value" for i in range(zeros)):
        return None
    return values


# -- responses ------------------------------------------------------------------------------------
def export_response(rejected: int, message: str, *, json: bool) -> bytes:
    """An ExportTraceServiceResponse; partial_success only when spans were rejected (the spec)."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
        )
    if not json:
        return bytes(response.SerializeToString())
    if not rejected:
        return b"{}"
    return orjson.dumps(
        {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}
    )


def status_body(grpc_code: int, message: str, *, json: bool) -> bytes:
    """A google.rpc.Status, the body of an OTLP/HTTP failure, in the request's encoding."""
    if json:
        return orjson.dumps({"code": grpc_code, "message": message})
    return bytes(Status(code=grpc_code, message=message).SerializeToString())
