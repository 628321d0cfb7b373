"""Browser measuring (`--browser`, option `hopmeter_browser`): hopmeter answers its snippet and
the beacons itself, and joins each beacon to the record of the request that announced it.

With the option on, two paths belong to hopmeter and are never forwarded: `GET
/_hopmeter/beacon.js` (the snippet, hopmeter/data/browser/beacon.js) and `POST
/_hopmeter/beacon` (a page's beacon, hopmeter.core.beacon). With it off they do not exist: such
requests go upstream like any other. The answers are set in the `request` hook, after the body
was read; a beacon must say its length (every sendBeacon does), and a body longer than
READ_LIMIT_BYTES is not read at all: it is answered at its headers and its connection closed.
Every outcome is counted (`hopmeter_beacons_total{outcome}`), and a beacon costs the loop one
parse and, once, one join.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from importlib.resources import files
from urllib.parse import urlsplit

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from hopmeter.clock import MONOTONIC, Clock, Timers, timers_or_loop
from hopmeter.core.beacon import MAX_BEACON_BYTES, check_beacon, read_envelope
from hopmeter.core.trace import parse_traceparent
from hopmeter.core.vocab import BeaconOutcome
from hopmeter.errors import BeaconError
from hopmeter.proxy import options
from hopmeter.proxy.addon.beacons import Answer, BeaconJoins
from hopmeter.proxy.addon.browser_gate import BEACON_PATH, OWN_PATHS, SNIPPET_PATH
from hopmeter.proxy.addon.browser_gate import path_of as _path
from hopmeter.proxy.addon.ending import Ending
from hopmeter.proxy.addon.failures import answer_and_close

# The tracestate entry the snippet adds to a request whose page will send a beacon.
MARKER = ("hopmeter", "beacon")
# A beacon body up to this long is read, then answered 413; a longer one (or one of unknown
# length) is not read at all: answered at its headers, its connection closed. Four beacons'
# worth is plenty for a buggy page, and nothing a browser sends is longer.
READ_LIMIT_BYTES = 4 * MAX_BEACON_BYTES
# Beacons answered per second, and the burst allowed above that (a token bucket). A page sends
# one per reply; 50 replies ending every second at one hop is a large site. A beacon for a trace
# nobody announced costs one JSON parse (0.2-3 ms); a joined one, once per reply, 1 ms for a
# 120-token reply to ~20 ms for a full beacon (bench/micro_beacon.py). Beyond the bound a flood
# is answered 429 unread.
RATE_PER_S = 50.0
BURST = 200.0


class RateBound:
    """A token bucket: `allow(now)` is False while the rate is exceeded."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self.at = 0.0

    def allow(self, now: float) -> bool:
        """Take one token if there is one."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def announces_beacon(tracestate: str) -> bool:
    """True when a `tracestate` header carries the snippet's entry (W3C: key=value, commas)."""
    for entry in tracestate.split(","):
        key, _, value = entry.strip().partition("=")
        if (key, value) == MARKER:
            return True
    return False


def origin_of(headers: http.Headers) -> str | None:
    """The page's origin: the Origin header, else the Referer's scheme and host."""
    origin: str | None = headers.get("origin")
    if origin and origin != "null":
        return origin
    referer: str | None = headers.get("referer")
    if referer:
        parts = urlsplit(referer)
        if parts.scheme and parts.netloc:
            return f"{parts.scheme}://{parts.netloc}"
    return None


