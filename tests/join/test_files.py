"""Files `hopmeter join` reads, told apart by content: records, OTLP JSON, OTLP protobuf."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import orjson
import pytest

from hopmeter.errors import HopmeterError
from hopmeter.join.files import read_flows
from tests.harness.otlp import hop_span, request_of, to_otlp_json

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
EDGE = bytes.fromhex("00f067aa0ba902b7")
ORIGIN = bytes.fromhex("b7ad6b7169203331")
REQUEST = request_of(
    [
        hop_span(TRACE, EDGE),
        hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE),
        hop_span(TRACE, b"\x09" * 8, hop=None),
    ]
)


def write(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


def hops(paths: list[str]) -> list[str]:
    return [rec["hop"] for rec in read_flows(paths)]


def test_every_form_of_the_same_spans_gives_the_same_flows(tmp_path: Path) -> None:
    """JSON lines, one JSON document, a list of documents, framed and bare protobuf."""
    doc = to_otlp_json(REQUEST)
    message = REQUEST.SerializeToString()
    forms = {
        "lines.jsonl": orjson.dumps(doc) + b"\n\n",
        "pretty.json": orjson.dumps(doc, option=orjson.OPT_INDENT_2),
        "list.json": orjson.dumps([doc]),
        "framed.pb": struct.pack(">I", len(message)) + message,
        "bare.pb": message,
    }
    for name, data in forms.items():
        assert hops([write(tmp_path, name, data)]) == ["edge", "origin"], name


def test_records_are_read_as_records(tmp_path: Path) -> None:
    """A records file passes through, other schemas skipped, next to a file of spans."""
    rec = {"schema": "hopmeter.flow/1", "hop": "solo", "trace_id": "ab" * 16}
    records = write(tmp_path, "r.jsonl", orjson.dumps(rec) + b"\n" + b'{"schema": "other"}\n')
    spans = write(tmp_path, "s.jsonl", orjson.dumps(to_otlp_json(REQUEST)))
    assert hops([records, spans]) == ["solo", "edge", "origin"]


def test_spans_that_give_no_flow_are_counted(tmp_path: Path) -> None:
    """Foreign spans are counted by outcome, not read as flows."""
    skipped: Counter[str] = Counter()
    list(read_flows([write(tmp_path, "s.jsonl", orjson.dumps(to_otlp_json(REQUEST)))], skipped))
    assert skipped == {"foreign": 1}


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"resourceSpans": 3}', "resourceSpans is not a list"),
        (b'{"a": 1}\n{"resourceSpans": []}\n', "no resourceSpans"),
        (b'{"resourceSpans": []}\n{oops\n', "line 2 is not JSON"),
        (b"\x00\x00\x00\x09abc", "cut short"),
    ],
)
def test_unreadable_files_are_named(tmp_path: Path, data: bytes, why: str) -> None:
    """A file that is neither records nor traces is one error naming it and the problem."""
    path = write(tmp_path, "bad", data)
    with pytest.raises(
        HopmeterError, match=f"{path} is neither flow records nor OTLP traces: .*{why}"
    ):
        list(read_flows([path]))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    """A path that cannot be read says which and why."""
    with pytest.raises(HopmeterError, match=r"cannot read .*nope: No such file"):
        list(read_flows([str(tmp_path / "nope")]))
