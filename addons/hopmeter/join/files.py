"""Files `hopmeter join` reads, told apart by their content: records, OTLP JSON or OTLP protobuf.

- flow records: JSON lines whose first object has `"schema": "hopmeter.flow/1"`;
- OTLP JSON: one `{"resourceSpans": [...]}` per line (the Collector's file exporter), or one
  document, or a list of them (trace backends' exports: Tempo, Jaeger; hopmeter.core.otlp_json);
- OTLP protobuf: the file exporter's `format: proto` (a length before each message), or one
  message (needs the `otel` extra).
Spans become the fields of a flow record a join reads (hopmeter.core.spans.span_record), so the
join is the same from either.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from hopmeter.core import otlp_json
from hopmeter.core.record import SCHEMA
from hopmeter.core.spans import SpanView, span_record
from hopmeter.core.vocab import SpanOutcome
from hopmeter.errors import HopmeterError, OtlpError, UsageError
from hopmeter.export.records import record_lines

OTEL_EXTRA = "pip install 'hopmeter[otel]'"


def read_flows(
    paths: Iterable[str], skipped: Counter[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The flow records in `paths`, from records or spans; spans that give none are counted."""
    for path in paths:
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise HopmeterError(f"cannot read {path}: {exc.strerror}") from None
        try:
            yield from _flows(data, path, skipped if skipped is not None else Counter())
        except OtlpError as exc:
            raise HopmeterError(f"{path} is neither flow records nor OTLP traces: {exc}") from None


def _flows(data: bytes, path: str, skipped: Counter[str]) -> Iterator[dict[str, Any]]:
    head = data.lstrip()[:1]
    if not head:
        return
    if head not in (b"{", b"["):
        yield from _records_of(_protobuf(data), skipped)
        return
    first = data.lstrip().split(b"\n", 1)[0]
    try:
        doc = orjson.loads(first)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
        yield from record_lines(data, path)
        return
    yield from _records_of(_json_spans(data), skipped)


def _json_spans(data: bytes) -> Iterator[SpanView]:
    """Spans of one JSON document (or a list of them), else of JSON lines."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = None
    if doc is not None:
        for one in doc if isinstance(doc, list) else [doc]:
            yield from otlp_json.decode_document(one)
        return
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield from otlp_json.decode_document(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise OtlpError(f"line {n} is not JSON") from None
        except OtlpError as exc:
            raise OtlpError(f"line {n}: {exc}") from None


def _protobuf(data: bytes) -> list[SpanView]:
    try:
        from hopmeter.join import otlp  # noqa: PLC0415 - the otel extra, only for protobuf
    except ImportError:
        raise UsageError(
            f"reading OTLP protobuf needs the OpenTelemetry extra: {OTEL_EXTRA}"
        ) from None
    return otlp.decode_file(data)


def _records_of(spans: Iterable[SpanView], skipped: Counter[str]) -> Iterator[dict[str, Any]]:
    for view in spans:
        record = span_record(view)
        if isinstance(record, SpanOutcome):
            skipped[record] += 1
        else:
            yield record
