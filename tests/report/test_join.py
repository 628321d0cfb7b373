"""`hopmeter join`: records of one trace written by separate hopmeters, joined into segments."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopmeter.core.fingerprint import fingerprint
from hopmeter.errors import UsageError
from hopmeter.report import join as join_command
from hopmeter.report.join import join
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
    inner = flow("model", T0 + 0.002, [[0.09, 1, 5], [0.19, 1, 9], [0.29, 1, 14]])
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
        "whole_body=no skew=0.0ms findings=- request_delay=1.0ms paired_by=trace\n"
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
    """Records that share no trace between hops exit 1 with one line saying so on stderr."""
    path = _write(tmp_path / "edge.jsonl", EDGE)
    assert join_command.run(_args(path)) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "hopmeter join: no trace was seen at two hops\n"


def _reply(rec: dict[str, Any], trace: str, text: str = "fourteen chars") -> dict[str, Any]:
    """`rec` under its own trace id (a gateway dropped it), carrying `text`'s fingerprint."""
    fp = fingerprint(text, len(text))
    assert fp is not None
    last = rec["request"]["t_start"] + rec["events"][-1][0]
    return {
        **rec,
        "trace_id": trace,
        "flow_id": f"{trace}-{rec['hop']}",
        "fingerprint": fp.as_dict(),
        "response": {**rec["response"], "t_last_byte": last},
    }


def test_a_dropped_trace_joins_by_content_with_the_same_holds() -> None:
    """Edge and origin records with different trace ids but one reply join as one request,
    paired by content, with the holds the shared trace gives."""
    by_trace = join([ORIGIN, EDGE])[0]["hops"][0]
    (entry,) = join([_reply(ORIGIN, "o1"), _reply(EDGE, "e1")])
    assert entry["trace_id"] == "e1" and entry["paired_by"] == "content"
    assert entry["flow_ids"] == ["e1-edge", "o1-origin"]
    (seg,) = entry["hops"]
    assert seg["paired_by"] == "content" and seg["inner_flow_id"] == "o1-origin"
    for key in ("first_token_hold_s", "hold_p50_s", "hold_max_s", "request_delay_s"):
        assert seg[key] == by_trace[key], key


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
