"""A mitmproxy script for `hopmeter run --set scripts=...` that breaks the relay on purpose.

A request whose path ends `/fault/<path>/<step>` gets one fault at `<step>` of a relayed read
(hopmeter.proxy.fastpath.relay.STEPS), on a read from the `ARM_AT`th of the flow on:

- path `direct`: reads taken as they arrive (ReadShortcut); the fault is raised only there;
- path `server_event`: this flow's reads skip the shortcut and reach the relay through
  mitmproxy's read loop and its `server_event` (from an upstream in TLS: the plaintext mitmproxy's
  TLS layer hands its child, `relay.tls_take`).

A request whose path ends `/close-mid-read` has its client's transport aborted, as a peer's reset
would close it, after the first piece of the first read of several pieces the relay moves, and
mitmproxy hears of it LATE_NEWS_S later (as when the loop has other work first): the pieces after
it, and the reads in between, meet a closed writer. One whose path ends `/slow-request-hook`
has a `request` hook that takes SLOW_HOOK_S (an addon's async hook): the flow's HTTP stream is
paused meanwhile, while its response may already be streaming. One whose path ends `/half-close`
has a slow `error` hook: the hooks after it (the relay's own, which lets the flow go) come late.

Over TLS to the client, `<step>` may also be `sendall` or `bio_read`: the client TLS connection's
call the relay makes in mitmproxy's place (a part of its "write" step). To a client that speaks
HTTP/2, "frame" is the relay's call of the client's HTTP/2 connection's `send_data`, or of
h2_frames' `send`, which takes its steps for a piece that fits at once. Behind an
HTTP/2 upstream (one flow per upstream connection), "check" is a stream's checks, "split" the
scan of the read's frames and "commit" feeding them to the connection's h2.

Every other request goes through untouched. Each wrapper calls the real code unless its fault is
due; the fault is a RuntimeError naming the step and the path, raised once per flow.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy.proxy.events import DataReceived
from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection
from mitmproxy.proxy.server import ConnectionHandler, TimeoutWatchdog
from OpenSSL import SSL

from hopmeter.proxy.addon.tap import ResponseTap
from hopmeter.proxy.fastpath import framing, relay
from hopmeter.proxy.fastpath.h2_upstream import H2Upstream
from hopmeter.proxy.fastpath.relay import BodyRelay, ReadShortcut

ARM_AT = 3  # the first reads go through: the client has events before the fault
SLOW_HOOK_S = 0.4
LATE_NEWS_S = 0.1


class Plan:
    """One flow's fault: where, and how far it got (no dataclass: mitmproxy runs a script as a
    module that is not in sys.modules)."""

    def __init__(self, path: str, step: str) -> None:
        self.path = path
        self.step = step
        self.reads = 0
        self.fired = False


PLANS: dict[str, Plan | None] = {}  # flow id -> its plan (None: no fault for it)
ABORTED: set[str] = set()  # /close-mid-read flows whose client transport was aborted
NOW: dict[str, Any] = {"plan": None, "relay": None}  # the read being relayed now


def plan_of(body_relay: BodyRelay | H2Upstream | None) -> Plan | None:
    if isinstance(body_relay, H2Upstream):  # an HTTP/2 upstream's: its (first) stream's flow
        body_relay = next(iter(body_relay.flows.values()), None)
    if body_relay is None:
        return None
    flow = body_relay.flow
    if flow.id not in PLANS:
        parts = flow.request.path.split("?", 1)[0].split("/")
        faulty = len(parts) > 3 and parts[-3] == "fault"
        PLANS[flow.id] = Plan(parts[-2], parts[-1]) if faulty else None
    return PLANS[flow.id]


def due(step: str, plan: Plan | None = None) -> bool:
    """Whether the fault at `step` is to be raised now (once per flow)."""
    plan = plan or NOW["plan"]
    if plan is None or plan.step != step or plan.fired:
        return False
    plan.fired = True
    return True


def fault(step: str, plan: Plan | None = None) -> RuntimeError:
    plan = plan or NOW["plan"]
    return RuntimeError(f"injected relay fault at {step} ({plan.path if plan else '?'})")


def breaks(step: str, original: Any) -> Any:
    """`original`, raising the fault at `step` when it is due."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        if due(step):
            raise fault(step)
        return original(*args, **kwargs)

    return broken


def reading(plan: Plan, call: Any, *args: Any) -> Any:
    """Run one read of a faulty flow with its plan in force from the ARM_AT-th read on."""
    plan.reads += 1
    NOW["plan"] = plan if plan.reads >= ARM_AT else None
    try:
        return call(*args)
    finally:
        NOW["plan"] = None


_server_event = relay.server_event
_tls_take = relay.tls_take
_data_received = ReadShortcut.data_received
_resume = ReadShortcut._resume
_needs_drain = relay.needs_drain
_tap = ResponseTap.__call__
_deliver = BodyRelay._deliver


def on_read_loop(call: Any, holder: Any, event: Any) -> Any:
    """`call(holder, event)`, a read that reached the relay through mitmproxy's read loop, with
    its flow's plan in force when the flow's faults are on that path."""
    body_relay = event.connection.__dict__.get(relay._KEY) if type(event) is DataReceived else None
    plan = plan_of(body_relay)
    if plan is None or plan.path != "server_event":
        return call(holder, event)
    return reading(plan, call, holder, event)