class BrowserMeter:
    """The snippet, the beacon endpoint and the joins: the beacon wait of a flow's end."""

    def __init__(
        self, ending: Ending, *, clock: Clock = MONOTONIC, timers: Timers | None = None
    ) -> None:
        self.ending = ending
        self.clock = clock  # the beacons' rate; their received time is the wall clock's
        self.timers = timers  # a held record's wait; None: the running loop's
        self.on_error = ending.observers.internal_error
        self.enabled = False
        self.snippet = b""
        self.counts: Counter[BeaconOutcome] = Counter()
        self.rate = RateBound(RATE_PER_S, BURST)
        self.joins = BeaconJoins(schedule=self._later, count=self.count, on_error=self.on_error)
        ending.beacons = self.joins  # records wait here for their beacon (Ending.chain)

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.BROWSER)

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_browser" in updated:
            self.enabled = bool(ctx.options.hopmeter_browser)
            if self.enabled and not self.snippet:
                self.snippet = (files("hopmeter") / "data" / "browser" / "beacon.js").read_bytes()
        if "hopmeter_log_content" in updated:
            self.joins.log_content = bool(ctx.options.hopmeter_log_content)

    def count(self, outcome: BeaconOutcome) -> None:
        """Count an outcome here and in every observer (the metrics)."""
        self.counts[outcome] += 1
        self.ending.observers.notify(lambda obs: obs.beacon(outcome))

    def owns(self, flow: http.HTTPFlow) -> bool:
        """True for a request hopmeter answers itself (never measured, never forwarded)."""
        return self.enabled and _path(flow) in OWN_PATHS

    # -- hooks ---------------------------------------------------------------------------------
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not self.enabled or not flow.live:
            return
        try:
            self._headers(flow)
        except Exception as exc:
            self.on_error("browser", exc)

    def _headers(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if _path(flow) != BEACON_PATH:
            state = req.headers.get("tracestate")
            trace = parse_traceparent(req.headers.get("traceparent", ""))
            if state and trace is not None and announces_beacon(state):
                self.joins.expect(trace.trace_id, flow.id, origin_of(req.headers))
            return
        length = req.headers.get("content-length")
        if length is None and "transfer-encoding" in req.headers:
            why = "a beacon says its length (sendBeacon always does); not read"
            self._refuse(flow, 411, BeaconOutcome.UNSIZED, why)
        elif length is not None and (not length.isdigit() or int(length) > READ_LIMIT_BYTES):
            why = f"beacon of {length} bytes; at most {MAX_BEACON_BYTES}: not read"
            self._refuse(flow, 413, BeaconOutcome.TOO_LARGE, why)

    def _refuse(
        self, flow: http.HTTPFlow, status: int, outcome: BeaconOutcome, message: str
    ) -> None:
        """Answer and close the connection without reading the body (it could be of any
        length); an HTTP/2 client's connection is only closed."""
        self.count(outcome)
        if not answer_and_close(flow, status, outcome, message, {"x-hopmeter-beacon": outcome}):
            flow.kill()  # no connection handler to write to (a test context)

    def request(self, flow: http.HTTPFlow) -> None:
        if not self.owns(flow) or not flow.live:
            return
        # hopmeter's own step on the loop every stream shares: timed, as measuring steps are, so
        # the records of the flows it delayed say so (delivery.own_step_max_cpu_s, proxy_hold)
        self.ending.timed(lambda: self._answer_request(flow))

    def _answer_request(self, flow: http.HTTPFlow) -> None:
        try:
            if _path(flow) == SNIPPET_PATH:
                flow.response = self._snippet(flow)
            else:
                flow.response = self._beacon(flow)
        except Exception as exc:  # a bug here must still answer, and never forward
            self.on_error("browser", exc)
            flow.response = _reply(500, "hopmeter could not handle this beacon (a bug; counted)")

    def _snippet(self, flow: http.HTTPFlow) -> http.Response:
        if flow.request.method not in ("GET", "HEAD"):
            return _reply(405, "GET the snippet", {"allow": "GET, HEAD"})
        return http.Response.make(
            200,
            self.snippet,
            {
                "content-type": "text/javascript; charset=utf-8",
                "cache-control": "no-cache",
                "x-content-type-options": "nosniff",
            },
        )

    def _beacon(self, flow: http.HTTPFlow) -> http.Response:
        req = flow.request
        received_s = time.time()
        if not self.rate.allow(self.clock()):
            return self._answer(Answer(status=429, message="too many beacons; retry later",
                                       outcome=BeaconOutcome.FLOOD))  # fmt: skip
        if req.method != "POST":
            return self._answer(Answer(status=405, message="POST a beacon",
                                       outcome=BeaconOutcome.WRONG_METHOD))  # fmt: skip
        body = req.raw_content or b""
        if len(body) > MAX_BEACON_BYTES:
            return self._answer(
                Answer(
                    status=413,
                    message=f"beacon of {len(body)} bytes; at most {MAX_BEACON_BYTES}",
                    outcome=BeaconOutcome.TOO_LARGE,
                )
            )
        origin = origin_of(req.headers)
        try:
            envelope = read_envelope(body)
            refused = self.joins.admit(envelope.trace_id, origin)
            if refused is not None:  # before checking the rest: a flood of these stays cheap
                return self._answer(refused)
            beacon = check_beacon(envelope)
        except BeaconError as exc:
            return self._answer(Answer(status=400, message=str(exc),
                                       outcome=BeaconOutcome.MALFORMED))  # fmt: skip
        return self._answer(self.joins.beacon(beacon, origin, received_s))

    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run `fn` in `delay_s`; with no loop (offline tools) never: a held record then waits
        for its beacon or `done()`."""
        try:
            timers = timers_or_loop(self.timers)
        except RuntimeError:
            return
        timers.call_later(delay_s, fn)

    def _answer(self, answer: Answer) -> http.Response:
        if answer.outcome is not None:
            self.count(answer.outcome)
        name = answer.outcome or "accepted"
        return _reply(answer.status, answer.message, {"x-hopmeter-beacon": name})


def _reply(status: int, message: str, headers: dict[str, str] | None = None) -> http.Response:
    body = f"hopmeter: {message}\n".encode() if message else b""
    h = {"content-type": "text/plain; charset=utf-8", "cache-control": "no-store"}
    return http.Response.make(status, body, {**h, **(headers or {})})
