"""Beacon parsing: a well-formed beacon decoded (delta-coded ticks to milliseconds, counts
accumulated), and every kind of bad input refused with one line naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from hopmeter.core.beacon import MAX_BEACON_BYTES, MAX_ENTRIES, MAX_TEXT_CHARS, parse_beacon
from hopmeter.errors import BeaconError

TP = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


def doc(**changes: Any) -> dict[str, Any]:
    """A well-formed beacon as the snippet sends it."""
    d: dict[str, Any] = {
        "schema": "hopmeter.beacon/1",
        "traceparent": TP,
        "url": "/v1/chat/completions",
        "t0": 1733000000123.4,
        "status": 200,
        "headers": 520,
        "end": 9000,
        "how": "done",
        "sent": 20000,
        "rt": [20, 500],
        "reads": {"t": [600, 200, 201], "bytes": [90, 80, 70], "chars": [4, 5, 6],
                  "shown": [0, 5, 6], "lost": 2, "step": 1},
        "stream": {"bytes": 240, "chars": 15, "shown": 11, "fffd": 0},
        "screen": {"t": [700, 167, 166], "raf": [12, 10, 11], "write": [9, 8, 200],
                   "chars": [5, 6, -1], "tasks": [1, 1, 2], "removed": [0, 0, 11],
                   "fffd": [0, 1, 1], "lost": 0, "step": 2, "slow": 3, "paint": 700,
                   "present": 740, "plain": True},
    }  # fmt: skip
    d.update(changes)
    return d


def parse(d: dict[str, Any]) -> Any:
    return parse_beacon(orjson.dumps(d))


def test_a_well_formed_beacon_is_decoded() -> None:
    """Ticks of 0.1 ms since t0, delta-coded, become milliseconds; counts accumulate; the
    traceparent gives the trace and span ids."""
    b = parse(doc())
    assert (b.trace_id, b.span_id) == ("ab" * 16, "cd" * 8)
    assert b.t0_ms == 1733000000123.4 and b.headers_ms == 52.0 and b.end_ms == 900.0
    assert (b.request_start_ms, b.response_start_ms) == (2.0, 50.0)
    assert b.reads.t_ms == (60.0, 80.0, 100.1)
    assert b.reads.chars == (4, 9, 15) and b.reads.shown == (0, 5, 11)
    assert b.reads.bytes == (90, 80, 70) and b.reads.lost == 2
    f = b.screen
    assert f is not None
    assert f.t_ms == (70.0, 86.7, 103.3)
    assert f.raf_ms == pytest.approx((68.8, 85.7, 102.2))
    assert f.write_ms == pytest.approx((69.1, 85.9, 83.3))
    assert f.chars == (5, 11, 10) and f.removed == (0, 0, 11) and f.fffd == (0, 1, 1)
    assert (f.step, f.slow, f.paint_ms, f.present_ms, f.plain) == (2, 3, 70.0, 74.0, True)
    assert b.text is None


def test_optional_parts_default() -> None:
    """No shown list (no reasoning: the answer is all the text), no lost or step, no fffd,
    no screen, no Resource Timing."""
    d = doc(rt=None, screen=None)
    d["reads"] = {"t": [1, 2], "bytes": [3, 4], "chars": [5, 6]}
    b = parse(d)
    assert b.reads.shown == b.reads.chars == (5, 11)
    assert (b.reads.lost, b.reads.step) == (0, 1)
    assert b.screen is None and b.request_start_ms is None


def test_opted_in_text_is_kept_up_to_a_bound() -> None:
    """A page that opted in sends its text: kept, cut at MAX_TEXT_CHARS."""
    assert parse(doc(text="héllo 🦙")).text == "héllo 🦙"
    assert len(parse(doc(text="x" * (MAX_TEXT_CHARS + 5))).text) == MAX_TEXT_CHARS


BAD = [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (orjson.dumps(doc(schema="hopmeter.beacon/2")), "schema"),
    (orjson.dumps(doc(traceparent="00-nope")), "traceparent"),
    (orjson.dumps(doc(traceparent=None)), "traceparent"),
    (orjson.dumps(doc(how="later")), "how"),
    (orjson.dumps(doc(status="200")), "status"),
    (orjson.dumps(doc(status=True)), "status"),
    (orjson.dumps(doc(status=-1)), "status"),
    (orjson.dumps(doc(t0="now")), "t0"),
    (orjson.dumps(doc(sent=1.5)), "sent"),
    (orjson.dumps(doc(rt=[1])), "rt"),
    (orjson.dumps(doc(text=5)), "text"),
    (orjson.dumps(doc(url="x" * 3000)), "url"),
    (orjson.dumps(doc(reads=[])), "reads"),
    (orjson.dumps(doc(stream={"bytes": 1})), "stream.chars"),
    (orjson.dumps(doc(reads={"t": [1, 2], "bytes": [1], "chars": [1, 1]})), "reads.bytes"),
    (orjson.dumps(doc(reads={"t": [1, "2"], "bytes": [1, 1], "chars": [1, 1]})), "reads.t"),
    (orjson.dumps(doc(reads={"t": [1, -2], "bytes": [1, 1], "chars": [1, 1]})), "only grow"),
    (orjson.dumps(doc(reads={"t": [1], "bytes": [1], "chars": [1], "lost": -1})), "reads.lost"),
    (orjson.dumps(doc(reads={"t": [1] * (MAX_ENTRIES + 1)})), "at most 2048"),
    (
        orjson.dumps(
            doc(
                screen={
                    "t": [1],
                    "raf": [-1],
                    "write": [1],
                    "chars": [1],
                    "tasks": [1],
                    "removed": [0],
                }
            )
        ),
        "screen.raf",
    ),
    (
        orjson.dumps(
            doc(
                screen={
                    "t": [1],
                    "raf": [1],
                    "write": [1],
                    "chars": [-1],
                    "tasks": [1],
                    "removed": [0],
                }
            )
        ),
        "screen.chars",
    ),
    (orjson.dumps(doc(screen={"t": [1]})), "screen.raf"),
    (orjson.dumps(doc(screen=[])), "screen"),
    (b" " * (MAX_BEACON_BYTES + 1), "at most 65536"),
]


@pytest.mark.parametrize(("body", "says"), BAD, ids=[s for _, s in BAD])
def test_a_bad_beacon_names_its_problem(body: bytes, says: str) -> None:
    """Each bad input is a BeaconError whose one line names the field (or the limit)."""
    with pytest.raises(BeaconError) as err:
        parse_beacon(body)
    assert says in str(err.value) and "\n" not in str(err.value)
