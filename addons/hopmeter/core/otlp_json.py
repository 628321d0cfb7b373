"""OTLP JSON trace documents to `SpanView`s: what exporters, Collectors and trace backends write.

The OTLP JSON encoding (opentelemetry-proto docs/specification.md, "JSON Protobuf Encoding") is
proto3's JSON mapping with hex trace and span ids, integer enums and lowerCamelCase keys; unknown
fields are ignored. Read liberally, as the Collector's own decoder does:
- snake_case keys too; ids in hex or base64 (Tempo's /api/traces writes base64), told apart by
  length; 64-bit integers as decimal strings or numbers; "NaN"/"Infinity" doubles;
- the wrappers `resourceSpans` (OTLP, the Collector's file exporter: one request per line),
  `batches` (Tempo v1), `trace` (Tempo v2), `result` (Jaeger api/v3 through its gateway);
- Jaeger's v1 model (`{"data": [{"spans": [...]}]}`, its UI's "Download JSON"), where array
  attributes arrive as string tags holding their JSON text.

Only hopmeter spans (those with `hopmeter.hop`) have their attributes read.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

import orjson

from hopmeter.core.spans import HOP_KEY, SPAN_ID_BYTES, TRACE_ID_BYTES, SpanView
from hopmeter.errors import OtlpError

_NON_FINITE = ("NaN", "Infinity", "-Infinity")
_DECIMAL = re.compile(r"-?[0-9]{1,20}")  # proto3 JSON's int64 string: ASCII digits only


def decode_document(doc: object) -> list[SpanView]:
    """The spans of one parsed OTLP JSON document (any of the shapes in the module doc)."""
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        return _jaeger_v1(doc["data"])
    out: list[SpanView] = []
    for rs in _resource_spans(doc):
        if not isinstance(rs, dict):
            raise OtlpError("a resourceSpans entry is not an object")
        resource = _attributes((rs.get("resource") or {}).get("attributes"))
        service = str(resource.get("service.name") or "")
        scopes = _get(rs, "scopeSpans", "scope_spans")
        if scopes is None:  # before OTLP 0.19: instrumentation library spans
            scopes = _get(rs, "instrumentationLibrarySpans", "instrumentation_library_spans")
        for ss in _list(scopes, "scopeSpans"):
            spans = ss.get("spans") if isinstance(ss, dict) else None
            out.extend(_span(s, service) for s in _list(spans, "spans"))
    return out


def decode_body(body: bytes) -> list[SpanView]:
    """The spans of an OTLP/HTTP JSON request body."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"the body is not JSON ({exc})") from None
    return decode_document(doc)


def _span(s: object, service: str) -> SpanView:
    if not isinstance(s, dict):
        raise OtlpError("a span is not an object")
    kvs = s.get("attributes")
    start = _get(s, "startTimeUnixNano", "start_time_unix_nano")
    end = _get(s, "endTimeUnixNano", "end_time_unix_nano")
    return SpanView(
        trace_id=_id(_get(s, "traceId", "trace_id"), TRACE_ID_BYTES, "traceId"),
        span_id=_id(_get(s, "spanId", "span_id"), SPAN_ID_BYTES, "spanId"),
        parent_span_id=_id(
            _get(s, "parentSpanId", "parent_span_id"), SPAN_ID_BYTES, "parentSpanId"
        ),
        name=str(s.get("name") or ""),
        start_ns=_int(start or 0, "startTimeUnixNano"),
        end_ns=_int(end or 0, "endTimeUnixNano"),
        service=service,
        attrs=_attributes(kvs) if _has_hop(kvs) else None,
    )


def _resource_spans(doc: object) -> list[Any]:
    if not isinstance(doc, dict):
        raise OtlpError("the JSON document is not an object")
    for key in ("resourceSpans", "resource_spans", "batches"):
        if key in doc:
            return _list(doc[key], key)
    for wrapper in ("trace", "result"):  # Tempo /api/v2/traces; Jaeger api/v3 via grpc-gateway
        if isinstance(doc.get(wrapper), dict):
            return _resource_spans(doc[wrapper])
    if not doc:
        return []  # an empty request is a valid, empty export
    raise OtlpError("no resourceSpans in the JSON document")


