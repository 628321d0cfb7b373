"""`hopmeter join`: records of one trace joined into segments, and the same pairs and holds from
records and from OTLP files of the same flows."""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopmeter.core.fingerprint import fingerprint
from hopmeter.errors import UsageError
from hopmeter.report import join as join_command
from hopmeter.report.join import join
from tests.harness.otlp import exported, to_otlp_json
from tests.harness.procs import HOPMETER
from tests.report.literal import EDGE, ORIGIN, T0, flow


def _write(path: Path, *records: dict[str, Any]) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hopmeter")
    join_command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["join", *argv])


def test_two_records_of_a_trace_make_one_segment() -> None:
    """An edge's and an origin's records of one trace join into the segment between them, with
    its holds measured token by token."""
    (entry,) = join([ORIGIN, EDGE])
    assert entry["trace_id"] == "t1"
    (segment,) = entry["hops"]
    assert segment["segment"] == "edge>origin"
    assert segment["inner_hop"] == "origin"
    assert segment["tokens_aligned"] == 3
    assert segment["first_token_hold_s"] == pytest.approx(0.399)
    assert (segment["hold_p50_s"], segment["hold_max_s"]) == pytest.approx((0.299, 0.399))
    assert segment["whole_body"] is False


def test_three_hops_make_two_segments_outermost_first() -> None:
    """A trace seen at three hops has two segments, in request order whatever the input order."""
    inner = flow("model", T0 + 0.002, [[0.09, 1, 5], [0.19, 1, 9], [0.29, 1, 14]], parent="origin")
    (entry,) = join([inner, EDGE, ORIGIN])
    assert [s["segment"] for s in entry["hops"]] == ["edge>origin", "origin>model"]


def test_traces_seen_once_or_without_events_are_dropped() -> None:
    """A trace with one record, a record without a trace id and one without events join nothing."""
    lone = flow("edge", T0, [[0.1, 1, 3]], trace="t2")
    untraced = {**flow("edge", T0, [[0.1, 1, 3]]), "trace_id": None}
    no_events = {**flow("origin", T0, []), "trace_id": "t3", "events": None}
    edge3 = flow("edge", T0, [[0.1, 1, 3]], trace="t3")
    assert join([lone, untraced, no_events, edge3, ORIGIN]) == []


def test_run_prints_a_line_per_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`hopmeter join` reads the hosts' files and prints one line per segment, holds in ms."""
    edge = _write(tmp_path / "edge.jsonl", EDGE)
    origin = _write(tmp_path / "origin.jsonl", ORIGIN)
    assert join_command.run(_args(edge, origin)) == 0
    assert capsys.readouterr().out == (
        "t1 edge>origin first_token_hold=399.0ms p50=299.0ms p99=399.0ms max=399.0ms "
        "inner_p99=- wire_p99=- whole_body=no skew=0.0ms findings=- request_delay=1.0ms "
        "paired_by=trace order=link\n"
    )


def test_run_json_prints_an_object_per_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --json each joined trace is one JSON line, the same entry join() returns."""
    path = _write(tmp_path / "both.jsonl", ORIGIN, EDGE)
    assert join_command.run(_args("--json", path)) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert orjson.loads(line) == orjson.loads(orjson.dumps(join([ORIGIN, EDGE])[0]))


def test_run_fails_when_nothing_joined(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Records that share no trace between hops exit 1 with one line saying so on stderr, and
    what a larger --max-skew would pair (hosts whose clocks differ past it)."""
    path = _write(tmp_path / "edge.jsonl", EDGE)
    assert join_command.run(_args(path)) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("hopmeter join: no trace was seen at two hops; records whose")
    assert "within --max-skew (" in out.err and out.err.count("\n") == 1


# -- OTLP files ------------------------------------------------------------------------------


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


@pytest.mark.integration
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
            "span_id": hop,
            "parent_span_id": "edge" if hop == "origin" else None,
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


def _reply(rec: dict[str, Any], trace: str, text: str = "fourteen chars") -> dict[str, Any]:
    """`rec` under its own trace id (a gateway dropped it), carrying `text`'s fingerprint."""
    fp = fingerprint(text, len(text))
    assert fp is not None
    last = rec["request"]["t_start"] + rec["events"][-1][0]
    return {
        **rec,
        "trace_id": trace,
        "span_id": f"{trace}-span",
        "parent_span_id": None,  # the gateway's own trace: no link to the other hop
        "flow_id": f"{trace}-{rec['hop']}",
        "fingerprint": fp.as_dict(),
        "response": {**rec["response"], "t_last_byte": last},
    }


