"""Tests for hopmeter.proxy.addon.guard, in process: the hooks mitmproxy calls, in the order it
calls them, on its test flows; the real connections are in tests/integration/test_sidecar.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mitmproxy import connection, http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.flow import Error
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.test import taddons, tflow

from hopmeter.core.record import FlowResult
from hopmeter.core.upstream import UpstreamFailure
from hopmeter.core.vocab import Ended
from hopmeter.export import FlowObserver
from hopmeter.proxy.addon import guard as guard_module
from hopmeter.proxy.addon.guard import BODY, FORGET_CLOSED_S, HEADERS, UpstreamGuard
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.testing import ManualClock

UPSTREAM = ("127.0.0.1", 8000)


class Records(FlowObserver):
    """Keeps every finished flow's record."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def observe(self, result: FlowResult) -> None:
        self.records.append(result.record)


def run(
    body: Callable[[HopMeter, UpstreamGuard, Records, Any], Awaitable[None]], **opts: Any
) -> None:
    """Run `body` on an event loop with a HopMeter and a guard configured with `opts`, both on
    a ManualClock (`guard.clock`) that the body advances."""

    async def main() -> None:
        now = ManualClock()
        meter, records = HopMeter(clock=now, timers=now), Records()
        readiness = Readiness(clock=now, timers=now)
        guard = UpstreamGuard(meter, readiness, clock=now, timers=now)
        meter.add_observer(records)
        with taddons.context(meter, guard, readiness, Proxyserver()) as tctx:
            tctx.configure(meter, hopmeter_hop="edge")
            tctx.options.update(mode=["reverse:http://127.0.0.1:8000@8080"])
            tctx.configure(guard, **opts)
            await body(meter, guard, records, tctx)
            guard.done()

    asyncio.run(main())


def request_flow() -> http.HTTPFlow:
    """A chat request whose response has not come (as at `requestheaders`)."""
    flow = tflow.tflow()
    flow.request.path = "/v1/chat/completions"
    flow.server_conn = connection.Server(address=UPSTREAM)
    flow.client_conn.timestamp_end = None  # the client is still connected
    return flow


def hook_data(flow: http.HTTPFlow, error: str) -> ServerConnectionHookData:
    """What `server_connect_error` gets: a fresh server connection that failed with `error`."""
    server = connection.Server(address=UPSTREAM)
    server.error = error
    return ServerConnectionHookData(server=server, client=flow.client_conn)


async def ended_by_error(meter: HopMeter, guard: UpstreamGuard, flow: http.HTTPFlow) -> None:
    """mitmproxy's `error` hooks for `flow`, then a loop turn for the record to be built."""
    flow.error = Error("Client disconnected.")
    meter.error(flow)
    guard.error(flow)
    await asyncio.sleep(0)


def test_a_refused_connect_is_recorded_with_its_cause() -> None:
    """server_connect_error's errno names the cause; the flow's `error` then records it, with the
    502 mitmproxy answered, and the upstream is not ready."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flow = request_flow()
        meter.requestheaders(flow)
        guard.requestheaders(flow)
        guard.server_connect_error(hook_data(flow, "[Errno 111] Connect call failed"))
        await ended_by_error(meter, guard, flow)
        (rec,) = records.records
        assert rec["ended"] == "connect_refused"
        assert rec["api"] == "openai.chat"  # from the request's path: no response was measured
        assert rec["upstream_error"] == {
            "cause": "connect_refused",
            "detail": "ECONNREFUSED 127.0.0.1:8000",
            "status_sent": 502,
        }
        assert guard.watches == {} and guard.by_client == {}
        assert guard.readiness is not None
        assert guard.readiness.states[UPSTREAM].ok is False

    run(body)


def test_a_cancelled_connect_or_a_departed_client_is_not_an_upstream_failure() -> None:
    """A connect mitmproxy cancelled, or a failure after the client left, names no cause."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flow = request_flow()
        meter.requestheaders(flow)
        guard.requestheaders(flow)
        guard.server_connect_error(hook_data(flow, "connection cancelled"))
        flow.client_conn.timestamp_end = 1.0
        guard.server_connect_error(hook_data(flow, "[Errno 111] Connect call failed"))
        await ended_by_error(meter, guard, flow)
        (rec,) = records.records
        assert rec["ended"] == "client_gone"
        assert "upstream_error" not in rec

    run(body)


