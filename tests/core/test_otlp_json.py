"""OTLP JSON documents of every shape exporters, Collectors and backends write, read to spans."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from hopmeter.core.otlp_json import decode_body, decode_document
from hopmeter.errors import OtlpError

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = "b7ad6b7169203331"


def ints(*values: int) -> dict[str, Any]:
    return {"arrayValue": {"values": [{"intValue": str(v)} for v in values]}}


def span(**over: Any) -> dict[str, Any]:
    """One OTLP JSON hopmeter span, as the Collector's file exporter writes it."""
    doc: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": SPAN,
        "parentSpanId": PARENT,
        "name": "hopmeter origin POST /v1/chat/completions",
        "kind": 2,
        "startTimeUnixNano": "1800000000250000000",
        "endTimeUnixNano": "1800000001250000000",
        "attributes": [
            {"key": "hopmeter.hop", "value": {"stringValue": "origin"}},
            {"key": "hopmeter.ttft_s", "value": {"doubleValue": 0.3}},
            {"key": "hopmeter.stalls", "value": {"intValue": "0"}},
            {"key": "hopmeter.timeline.t_us", "value": ints(300000, 320000)},
            {"key": "hopmeter.timeline.offset", "value": ints(4, 8)},
            {"key": "hopmeter.timeline.v", "value": {"intValue": "1"}},
        ],
    }
    doc.update(over)
    return doc


def request(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "hm"}}]
                },
                "scopeSpans": [{"scope": {"name": "hopmeter"}, "spans": list(spans)}],
            }
        ]
    }


def test_an_otlp_json_request_reads_to_spans() -> None:
    """Hex ids, string int64s, typed values and integer arrays come out as Python values."""
    (s,) = decode_body(orjson.dumps(request(span())))
    assert (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex()) == (TRACE, SPAN, PARENT)
    assert (s.start_ns, s.end_ns, s.service) == (1800000000250000000, 1800000001250000000, "hm")
    assert s.attrs is not None
    assert s.attrs["hopmeter.timeline.t_us"] == [300000, 320000]
    assert s.attrs["hopmeter.ttft_s"] == 0.3 and s.attrs["hopmeter.stalls"] == 0


def test_foreign_spans_keep_no_attributes() -> None:
    """A span without hopmeter.hop is read for its ids only."""
    foreign = span(attributes=[{"key": "http.route", "value": {"stringValue": "/x"}}])
    (s,) = decode_document(request(foreign))
    assert s.attrs is None and s.span_id.hex() == SPAN


def test_snake_case_base64_ids_and_numbers_are_read_too() -> None:
    """proto3 JSON's original field names, base64 ids and int64s as numbers are accepted."""
    doc = {
        "resource_spans": [
            {
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": base64.b64encode(bytes.fromhex(TRACE)).decode(),
                                "span_id": base64.b64encode(bytes.fromhex(SPAN)).decode(),
                                "start_time_unix_nano": 1800000000250000000,
                                "attributes": [
                                    {"key": "hopmeter.hop", "value": {"string_value": "edge"}},
                                    {"key": "n", "value": {"int_value": 3}},
                                    {"key": "d", "value": {"double_value": "NaN"}},
                                    {"key": "b", "value": {"bool_value": True}},
                                    {"key": "kv", "value": {"kvlist_value": {"values": []}}},
                                    {"key": "raw", "value": {"bytes_value": "AAE="}},
                                    {
                                        "key": "mixed",
                                        "value": {
                                            "array_value": {
                                                "values": [{"int_value": -1}, {"string_value": "a"}]
                                            }
                                        },
                                    },
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    (s,) = decode_document(doc)
    assert s.trace_id.hex() == TRACE and s.span_id.hex() == SPAN and s.parent_span_id == b""
    assert s.attrs is not None
    assert s.attrs["n"] == 3 and s.attrs["b"] is True and s.attrs["kv"] == {}
    assert s.attrs["d"] != s.attrs["d"]  # NaN
    assert s.attrs["raw"] == b"\x00\x01" and s.attrs["mixed"] == [-1, "a"]


@pytest.mark.parametrize(
    "wrap",
    [
        lambda rs: {"batches": rs},  # Tempo /api/traces (v1)
        lambda rs: {"trace": {"resourceSpans": rs}},  # Tempo /api/v2/traces
        lambda rs: {"result": {"resourceSpans": rs}},  # Jaeger api/v3 through its gateway
    ],
)
def test_trace_backends_wrappers_are_unwrapped(wrap: Any) -> None:
    """Tempo's and Jaeger's export documents give the same span."""
    (s,) = decode_document(wrap(request(span())["resourceSpans"]))
    assert s.span_id.hex() == SPAN and s.attrs is not None


def test_jaeger_v1_json_tags_and_references_are_read() -> None:
    """Jaeger's UI download: tags (arrays as JSON text), CHILD_OF parents, µs times."""
    doc = {
        "data": [
            {
                "traceID": TRACE,
                "spans": [
                    {
                        "traceID": TRACE,
                        "spanID": SPAN,
                        "operationName": "hopmeter origin POST",
                        "references": [{"refType": "CHILD_OF", "traceID": TRACE, "spanID": PARENT}],
                        "startTime": 1800000000250000,
                        "duration": 1000000,
                        "processID": "p1",
                        "tags": [
                            {"key": "hopmeter.hop", "type": "string", "value": "origin"},
                            {"key": "hopmeter.ttft_s", "type": "float64", "value": 0.3},
                            {"key": "hopmeter.timeline.v", "type": "int64", "value": 1},
                            {
                                "key": "hopmeter.timeline.t_us",
                                "type": "string",
                                "value": "[300000,320000]",
                            },
                            {"key": "hopmeter.timeline.offset", "type": "string", "value": "[4,8]"},
                        ],
                    }
                ],
                "processes": {"p1": {"serviceName": "hm"}},
            }
        ]
    }
    (s,) = decode_document(doc)
    assert s.parent_span_id.hex() == PARENT and s.service == "hm"
    assert s.start_ns == 1800000000250000000 and s.end_ns == 1800000001250000000
    assert s.attrs is not None and s.attrs["hopmeter.timeline.t_us"] == [300000, 320000]


def test_an_empty_request_is_an_empty_export() -> None:
    """`{}` is valid OTLP: no spans."""
    assert decode_document({}) == []


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "not an object"),
        (b'{"foo": 1}', "no resourceSpans"),
        (b'{"resourceSpans": {}}', "is not a list"),
        (orjson.dumps(request(span(traceId="xyz"))), "neither hex nor base64"),
        (orjson.dumps(request(span(spanId="AAAA"))), "3 bytes, not 8"),
        (orjson.dumps(request(span(startTimeUnixNano="1e9"))), "not an integer"),
        (orjson.dumps(request(span(startTimeUnixNano="１２"))), "not an integer"),
        (
            orjson.dumps(
                request(span(attributes=[{"key": "hopmeter.hop", "value": {}}, {"value": {}}]))
            ),
            "key, value",
        ),
        (orjson.dumps(request(span(attributes=[{"key": "hopmeter.hop", "value": 3}]))), "AnyValue"),
    ],
)
def test_malformed_documents_raise_otlp_errors(body: bytes, why: str) -> None:
    """What cannot be a trace export raises OtlpError naming the problem (a 400)."""
    with pytest.raises(OtlpError, match=why):
        decode_body(body)
