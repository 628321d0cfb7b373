"""Records as JSON lines: read_records reads them back (hopmeter.export.outlets writes them)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from hopmeter.errors import HopmeterError
from hopmeter.export.records import read_records

ONE = b'{"schema":"hopmeter.flow/1","flow_id":"a"}\n'
TWO = b'{"schema":"hopmeter.flow/1","flow_id":"b"}\n'


def test_read_keeps_only_flow_records_in_file_order(tmp_path: Path) -> None:
    """Reading yields every hopmeter.flow/1 record of each file in order, and skips blank lines,
    other schemas and JSON that is not an object."""
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    first.write_bytes(ONE + b"\n   \n" + b'{"schema":"other/1","flow_id":"x"}\n' + b"[1, 2]\n")
    second.write_bytes(b'{"flow_id":"no schema"}\r\n' + TWO.rstrip(b"\n"))  # no final newline
    got = list(read_records([str(first), str(second)]))
    assert [r["flow_id"] for r in got] == ["a", "b"]


def test_a_line_that_is_not_json_names_its_file_and_line(tmp_path: Path) -> None:
    """A broken line is an error naming file:line (counting blank lines), after the good ones."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(ONE + b"\n" + b'{"schema": "hopmeter.flow/1", "flow_id": \n')
    records = read_records([str(path)])
    assert next(records)["flow_id"] == "a"
    with pytest.raises(HopmeterError, match=rf"^{path}:3 is not a JSON record$"):
        next(records)


def test_an_unreadable_file_is_one_clear_error(tmp_path: Path) -> None:
    """A file that cannot be read is named with the system's reason, without a traceback chain."""
    missing = tmp_path / "none.jsonl"
    with pytest.raises(HopmeterError) as caught:
        list(read_records([str(missing)]))
    assert str(caught.value) == f"cannot read records from {missing}: No such file or directory"
    assert caught.value.__suppress_context__
    with pytest.raises(HopmeterError, match="Is a directory"):
        list(read_records([str(tmp_path)]))


def test_dash_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "-" reads the records from standard input."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TWO + ONE)))
    assert [r["flow_id"] for r in read_records(["-"])] == ["b", "a"]