def server_event(self: Any, event: Any) -> Any:
    return on_read_loop(_server_event, self, event)


def tls_take(layer: Any, event: Any) -> Any:
    return on_read_loop(_tls_take, layer, event)


class Unreadable:
    """A stream reader whose private names are not there (an asyncio not as read)."""

    def __getattr__(self, name: str) -> Any:
        raise fault("check")


def data_received(self: ReadShortcut, data: bytes) -> None:
    plan = plan_of(self.conn.__dict__.get(relay._KEY))
    if plan is None:
        _data_received(self, data)
    elif plan.path == "server_event":
        self.inner.data_received(data)  # this flow's reads go through mitmproxy's read loop
    else:
        reading(plan, direct_read, self, data)


def direct_read(self: ReadShortcut, data: bytes) -> None:
    """A direct read, its stream reader unreadable when the fault at "check" is due."""
    if not due("check"):
        _data_received(self, data)
        return
    reader, self.reader = self.reader, Unreadable()
    try:
        _data_received(self, data)
    finally:
        self.reader = reader


def needs_drain(handler: Any) -> bool:
    if due("drain"):
        raise fault("drain")
    plan = NOW["plan"]
    if plan is not None and plan.step == "resume" and not plan.fired:
        return True  # a drain step, for the fault when reading resumes after it
    return bool(_needs_drain(handler))


def resume(self: ReadShortcut) -> None:
    plan = plan_of(self.conn.__dict__.get(relay._KEY))
    if due("resume", plan):
        raise fault("resume", plan)
    _resume(self)


def deliver(self: BodyRelay, pieces: list[bytes], writer: Any) -> None:
    NOW["relay"] = self
    try:
        _deliver(self, pieces, writer)
    finally:
        NOW["relay"] = None


def tap(self: ResponseTap, data: bytes) -> Any:
    if due("tap"):
        raise fault("tap")
    out = _tap(self, data)
    body_relay = NOW["relay"]
    flow = body_relay.flow if body_relay is not None else None
    if (
        flow is not None
        and flow.request.path.endswith("/close-mid-read")
        and flow.id not in ABORTED
    ):
        ABORTED.add(flow.id)
        transport = body_relay.writer.transport
        protocol = transport.get_protocol()
        lost = protocol.connection_lost

        def later(exc: BaseException | None) -> None:
            asyncio.get_running_loop().call_later(LATE_NEWS_S, lost, exc)

        protocol.connection_lost = later  # mitmproxy's read loop learns of it late
        transport.abort()  # the client's transport is closed from here
    return out


def relaying(step: str, original: Any) -> Any:
    """`original`, raising the fault at `step` when it is due and the relay is the caller."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        if NOW["relay"] is not None and due(step):
            raise fault(step)
        return original(*args, **kwargs)

    return broken


relay.server_event = server_event  # what fastpath.install() puts in front of mitmproxy's
relay.tls_take = tls_take  # what relay.tls_event_to_child calls
if ConnectionHandler.server_event is _server_event:  # the script was loaded after install()
    ConnectionHandler.server_event = server_event  # type: ignore[method-assign]
ReadShortcut.data_received = data_received  # type: ignore[method-assign]
ReadShortcut._resume = resume  # type: ignore[method-assign]
BodyRelay._ready = breaks("check", BodyRelay._ready)  # type: ignore[method-assign]
H2Upstream._ready = breaks("check", H2Upstream._ready)  # type: ignore[method-assign]
H2Upstream._frames = breaks("split", H2Upstream._frames)  # type: ignore[method-assign]
H2Upstream._receive = breaks("commit", H2Upstream._receive)  # type: ignore[method-assign]
TimeoutWatchdog.register_activity = breaks("commit", TimeoutWatchdog.register_activity)  # type: ignore[method-assign]
BodyRelay._deliver = deliver  # type: ignore[method-assign]
ResponseTap.__call__ = tap  # type: ignore[method-assign]
relay.split_chunked = breaks("split", relay.split_chunked)
relay._rest = breaks("rest", relay._rest)
relay.needs_drain = needs_drain
framing.chunked = breaks("frame", framing.chunked)
BufferedH2Connection.send_data = relaying("frame", BufferedH2Connection.send_data)  # type: ignore[method-assign]
relay.send_frame = relaying("frame", relay.send_frame)
SSL.Connection.sendall = relaying("sendall", SSL.Connection.sendall)  # type: ignore[method-assign]
SSL.Connection.bio_read = relaying("bio_read", SSL.Connection.bio_read)  # type: ignore[method-assign]
asyncio.StreamWriter.write = breaks("write", asyncio.StreamWriter.write)  # type: ignore[method-assign]


async def request(flow: Any) -> None:
    """mitmproxy's `request` hook: slow for the flows that ask for it."""
    if flow.request.path.endswith("/slow-request-hook"):
        await asyncio.sleep(SLOW_HOOK_S)


async def error(flow: Any) -> None:
    """mitmproxy's `error` hook: slow for the flows that ask for it."""
    if flow.request.path.endswith("/half-close"):
        await asyncio.sleep(SLOW_HOOK_S)
