"""Beacon joins: a record whose request announced a beacon waits for it, in either order, within
bounds; every outcome is counted and every held record written exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import BeaconOutcome
from hopmeter.proxy.addon import beacons
from hopmeter.proxy.addon.beacons import WAIT_S, BeaconJoins
from tests.core.literal_beacons import T0_MS, beacon, frames, reads

PAGE = "http://page.example"


class Fixture:
    """A BeaconJoins with its timers, writes, counts and errors kept."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.emitted: list[FlowResult] = []
        self.counts: Counter[BeaconOutcome] = Counter()
        self.errors: list[str] = []
        self.joins = BeaconJoins(
            schedule=lambda delay, fn: self.timers.append((delay, fn)),
            emit=self.emitted.append,
            count=lambda outcome: self.counts.update([outcome]),
            on_error=lambda where, exc: self.errors.append(where),
        )

    def take(self, r: FlowResult) -> bool:
        """Hand `r` to the joins as a flow's end does; True unless it was handed on as it is."""
        n = len(self.emitted)
        self.joins.take(r, self.emitted.append)
        return not (len(self.emitted) == n + 1 and self.emitted[-1] is r)

    def fire(self) -> None:
        timers, self.timers = self.timers, []
        for _, fn in timers:
            fn()


def result(trace: str, flow: str = "f1") -> FlowResult:
    rs = reads()
    rec: dict[str, Any] = {
        "trace_id": trace,
        "flow_id": flow,
        "hop": "edge",
        "request": {"t_start": T0_MS / 1000 + 0.005},
        "events": [[t / 1000 + 0.095, 1, c] for t, _, c in rs],
        "findings": [],
    }
    return FlowResult(record=rec, figures=None, tokens=None)


def page_beacon(trace: str) -> Any:
    rs = reads()
    return beacon(rs, frames(rs), trace_id=trace)


RECEIVED = T0_MS / 1000 + 3.0


def test_a_record_waits_for_its_beacon_then_is_written_with_the_lanes() -> None:
    """The record is held; the beacon from the page's origin joins it (204) and writes it."""
    f = Fixture()
    f.joins.expect("t1", "f1", PAGE)
    assert f.take(result("t1")) is True
    assert f.emitted == [] and f.joins.parked == 1 and f.timers[0][0] == WAIT_S
    answer = f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED)
    assert (answer.status, answer.outcome) == (204, None)
    (rec,) = [r.record for r in f.emitted]
    assert rec["browser"]["joined"] is True and rec["screen"]["chars"] == 300
    assert f.counts == {BeaconOutcome.JOINED: 1} and f.joins.parked == 0
    f.fire()  # the timer finds nothing left to write
    assert len(f.emitted) == 1


def test_a_beacon_before_its_record_waits_for_it() -> None:
    """A page left mid-stream sends at once: accepted (202), joined when the record comes."""
    f = Fixture()
    f.joins.expect("t1", "f1", PAGE)
    assert f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED).status == 202
    assert f.joins.waiting == 1 and f.emitted == []
    assert f.take(result("t1")) is True
    assert f.emitted[0].record["browser"]["joined"] is True and f.joins.waiting == 0


def test_no_beacon_in_time_writes_the_record_without_lanes() -> None:
    """After WAIT_S the record is written saying no beacon came; a beacon after that is late."""
    f = Fixture()
    f.joins.expect("t1", "f1", PAGE)
    f.take(result("t1"))
    f.fire()
    (rec,) = [r.record for r in f.emitted]
    assert rec["browser"] == {
        "joined": False,
        "reason": "no beacon within 15 s of the stream's end",
    }
    assert f.counts == {BeaconOutcome.MISSING: 1}
    late = f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED)
    assert (late.status, late.outcome) == (410, BeaconOutcome.LATE)


@pytest.mark.parametrize(
    ("origin", "status", "outcome"),
    [
        ("http://evil.example", 403, BeaconOutcome.WRONG_ORIGIN),
        (None, 403, BeaconOutcome.WRONG_ORIGIN),
    ],
)
def test_only_the_page_that_made_the_request_may_send_its_beacon(
    origin: str | None, status: int, outcome: BeaconOutcome
) -> None:
    """Another origin, or none, is refused; the record keeps waiting for the right one."""
    f = Fixture()
    f.joins.expect("t1", "f1", PAGE)
    f.take(result("t1"))
    answer = f.joins.beacon(page_beacon("t1"), origin, RECEIVED)
    assert (answer.status, answer.outcome) == (status, outcome)
    assert "only the page that made the request" in answer.message
    assert f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED).status == 204


