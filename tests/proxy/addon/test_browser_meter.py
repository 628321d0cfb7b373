"""Browser measuring in the proxy: hopmeter answers its two paths itself only when the option is
on, never measures or forwards them, refuses what it must not read, and announces, holds and
joins records (mitmproxy's test context, no sockets)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from mitmproxy import ctx, http
from mitmproxy.test import taddons, tflow

from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import BeaconOutcome
from hopmeter.export import FlowObserver
from hopmeter.proxy.addon.browser_gate import answered_here
from hopmeter.proxy.addon.browser_meter import (
    BURST,
    RATE_PER_S,
    BrowserMeter,
    RateBound,
    announces_beacon,
    origin_of,
)
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.testing import ManualClock

TP = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
PAGE = "http://page.example"


class Recorder(FlowObserver):
    """An observer that keeps every record and beacon outcome (the other notices: the
    protocol's own no-ops)."""

    def __init__(self) -> None:
        self.results: list[FlowResult] = []
        self.outcomes: list[str] = []

    def observe(self, result: FlowResult) -> None:
        self.results.append(result)

    def beacon(self, outcome: str) -> None:
        self.outcomes.append(outcome)


@pytest.fixture
def meter() -> HopMeter:
    """The measuring addon whose flow's end BrowserMeter holds records in."""
    return HopMeter()


@pytest.fixture
def browser(meter: HopMeter) -> Iterator[BrowserMeter]:
    """A HopMeter with browser measuring on, in mitmproxy's test context."""
    b = BrowserMeter(meter.ending)
    with taddons.context(meter, b) as tctx:
        tctx.configure(meter, hopmeter_hop="edge")
        tctx.configure(b, hopmeter_browser=True)
        yield b


def request(path: str, method: str = "POST", body: bytes = b"", **headers: str) -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = method
    flow.request.path = path
    flow.request.content = body
    for k, v in headers.items():
        flow.request.headers[k.replace("_", "-")] = v
    return flow


def answer(b: BrowserMeter, meter: HopMeter, flow: http.HTTPFlow) -> http.Response:
    """Run the request hooks as mitmproxy does; the response hopmeter set."""
    meter.requestheaders(flow)
    b.requestheaders(flow)
    b.request(flow)
    assert flow.response is not None
    return flow.response


def test_the_snippet_is_served(browser: BrowserMeter, meter: HopMeter) -> None:
    """GET /_hopmeter/beacon.js is the packaged snippet, as JavaScript, answered by hopmeter."""
    r = answer(browser, meter, request("/_hopmeter/beacon.js?v=1", "GET"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert b"hopmeter.beacon/1" in r.content and b"sendBeacon" in r.content
    assert answer(browser, meter, request("/_hopmeter/beacon.js", "POST")).status_code == 405


def test_a_beacon_path_is_never_measured(browser: BrowserMeter, meter: HopMeter) -> None:
    """hopmeter's own paths get no measuring state: no record, no traceparent added."""
    flow = request("/_hopmeter/beacon", body=b"{}")
    meter.requestheaders(flow)
    assert flow.id not in meter.live and "traceparent" not in flow.request.headers


def test_the_other_addons_tell_hopmeter_s_own_paths_from_the_option(
    browser: BrowserMeter,
) -> None:
    """answered_here (what the measuring addon and the guard ask) agrees with the option: the
    two paths while it is on, nothing once it is off."""
    snippet, other = request("/_hopmeter/beacon.js", "GET"), request("/v1/chat/completions")
    assert answered_here(snippet) and browser.owns(snippet) and not answered_here(other)
    ctx.options.update(hopmeter_browser=False)
    assert not answered_here(snippet) and not browser.owns(snippet)


def test_without_the_option_nothing_is_answered() -> None:
    """Option off: hopmeter's paths are ordinary requests (measured, forwarded)."""
    meter = HopMeter()
    b = BrowserMeter(meter.ending)
    with taddons.context(meter, b) as tctx:
        tctx.configure(meter, hopmeter_hop="edge")
        flow = request("/_hopmeter/beacon.js", "GET")
        meter.requestheaders(flow)
        b.requestheaders(flow)
        b.request(flow)
        assert flow.response is None and flow.id in meter.live
        assert not b.owns(flow)


def test_bad_beacons_are_answered_and_counted(browser: BrowserMeter, meter: HopMeter) -> None:
    """Each refusal is a status, one line, the outcome in a header and in the observers."""
    rec = Recorder()
    meter.add_observer(rec)
    cases = [
        (request("/_hopmeter/beacon", body=b"nope", origin=PAGE), 400, "malformed"),
        (request("/_hopmeter/beacon", "GET"), 405, "wrong_method"),
        (request("/_hopmeter/beacon", body=b" " * 70_000), 413, "too_large"),
    ]
    for flow, status, outcome in cases:
        r = answer(browser, meter, flow)
        assert r.status_code == status and r.headers["x-hopmeter-beacon"] == outcome
        assert r.text is not None and r.text.startswith("hopmeter: ") and r.text.count("\n") == 1
    assert rec.outcomes == ["malformed", "wrong_method", "too_large"]
    assert browser.counts == {
        BeaconOutcome.MALFORMED: 1,
        BeaconOutcome.WRONG_METHOD: 1,
        BeaconOutcome.TOO_LARGE: 1,
    }


@pytest.mark.parametrize(
    ("headers", "outcome"),
    [
        ({"content-length": "10000000"}, BeaconOutcome.TOO_LARGE),
        ({"content-length": "ten"}, BeaconOutcome.TOO_LARGE),
        ({"transfer-encoding": "chunked"}, BeaconOutcome.UNSIZED),
    ],
)
def test_a_body_too_long_to_read_is_never_read(
    browser: BrowserMeter, headers: dict[str, str], outcome: BeaconOutcome
) -> None:
    """A declared length past the read limit, or none at all: the flow is killed at its headers
    (mitmproxy closes the connection unread), counted."""
    flow = tflow.tflow()
    flow.request.path = "/_hopmeter/beacon"
    flow.request.headers.clear()
    flow.request.headers.update(headers)
    browser.requestheaders(flow)
    assert flow.error is not None and flow.error.msg == "Connection killed."
    assert browser.counts == {outcome: 1}


def test_an_announced_stream_waits_for_its_beacon(browser: BrowserMeter, meter: HopMeter) -> None:
    """A request with the snippet's tracestate registers its trace, with its page's origin;
    its record is held until the beacon, then written with the browser lane."""
    flow = request(
        "/v1/chat/completions", traceparent=TP, tracestate="x=1,hopmeter=beacon", origin=PAGE
    )
    browser.requestheaders(flow)
    expected = browser.joins.expected["ab" * 16]
    assert (expected.flow_id, expected.origin) == (flow.id, PAGE)
    rec = Recorder()
    meter.add_observer(rec)
    record: dict[str, Any] = {
        "trace_id": "ab" * 16,
        "flow_id": flow.id,
        "hop": "edge",
        "request": {"t_start": 1733000000.0},
        "events": [[0.1, 1, 5]],
    }
    meter.ending.take_at("beacon", FlowResult(record=record, figures=None, tokens=None))
    assert rec.results == []  # held
    assert browser.joins.parked == 1


def test_a_stream_that_does_not_announce_is_not_held(browser: BrowserMeter) -> None:
    """No tracestate entry, or no valid traceparent: nothing registered."""
    browser.requestheaders(request("/v1/chat/completions", traceparent=TP, tracestate="x=1"))
    browser.requestheaders(request("/v1/x", traceparent="bad", tracestate="hopmeter=beacon"))
    assert browser.joins.expected == {}


def test_a_flood_is_refused_past_the_rate() -> None:
    """The token bucket lets a burst through, then one per 1/rate seconds."""
    bound = RateBound(rate_per_s=10, burst=3)
    assert [bound.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert bound.allow(0.05) is False and bound.allow(0.1) is True


def test_beacons_past_the_burst_are_answered_429_until_the_bucket_refills() -> None:
    """Through the hooks: BURST beacons pass the bound, the next is refused 429 and counted a
    flood, and one more passes once 1/RATE_PER_S has passed on BrowserMeter's clock."""
    meter, now = HopMeter(), ManualClock()
    b = BrowserMeter(meter.ending, clock=now, timers=now)
    with taddons.context(meter, b) as tctx:
        tctx.configure(meter, hopmeter_hop="edge")
        tctx.configure(b, hopmeter_browser=True)
        beacon = lambda: request("/_hopmeter/beacon", body=b"nope")  # noqa: E731
        statuses = [answer(b, meter, beacon()).status_code for _ in range(int(BURST) + 1)]
        assert statuses == [400] * int(BURST) + [429]
        step_s = 2**-6  # exact in binary; under 1/RATE_PER_S, two of them over it
        assert step_s < 1 / RATE_PER_S < 2 * step_s
        now.advance(step_s)
        assert answer(b, meter, beacon()).status_code == 429
        now.advance(step_s)
        assert answer(b, meter, beacon()).status_code == 400
        assert b.counts[BeaconOutcome.FLOOD] == 2


def test_the_tracestate_entry_and_the_origin_are_read_as_the_specs_say() -> None:
    """tracestate is a comma list of key=value; the origin is Origin, else Referer's."""
    assert announces_beacon("hopmeter=beacon")
    assert announces_beacon("a=1, hopmeter=beacon ,b=2")
    assert not announces_beacon("hopmeter=other") and not announces_beacon("xhopmeter=beacon")
    h = http.Headers(origin=PAGE)
    assert origin_of(h) == PAGE
    assert origin_of(http.Headers(referer="https://app.example:8443/chat?x=1")) == (
        "https://app.example:8443"
    )
    assert origin_of(http.Headers(origin="null")) is None
    assert origin_of(http.Headers()) is None


def test_a_joined_beacon_through_the_hooks(browser: BrowserMeter, meter: HopMeter) -> None:
    """A real beacon body for a held record: 204, and the record written with both lanes."""
    from tests.core.literal_beacons import frames, reads

    rs = reads()
    body = {
        "schema": "hopmeter.beacon/1",
        "traceparent": TP,
        "url": "/v1/chat/completions",
        "t0": 1733000000000.0,
        "status": 200,
        "headers": 600,
        "end": 13000,
        "how": "done",
        "sent": 25000,
        "reads": {
            "t": [1000] + [200] * (len(rs) - 1),
            "bytes": [80] * len(rs),
            "chars": [5] * len(rs),
        },
        "stream": {"bytes": 4800, "chars": 300, "shown": 300, "fffd": 0},
        "screen": {
            "t": [round(f[0] * 10) - (round(p[0] * 10) if p else 0) for p, f in _pairs(frames(rs))],
            "raf": [10] * len(frames(rs)),
            "write": [7] * len(frames(rs)),
            "chars": [f[3] - (p[3] if p else 0) for p, f in _pairs(frames(rs))],
            "tasks": [1] * len(frames(rs)),
            "removed": [0] * len(frames(rs)),
        },
    }
    record: dict[str, Any] = {
        "trace_id": "ab" * 16,
        "flow_id": "f1",
        "hop": "edge",
        "request": {"t_start": 1733000000.005},
        "events": [[t / 1000 - 0.006, 1, c] for t, _, c in rs],
    }
    browser.joins.expect("ab" * 16, "f1", PAGE)
    rec = Recorder()
    meter.add_observer(rec)
    meter.ending.take_at("beacon", FlowResult(record=record, figures=None, tokens=None))
    r = answer(browser, meter, request("/_hopmeter/beacon", body=orjson.dumps(body), origin=PAGE))
    assert r.status_code == 204 and r.headers["x-hopmeter-beacon"] == "accepted"
    (out,) = rec.results
    assert out.record["browser"]["joined"] and out.record["screen"]["chars"] == 300
    assert [s.segment for s in out.segments] == ["screen>browser", "browser>edge"]
    assert rec.outcomes == ["joined"]


def _pairs(xs: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip([None, *xs[:-1]], xs, strict=True))


def test_the_proxy_stopping_writes_held_records(browser: BrowserMeter, meter: HopMeter) -> None:
    """HopMeter.done drains the held records: none is lost at shutdown."""
    browser.joins.expect("t1", "f1", PAGE)
    rec = Recorder()
    meter.add_observer(rec)
    record = {"trace_id": "t1", "flow_id": "f1", "request": {"t_start": 1.0}, "events": []}
    meter.ending.take_at("beacon", FlowResult(record=record, figures=None, tokens=None))
    meter.done()
    assert [r.record["browser"]["joined"] for r in rec.results] == [False]