def _list(value: object, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpError(f"{name} is not a list")
    return value


def _get(d: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = d.get(camel)
    return d.get(snake) if value is None else value


def _id(value: object, size: int, name: str) -> bytes:
    """A trace or span id in hex (OTLP JSON) or base64 (proto3 JSON); "" or none is empty."""
    if value is None or value == "":
        return b""
    if not isinstance(value, str):
        raise OtlpError(f"{name} is not a string")
    try:
        raw = (
            bytes.fromhex(value)
            if len(value) == 2 * size
            else base64.b64decode(value, validate=True)
        )
    except (ValueError, binascii.Error):
        raise OtlpError(f"{name} {value[:40]!r} is neither hex nor base64") from None
    if len(raw) != size:
        raise OtlpError(f"{name} is {len(raw)} bytes, not {size}")
    return raw


def _int(value: object, name: str) -> int:
    """A proto3 JSON 64-bit integer: a decimal string or a whole number."""
    if isinstance(value, bool):
        raise OtlpError(f"{name} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    raise OtlpError(f"{name} {str(value)[:40]!r} is not an integer")


def _double(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if value in _NON_FINITE:
        return float(str(value))
    raise OtlpError(f"doubleValue {str(value)[:40]!r} is not a number")


def _value(v: object) -> Any:
    """An AnyValue."""
    if not isinstance(v, dict):
        raise OtlpError("an attribute value is not an AnyValue object")
    for key, raw in v.items():
        if key in ("stringValue", "string_value"):
            return raw
        if key in ("intValue", "int_value"):
            return _int(raw, "intValue")
        if key in ("doubleValue", "double_value"):
            return _double(raw)
        if key in ("boolValue", "bool_value"):
            return bool(raw)
        if key in ("arrayValue", "array_value"):
            values = _list((raw or {}).get("values") if isinstance(raw, dict) else raw, "values")
            return _int_array(values) or [_value(x) for x in values]
        if key in ("kvlistValue", "kvlist_value"):
            values = _list((raw or {}).get("values") if isinstance(raw, dict) else raw, "values")
            return _attributes(values)
        if key in ("bytesValue", "bytes_value"):
            try:
                return base64.b64decode(str(raw))
            except binascii.Error:
                raise OtlpError("bytesValue is not base64") from None
    return None  # an empty AnyValue


def _int_array(values: list[Any]) -> list[int] | None:
    """A timeline's fast path: every element {"intValue": "123"}; None for anything else."""
    try:
        raw = [x["intValue"] for x in values]
    except (KeyError, TypeError):
        return None
    if all(type(v) is str and v.isascii() and v.isdigit() for v in raw):
        return [int(v) for v in raw]
    return None


def _attributes(kvs: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _list(kvs, "attributes"):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise OtlpError("an attribute is not a {key, value} object")
        out[kv["key"]] = _value(kv.get("value") or {})
    return out


def _has_hop(kvs: object) -> bool:
    return isinstance(kvs, list) and any(
        isinstance(kv, dict) and kv.get("key") == HOP_KEY for kv in kvs
    )


# -- Jaeger's v1 model ----------------------------------------------------------------------------
def _jaeger_tag(tag: Mapping[str, Any]) -> Any:
    value, kind = tag.get("value"), tag.get("type")
    if kind == "int64":
        return _int(value, "int64 tag")
    if kind == "float64":
        return _double(value)
    if kind == "bool":
        return bool(value)
    if isinstance(value, str) and value[:1] == "[" and str(tag.get("key")).startswith("hopmeter."):
        try:  # Jaeger's OTLP translator turns array attributes into their JSON text
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _jaeger_v1(traces: list[Any]) -> list[SpanView]:
    out: list[SpanView] = []
    for trace in traces:
        if not isinstance(trace, dict):
            raise OtlpError("a Jaeger trace is not an object")
        processes = trace.get("processes") or {}
        for s in _list(trace.get("spans"), "spans"):
            if not isinstance(s, dict):
                raise OtlpError("a Jaeger span is not an object")
            tags = {t.get("key"): _jaeger_tag(t) for t in _list(s.get("tags"), "tags")}
            parent = next(
                (
                    _id(str(ref.get("spanID", "")).rjust(16, "0"), SPAN_ID_BYTES, "spanID")
                    for ref in _list(s.get("references"), "references")
                    if isinstance(ref, dict) and ref.get("refType") == "CHILD_OF"
                ),
                b"",
            )
            process = processes.get(s.get("processID")) or s.get("process") or {}
            start_us = _int(s.get("startTime") or 0, "startTime")
            out.append(
                SpanView(
                    trace_id=_id(str(s.get("traceID", "")).rjust(32, "0"), 16, "traceID"),
                    span_id=_id(str(s.get("spanID", "")).rjust(16, "0"), 8, "spanID"),
                    parent_span_id=parent,
                    name=str(s.get("operationName") or ""),
                    start_ns=start_us * 1000,
                    end_ns=(start_us + _int(s.get("duration") or 0, "duration")) * 1000,
                    service=str(process.get("serviceName") or ""),
                    attrs=tags if HOP_KEY in tags else None,
                )
            )
    return out