def test_a_dropped_trace_joins_by_content_with_the_same_holds() -> None:
    """Edge and origin records with different trace ids but one reply join as one request,
    paired by content, with the holds the shared trace gives, and the segment says a hop
    between them dropped the trace context (as the live pairing says it in the record)."""
    by_trace = join([ORIGIN, EDGE])[0]["hops"][0]
    (entry,) = join([_reply(ORIGIN, "o1"), _reply(EDGE, "e1")], order=("edge", "origin"))
    assert entry["trace_id"] == "e1" and entry["paired_by"] == "content"
    assert entry["flow_ids"] == ["e1-edge", "o1-origin"]
    (seg,) = entry["hops"]
    assert seg["paired_by"] == "content" and seg["inner_flow_id"] == "o1-origin"
    assert (seg["order"], by_trace["order"]) == ("declared", "link")
    for key in ("first_token_hold_s", "hold_p50_s", "hold_max_s", "request_delay_s"):
        assert seg[key] == by_trace[key], key
    assert "trace_context_dropped" in [f["kind"] for f in seg["findings"]]
    assert "trace_context_dropped" not in [f["kind"] for f in by_trace["findings"]]


def test_unlinked_hops_take_the_order_linked_traces_show_or_none() -> None:
    """Flows paired by content with nothing else in the input are reported unordered (no holds,
    a segment_unordered finding); a linked trace of the same hops in the same input puts them
    in its order; the clocks (here the origin's, 2 s early) never do."""
    early = {**ORIGIN, "request": {**ORIGIN["request"], "t_start": T0 - 2.0}}
    pair = [_reply(early, "o1"), _reply(EDGE, "e1")]
    (alone,) = join(pair, 3.0)
    (seg,) = alone["hops"]
    assert (seg["segment"], seg["order"], seg["hold_p50_s"]) == ("edge~origin", "unknown", None)
    kinds = [f["kind"] for f in seg["findings"]]
    assert kinds == ["segment_unordered", "trace_context_dropped"]  # paired by content, too
    linked = [flow("edge", T0 + 10, EDGE["events"], trace="t9"), {**ORIGIN, "trace_id": "t9"}]
    linked[1]["request"] = {**ORIGIN["request"], "t_start": T0 + 10.001}
    linked[1]["parent_span_id"] = linked[0]["span_id"]
    entries = join([*pair, *linked], 3.0)
    learned = next(e for e in entries if e["trace_id"] == "e1")["hops"][0]
    assert (learned["segment"], learned["order"]) == ("edge>origin", "learned")


@pytest.mark.integration
@pytest.mark.parametrize("value", ["edge", "edge,", "edge,edge"])
def test_a_bad_order_is_one_line(value: str) -> None:
    """--order takes two or more distinct hop names; anything else is one line, exit 2."""
    out = subprocess.run(
        [*HOPMETER, "join", "--order", value, "x.jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "outermost first, e.g. edge,origin" in out.stderr
    assert "Traceback" not in out.stderr


def test_identical_replies_at_once_join_nothing_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two edge and two origin records of one reply at the same time: nothing is joined, and a
    line on stderr counts the flows left unpaired as ambiguous."""
    later = {**ORIGIN, "request": {**ORIGIN["request"], "t_start": T0 + 0.002}}
    recs = [_reply(EDGE, "e1"), _reply(EDGE, "e2"), _reply(ORIGIN, "o1"), _reply(later, "o2")]
    assert join(recs) == []
    path = _write(tmp_path / "all.jsonl", *recs)
    assert join_command.run(_args(path)) == 1
    err = capsys.readouterr().err
    assert "4 flows carried a reply that several others at another hop carried" in err
    assert "within --max-skew (1s)" in err


def test_max_skew_bounds_how_far_windows_may_disagree(tmp_path: Path) -> None:
    """An origin host whose clock runs 2 s ahead pairs by content only with --max-skew 3; a
    negative skew is refused in one line."""
    ahead = {**ORIGIN, "request": {**ORIGIN["request"], "t_start": T0 + 2.001}}
    recs = [_reply(EDGE, "e1"), _reply(ahead, "o1")]
    assert join(recs) == []
    assert len(join(recs, 3.0)) == 1
    path = _write(tmp_path / "r.jsonl", *recs)
    with pytest.raises(UsageError, match="--max-skew must be 0 or more"):
        join_command.run(_args("--max-skew", "-1", path))
