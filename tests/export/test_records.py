"""Records as JSON lines: RecordSink appends and flushes each one, read_records reads them back."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from hopmeter.errors import HopmeterError
from hopmeter.export.records import RecordSink, read_records

ONE = b'{"schema":"hopmeter.flow/1","flow_id":"a"}\n'
TWO = b'{"schema":"hopmeter.flow/1","flow_id":"b"}\n'


def test_each_record_is_on_disk_as_soon_as_it_is_written(tmp_path: Path) -> None:
    """A line written is readable from the file before the sink is closed (a crash loses none)."""
    path = tmp_path / "r.jsonl"
    sink = RecordSink.open(str(path))
    sink.write(ONE)
    assert path.read_bytes() == ONE
    sink.write(TWO)
    assert path.read_bytes() == ONE + TWO
    sink.close()


def test_a_sink_appends_to_what_the_file_holds(tmp_path: Path) -> None:
    """Opening an existing records file adds to it; a restarted proxy keeps the earlier records."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(ONE)
    sink = RecordSink.open(str(path))
    sink.write(TWO)
    sink.close()
    assert path.read_bytes() == ONE + TWO


def test_close_closes_the_file_it_opened(tmp_path: Path) -> None:
    """Closing the sink closes its file: a write after that raises instead of going nowhere."""
    sink = RecordSink.open(str(tmp_path / "r.jsonl"))
    sink.close()
    with pytest.raises(ValueError, match="closed file"):
        sink.write(ONE)


def test_dash_writes_to_stdout_and_leaves_it_open(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """ "-" writes the lines to standard output, and closing the sink only flushes it."""
    sink = RecordSink.open("-")
    sink.write(ONE)
    sink.close()
    assert not sys.stdout.buffer.closed
    assert capsysbinary.readouterr().out == ONE


def test_a_folder_that_does_not_exist_cannot_be_opened(tmp_path: Path) -> None:
    """Opening a path in a missing folder raises the OSError the records option reports."""
    with pytest.raises(FileNotFoundError):
        RecordSink.open(str(tmp_path / "missing" / "r.jsonl"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_an_oserror_at_write() -> None:
    """A write the file cannot take (a full disk) raises OSError from write, not later."""
    sink = RecordSink.open("/dev/full")
    with pytest.raises(OSError, match="No space left"):
        sink.write(ONE)
    with pytest.raises(OSError, match="No space left"):
        sink.close()  # the line is still buffered; the file is closed all the same


def test_read_keeps_only_flow_records_in_file_order(tmp_path: Path) -> None:
    """Reading yields every hopmeter.flow/1 record of each file in order, and skips blank lines,
    other schemas and JSON that is not an object."""
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    first.write_bytes(ONE + b"\n   \n" + b'{"schema":"other/1","flow_id":"x"}\n' + b"[1, 2]\n")
    second.write_bytes(b'{"flow_id":"no schema"}\r\n' + TWO.rstrip(b"\n"))  # no final newline
    got = list(read_records([str(first), str(second)]))
    assert [r["flow_id"] for r in got] == ["a", "b"]


def test_records_written_by_a_sink_read_back(tmp_path: Path) -> None:
    """What a sink writes, read_records returns, as dicts."""
    path = tmp_path / "r.jsonl"
    sink = RecordSink.open(str(path))
    for line in (ONE, TWO):
        sink.write(line)
    sink.close()
    assert list(read_records([str(path)])) == [
        {"schema": "hopmeter.flow/1", "flow_id": "a"},
        {"schema": "hopmeter.flow/1", "flow_id": "b"},
    ]


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