def test_a_request_without_an_origin_cannot_be_joined() -> None:
    """A request that named no origin: no beacon can prove it comes from the same page."""
    f = Fixture()
    f.joins.expect("t1", "f1", None)
    f.take(result("t1"))
    assert f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED).status == 403


def test_unknown_and_duplicate_beacons() -> None:
    """A trace no request announced is 404; a second beacon, waiting or joined, is 409."""
    f = Fixture()
    unknown = f.joins.beacon(page_beacon("t9"), PAGE, RECEIVED)
    assert (unknown.status, unknown.outcome) == (404, BeaconOutcome.UNKNOWN_TRACE)
    f.joins.expect("t1", "f1", PAGE)
    f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED)
    assert f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED).outcome == BeaconOutcome.DUPLICATE
    f.take(result("t1"))
    assert f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED).status == 409


def test_only_the_flow_the_page_talked_to_waits() -> None:
    """The first flow of an announced trace waits; an inner listener's flow of the same trace,
    and any flow of another trace, is written at once."""
    f = Fixture()
    f.joins.expect("t1", "edge-flow", PAGE)
    f.joins.expect("t1", "origin-flow", PAGE)  # the inner listener saw the same headers
    assert f.take(result("t1", "origin-flow")) is False
    assert f.take(result("t2", "other")) is False
    assert f.take(result("t1", "edge-flow")) is True


def test_held_records_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_PARKED the oldest held record is written without lanes, and counted."""
    monkeypatch.setattr(beacons, "MAX_PARKED", 2)
    f = Fixture()
    for i in range(3):
        f.joins.expect(f"t{i}", f"f{i}", PAGE)
        f.take(result(f"t{i}", f"f{i}"))
    assert [r.record["trace_id"] for r in f.emitted] == ["t0"]
    assert f.emitted[0].record["browser"]["joined"] is False
    assert f.joins.parked == 2 and f.counts == {BeaconOutcome.MISSING: 1}


def test_waiting_beacons_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_WAITING_BEACONS the oldest waiting beacon is dropped, and counted."""
    monkeypatch.setattr(beacons, "MAX_WAITING_BEACONS", 2)
    f = Fixture()
    for i in range(3):
        f.joins.expect(f"t{i}", f"f{i}", PAGE)
        f.joins.beacon(page_beacon(f"t{i}"), PAGE, RECEIVED)
    assert f.joins.waiting == 2 and f.counts == {BeaconOutcome.DROPPED: 1}
    assert f.take(result("t0", "f0")) is True  # its beacon is gone: it waits again


def test_announced_requests_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_EXPECTED the oldest announcement is forgotten, its held record written."""
    monkeypatch.setattr(beacons, "MAX_EXPECTED", 2)
    f = Fixture()
    f.joins.expect("t0", "f0", PAGE)
    f.take(result("t0", "f0"))
    f.joins.expect("t1", "f1", PAGE)
    f.joins.expect("t2", "f2", PAGE)
    assert [r.record["browser"]["joined"] for r in f.emitted] == [False]
    assert len(f.joins.expected) == 2


def test_drain_writes_every_held_record() -> None:
    """When the proxy stops, every held record is written, saying so."""
    f = Fixture()
    for i in range(2):
        f.joins.expect(f"t{i}", f"f{i}", PAGE)
        f.take(result(f"t{i}", f"f{i}"))
    f.joins.drain()
    assert [r.record["browser"]["reason"] for r in f.emitted] == [
        "hopmeter stopped before the beacon came"
    ] * 2
    assert f.joins.parked == 0 and f.joins.expected == {}


def test_a_failing_join_writes_the_record_anyway() -> None:
    """A bug in joining is counted; the record is written without the lanes, saying why."""
    f = Fixture()
    f.joins.expect("t1", "f1", PAGE)
    broken = result("t1")
    broken.record["events"] = "not a list"
    f.take(broken)
    f.joins.beacon(page_beacon("t1"), PAGE, RECEIVED)
    assert f.errors == ["browser"]
    assert f.emitted[0].record["browser"]["joined"] is False
    assert "joining the beacon failed" in f.emitted[0].record["browser"]["reason"]