def test_silence_before_the_headers_is_upstream_timeout() -> None:
    """Connected, then nothing within the read timeout: the flow's cause is upstream_timeout
    with the timeout that expired, and its client connection is the guard's to close (and
    remembered as such until FORGET_CLOSED_S after it disconnected)."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flow = request_flow()
        meter.requestheaders(flow)
        guard.requestheaders(flow)
        guard.server_connected(
            ServerConnectionHookData(server=flow.server_conn, client=flow.client_conn)
        )
        assert guard.watches[flow.id].phase == HEADERS
        guard.clock.advance(0.049)
        assert flow.client_conn.id not in guard.closed
        guard.clock.advance(0.001)
        assert flow.client_conn.id in guard.closed  # the read timeout, to the tick
        await ended_by_error(meter, guard, flow)
        (rec,) = records.records
        assert rec["ended"] == "upstream_timeout"
        assert rec["upstream_error"]["timeout_s"] == 0.05
        assert rec["upstream_error"]["status_sent"] == 504
        guard.client_disconnected(flow.client_conn)  # its teardown's errors are still ours
        guard.clock.advance(FORGET_CLOSED_S - 0.5)
        assert flow.client_conn.id in guard.closed
        guard.clock.advance(0.5)
        assert flow.client_conn.id not in guard.closed  # forgotten FORGET_CLOSED_S later

    run(body, hopmeter_read_timeout="50ms")


def test_an_unanswered_tls_handshake_is_tls_failed_not_a_connect_timeout() -> None:
    """Connected over TCP, the TLS handshake never answered within the connect timeout (an
    https:// URL for a plain-HTTP port, whose server waits for a request): tls_failed, whose
    fix names that, with 502; with no TCP connection yet it stays connect_timeout."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flows = [request_flow(), request_flow()]
        flows[0].server_conn.tls = flows[1].server_conn.tls = True
        flows[0].server_conn.timestamp_tcp_setup = 1.0  # accepted; no timestamp_tls_setup
        for flow in flows:
            meter.requestheaders(flow)
            guard.requestheaders(flow)
        guard.clock.advance(0.05)
        for flow in flows:
            await ended_by_error(meter, guard, flow)
        handshake, connect = records.records
        assert guard.readiness is not None and guard.readiness.states[UPSTREAM].ok is False
        assert handshake["ended"] == "tls_failed"
        assert handshake["upstream_error"]["detail"].startswith("TLS handshake unanswered")
        assert handshake["upstream_error"]["status_sent"] == 502
        assert connect["ended"] == "connect_timeout"

    run(body, hopmeter_connect_timeout="50ms")


def test_chunks_keep_a_stream_alive_and_silence_cuts_it() -> None:
    """Each chunk moves the deadline (the timer re-arms lazily when it comes due); silence past
    the read timeout after the headers is upstream_idle, with no status sent."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flow = request_flow()
        meter.requestheaders(flow)
        guard.requestheaders(flow)
        flow.response = tflow.tresp()
        flow.response.headers["content-type"] = "text/event-stream"
        meter.responseheaders(flow)
        guard.responseheaders(flow)
        assert guard.watches[flow.id].phase == BODY
        tap = flow.response.stream
        assert callable(tap)
        for _ in range(6):  # a chunk every 90 ms: never 100 ms of silence
            tap(b"data: {}\n\n")
            guard.clock.advance(0.09)
        assert flow.client_conn.id not in guard.closed
        guard.clock.advance(0.0099)
        assert flow.client_conn.id not in guard.closed
        guard.clock.advance(0.0001)
        assert flow.client_conn.id in guard.closed  # 100 ms after the last chunk
        await ended_by_error(meter, guard, flow)
        (rec,) = records.records
        assert rec["ended"] == rec["response"]["ended"] == "upstream_idle"
        assert rec["upstream_error"]["status_sent"] is None

    run(body, hopmeter_read_timeout="0.1")


def test_a_buffered_body_is_not_cut_for_taking_long() -> None:
    """A body mitmproxy buffers shows no chunk until it is whole: the guard stops watching it at
    its headers (its silence is mitmproxy's tcp_timeout's), so a long download is not cut at
    the read timeout however long it takes, and the connection is never closed by the guard."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flow = request_flow()
        flow.request.path = "/downloads/model.bin"  # not a model API: mitmproxy buffers it
        meter.requestheaders(flow)
        guard.requestheaders(flow)
        handle = guard.watches[flow.id].handle
        flow.response = tflow.tresp()
        flow.response.headers["content-type"] = "application/octet-stream"
        meter.responseheaders(flow)
        guard.responseheaders(flow)
        assert flow.response.stream is False  # buffered by mitmproxy, no tap
        assert flow.id not in guard.watches
        assert handle is not None and handle.cancelled()
        guard.clock.advance(10.0)  # a hundred read timeouts
        assert flow.client_conn.id not in guard.closed
        guard.response(flow)
        assert guard.watches == {} and guard.by_client == {}

    run(body, hopmeter_read_timeout="0.1")


def test_a_complete_response_cancels_its_timer() -> None:
    """A flow that ends normally leaves no watch and no timer behind."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        flow = request_flow()
        meter.requestheaders(flow)
        guard.requestheaders(flow)
        handle = guard.watches[flow.id].handle
        guard.response(flow)
        assert guard.watches == {}
        assert handle is not None and handle.cancelled()

    run(body)


def test_timeouts_must_be_positive() -> None:
    """A timeout of zero, or not a number of seconds, is refused with the option's name."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, tctx: Any) -> None:
        with pytest.raises(Exception, match="hopmeter_connect_timeout '0': expected a positive"):
            tctx.configure(guard, hopmeter_connect_timeout="0")
        with pytest.raises(Exception, match="hopmeter_read_timeout 'soon': expected"):
            tctx.configure(guard, hopmeter_read_timeout="soon")
        tctx.configure(guard, hopmeter_connect_timeout="1500ms")
        assert guard.connect_timeout_s == 1.5

    run(body)


def test_the_eager_strategy_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """With connection_strategy=eager (mitmproxy's default) a reverse proxy's guard says once
    that an unreachable upstream then closes connections unanswered and unrecorded; a regular
    proxy's, which connects once it has the request, does not."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, tctx: Any) -> None:
        tctx.options.update(connection_strategy="eager", tcp_timeout=600, mode=["regular"])
        with caplog.at_level(logging.WARNING):
            guard.running()
        assert "connection_strategy is eager" not in caplog.text
        tctx.options.update(mode=["regular", "upstream:http://127.0.0.1:9@8082"])
        with caplog.at_level(logging.WARNING):
            guard.running()
        assert "connection_strategy is eager" not in caplog.text
        for mode in ("reverse:http://127.0.0.1:9@8081", "socks5@8083"):
            caplog.clear()
            tctx.options.update(mode=["regular", mode])
            with caplog.at_level(logging.WARNING):
                guard.running()
            assert "connection_strategy is eager" in caplog.text, mode

    run(body)


def test_no_proxy_server_no_warnings(caplog: pytest.LogCaptureFixture) -> None:
    """`mitmdump -n` (server off: reading a flow file, say) runs no proxy: the strategy and
    timeout warnings, which are about connections, are not given."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, tctx: Any) -> None:
        tctx.options.update(server=False, connection_strategy="eager", tcp_timeout=1)
        with caplog.at_level(logging.WARNING):
            guard.running()
        assert "hopmeter:" not in caplog.text

    run(body)


def test_a_failing_timeout_is_counted_and_still_ends_the_flow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault in acting on a timeout that came is counted and the client's connection is
    still closed (a silent upstream must not hold the client for good); a fault in telling
    whether it came is counted and leaves the flow alone, the timer trying again a limit later."""
    closed: list[str] = []
    monkeypatch.setattr(guard_module, "answer_and_close", lambda f, *a: closed.append(f.id))

    def broken(*args: Any) -> None:
        raise RuntimeError("guard bug")

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        errors: list[str] = []
        meter.internal_error = lambda where, exc=None: errors.append(where)  # type: ignore[method-assign]
        acting, telling = request_flow(), request_flow()
        for flow in (acting, telling):
            meter.requestheaders(flow)
            guard.requestheaders(flow)
            guard.server_connected(
                ServerConnectionHookData(server=flow.server_conn, client=flow.client_conn)
            )
        monkeypatch.setattr(guard, "_timed_out", broken)
        monkeypatch.setattr(guard, "_last", lambda w: broken() if w.flow is telling else 0.0)
        guard.clock.advance(0.05)
        assert closed == [acting.id] and errors == ["guard", "guard"]
        assert guard.watches[telling.id].handle is not None  # armed again
        guard.clock.advance(0.05)
        assert errors == ["guard", "guard", "guard"] and closed == [acting.id]

    run(body, hopmeter_read_timeout="50ms")


def test_flows_mitmproxy_leaves_behind_a_departed_client_are_ended() -> None:
    """mitmproxy ends a departed client's flows as it closes its upstream connections, right
    after `client_disconnected`; one still waiting for its upstream ORPHAN_WAIT_S later (an
    HTTP/2 stream queued for an upstream connection when a relay cut the client's) gets no hook
    any more: hopmeter records it (client_gone, or the cause the guard found) and forgets its
    watch, not leaving it in flight until the drain. Another client's flow goes on."""

    async def body(meter: HopMeter, guard: UpstreamGuard, records: Records, _: Any) -> None:
        ours, failed, timed, theirs = (request_flow() for _ in range(4))
        for flow in (failed, timed):
            flow.client_conn = ours.client_conn
        for flow in (ours, failed, timed, theirs):
            meter.requestheaders(flow)
            guard.requestheaders(flow)
        failure = UpstreamFailure(cause=Ended.CONNECT_TIMEOUT, detail="x", status_sent=None)
        meter.upstream_failed(timed, failure)
        ours.client_conn.timestamp_end = 1.0
        guard.client_disconnected(ours.client_conn)
        await ended_by_error(meter, guard, failed)  # mitmproxy ends this one itself
        assert [r["flow_id"] for r in records.records] == [failed.id]
        guard.clock.advance(guard_module.ORPHAN_WAIT_S)
        await asyncio.sleep(0)
        ended = {r["flow_id"]: r["ended"] for r in records.records}
        assert ended == {
            failed.id: "client_gone",
            ours.id: "client_gone",
            timed.id: "connect_timeout",
        }
        assert set(guard.watches) == {theirs.id} and meter.in_flight() == 1
        await ended_by_error(meter, guard, ours)  # a hook that comes after all: nothing twice
        assert len(records.records) == 3

    run(body)
