"""`hopmeter join`: the same pairs and holds from records and from OTLP files of the same flows."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopmeter.report.join import join
from tests.harness.otlp import exported, to_otlp_json
from tests.harness.procs import HOPMETER


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _join(*paths: Path) -> tuple[int, list[dict[str, Any]], str]:
    out = subprocess.run(
        [*HOPMETER, "join", "--json", *map(str, paths)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    lines = [orjson.loads(line) for line in out.stdout.splitlines()]
    return out.returncode, lines, out.stderr.decode()


def test_records_and_otlp_files_give_the_same_pairs_and_holds(
    held_path: Path, tmp_path: Path
) -> None:
    """Real two-hop records, their spans as the Collector's file exporter writes them (JSON
    lines, framed protobuf) and as one backend document: `hopmeter join` says the same."""
    records = _records(held_path)
    request = exported(records)
    json_lines = tmp_path / "spans.jsonl"  # the file exporter's `format: json`: a request a line
    half = len(request.resource_spans[0].scope_spans[0].spans) // 2
    first, second = request.__class__(), request.__class__()
    first.CopyFrom(request)
    second.CopyFrom(request)
    del first.resource_spans[0].scope_spans[0].spans[half:]
    del second.resource_spans[0].scope_spans[0].spans[:half]
    json_lines.write_bytes(b"".join(orjson.dumps(to_otlp_json(r)) + b"\n" for r in (first, second)))
    framed = tmp_path / "spans.pb"  # `format: proto`: a big-endian length before each message
    framed.write_bytes(
        b"".join(
            struct.pack(">I", len(m)) + m
            for m in (first.SerializeToString(), second.SerializeToString())
        )
    )
    document = tmp_path / "trace.json"  # a backend's download: one pretty-printed document
    document.write_bytes(
        orjson.dumps(
            {"batches": to_otlp_json(request)["resourceSpans"]}, option=orjson.OPT_INDENT_2
        )
    )
    status, from_records, _ = _join(held_path)
    assert status == 0 and len(from_records) == 2
    for path in (json_lines, framed, document):
        status, from_spans, err = _join(path)
        assert status == 0, err
        assert from_spans == from_records, path.name


def test_join_entries_name_their_schema_and_segments() -> None:
    """Each joined trace is a `hopmeter.join/1` object with one entry per segment."""

    def rec(hop: str, t0: float, first: float) -> dict[str, Any]:
        return {
            "trace_id": "ab" * 16,
            "hop": hop,
            "request": {"t_start": t0},
            "events": [[first + i * 0.1, 1, 4 * (i + 1)] for i in range(5)],
            "figures": {},
            "findings": [],
        }

    (entry,) = join([rec("origin", 10.001, 0.1), rec("edge", 10.0, 0.102), {"trace_id": "cd" * 16}])
    assert entry["schema"] == "hopmeter.join/1" and entry["trace_id"] == "ab" * 16
    (seg,) = entry["hops"]
    assert seg["segment"] == "edge>origin" and seg["tokens_aligned"] == 5


def test_spans_without_a_timeline_are_named_when_nothing_joins(tmp_path: Path) -> None:
    """Spans exported with the timeline off cannot be joined; join says so and exits 1."""
    records = [
        {
            "schema": "hopmeter.flow/1",
            "trace_id": "ab" * 16,
            "span_id": f"{i:016x}",
            "hop": hop,
            "request": {"t_start": 1_800_000_000.0 + i / 1000},
            "response": {"status": 200, "ended": "complete"},
            "events": [[0.1, 1, 4]],
            "figures": {},
            "findings": [],
        }
        for i, hop in enumerate(("edge", "origin"), 1)
    ]
    path = tmp_path / "spans.jsonl"
    path.write_bytes(orjson.dumps(to_otlp_json(exported(records, timeline=False))) + b"\n")
    status, lines, err = _join(path)
    assert (status, lines) == (1, [])
    assert "no trace was seen at two hops (spans left out: 2 no_timeline)" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give the files to join"),
        (["--serve", "x.jsonl"], "--serve receives spans over OTLP: give it no files"),
        (["--serve", "--listen", "nowhere:port"], "--listen 'nowhere:port': expected HOST:PORT"),
        (["--serve", "--window", "0"], "must be above 0"),
        (
            ["--serve", "--metrics", "off", "--records", "/nonexistent/dir/joined.jsonl"],
            "cannot write joined records to /nonexistent/dir/joined.jsonl: No such file",
        ),
    ],
)
def test_bad_join_command_lines_are_one_line(args: list[str], message: str) -> None:
    """A join command line that cannot work is one line on stderr naming the fix, exit 2."""
    out = subprocess.run(
        [*HOPMETER, "join", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_file_that_is_neither_is_one_line(tmp_path: Path) -> None:
    """A JSON file that is neither records nor OTLP is named, with what is wrong in it."""
    path = tmp_path / "other.json"
    path.write_bytes(b'{"hello": "world"}\n')
    out = subprocess.run(
        [*HOPMETER, "join", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2
    why = "no resourceSpans in the JSON document"
    assert out.stderr.strip() == f"hopmeter: {path} is neither flow records nor OTLP traces: {why}"


def test_without_the_otel_extra_records_and_json_join_and_serve_names_the_install(
    held_path: Path, tmp_path: Path
) -> None:
    """With opentelemetry unimportable, records and OTLP JSON still join, and --serve and
    protobuf files are one line naming `pip install 'hopmeter[otel]'`."""
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(orjson.dumps(to_otlp_json(exported(_records(held_path)))) + b"\n")
    framed = tmp_path / "spans.pb"
    framed.write_bytes(b"\x00\x00\x00\x00")
    code = (
        "import sys\n"
        "for m in ('opentelemetry', 'opentelemetry.proto', 'google.rpc'):\n"
        "    sys.modules[m] = None\n"
        "from hopmeter.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, "join", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    assert run(str(held_path)).returncode == 0
    assert run(str(spans)).returncode == 0
    for args in (["--serve", "--metrics", "off"], [str(framed)]):
        out = run(*args)
        assert out.returncode == 2, out.stderr
        assert "pip install 'hopmeter[otel]'" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
