"""What mitmproxy's users keep with hopmeter loaded: bodies saved, their own stream callables,
their edits, and honest records of mitmproxy's own failures (docs/mitmproxy.md).

hopmeter streams a response to measure it without holding it. mitmproxy keeps no copy of a
streamed body, runs one stream callable per message, and applies an edit only to a body it
buffered. So, per flow (`FlowPassage`, decided by `Passage` when the headers come):

- another addon's stream callable is **chained**: it runs first, on every chunk, and hopmeter
  measures what it returns, the bytes as they leave (`PassageTap`);
- a body that `modify_body` (or `hopmeter_buffer`, a flow filter) matches is **left to mitmproxy
  to buffer**, so the edit applies, and is measured whole as mitmproxy delivers it; in plain
  mitmproxy (`hopmeter_stream=streams`) so is a response of known length that is no event
  stream, as mitmproxy would have it (a script's `response` hook may edit it); `hopmeter run`
  streams every other response (`all`);
- the bytes the client got are **kept** (`BodyCopy`), up to `hopmeter_keep_body` per flow and
  `hopmeter_keep_body_total` over the streams open at once, and given to mitmproxy as the
  response's content when the stream ends, so `-w`, export, replay and mitmweb have them; past a
  bound the copy keeps what fits and the record and the flow say so;
- an edit a `response` hook makes to a body that was already streamed cannot reach the client:
  the record says so (`edited_after_streaming`), with the fix.

mitmproxy's own failures are never recorded as complete: an HTTP/1 1xx response (103 Early
Hints), which mitmproxy 12 takes for the final response (the client then waits for a reply that
never comes), and a crash of mitmproxy's layers on the flow's connection ("mitmproxy has
crashed!": HTTP/1 trailers, a stream callable that raised), which leaves the client waiting. Both
end the flow as `error` with the cause in the record, and close the client's connection so the
client can tell.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import flowfilter, http
from mitmproxy.addons.modifyheaders import ModifySpec, parse_modify_spec

from hopmeter.core.passage import (
    BODY_SIZE_LIMIT,
    FLOW_ERROR,
    INFORMATIONAL,
    MITMPROXY_ERROR,
    PassageSeen,
)
from hopmeter.core.secrets import scrub
from hopmeter.core.vocab import BodyClip, Ended
from hopmeter.core.wire import EVENT_STREAM, NDJSON_TYPES, PACKED_ID_TYPES, sniff_request
from hopmeter.errors import UsageError, said
from hopmeter.log import get_logger
from hopmeter.proxy.addon.failures import answer_and_close, classify_error
from hopmeter.proxy.addon.tap import (
    REQUEST_SNIFF_BYTES,
    FlowState,
    MeasureQueue,
    OnError,
    ResponseTap,
)
from hopmeter.proxy.options import read

log = get_logger()

# Who moved a response's body to the client (`mitmproxy.stream` in the record).
HOPMETER = "hopmeter"  # hopmeter's stream callable (the default: no section in the record)
CHAINED = "chained"  # another addon's stream callable, then hopmeter's
BUFFERED = "buffered"  # not streamed: mitmproxy read it whole, ran its hooks, then sent it
# another addon, loaded after hopmeter, set its own stream callable over hopmeter's: nothing of
# the body was measured (load hopmeter last: `-s yours.py -s "$(hopmeter --addon-path)"`)
REPLACED = "replaced"

# Why a body was left to mitmproxy to buffer (`buffered_by`).
BY_MODIFY_BODY = "modify_body"  # a modify_body spec matches the flow: the edit must apply
BY_FILTER = "hopmeter_buffer"  # the user's filter matches
NOT_A_STREAM = "not_a_stream"  # plain mitmproxy: a body of known length that is no event stream
# a reply an addon set at `request` (server replay, a script's `http.Response.make`): mitmproxy
# sends it whole after the headers hook, never through the stream callable
BY_ADDON = "addon_reply"
# a request body of no stated length from an HTTP/2 (or 3) client: mitmproxy 12 sends it to an
# HTTP/1 upstream with neither a length nor chunks (connecting lazily, as `hopmeter run` does),
# so the upstream reads none of it; buffered, it goes with the length it has (`take_request`)
UNSIZED = "unsized"

# What became of the body copy (`body_clipped`)
FLOW_CAP = BodyClip.FLOW_CAP
TOTAL_CAP = BodyClip.TOTAL_CAP

# `hopmeter_stream`
STREAMS = "streams"  # event streams, NDJSON and bodies of unknown length (plain mitmproxy)
ALL = "all"  # every response (hopmeter run)
STREAM_MODES = (STREAMS, ALL)
# media types whose bodies are token streams: always streamed (core.wire's framers)
STREAM_TYPES = frozenset({EVENT_STREAM, *NDJSON_TYPES, *PACKED_ID_TYPES})

# the flow's metadata key that says its kept body was clipped (mitmweb shows metadata)
BODY_META_KEY = "hopmeter_body"

# mitmproxy's log line when a layer raised on a connection (mitmproxy/proxy/server.py)
CRASH_MESSAGE = "mitmproxy has crashed!"
CRASH_LOGGER = "mitmproxy.proxy.server"


class BodyBudget:
    """The bytes held by the body copies of the flows in flight, against their total bound."""

    __slots__ = ("cap", "clipped", "held")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.held = 0
        self.clipped = dict.fromkeys((FLOW_CAP, TOTAL_CAP), 0)  # flows, for /metrics


class BodyCopy:
    """One flow's body as the client got it, up to its bound (the bytes objects themselves: no
    copy is made until `take`)."""

    __slots__ = ("budget", "cap", "chunks", "clipped", "held", "seen", "size")

    def __init__(self, cap: int, budget: BodyBudget) -> None:
        self.cap = cap
        self.budget = budget
        self.chunks: list[bytes] = []
        self.size = 0  # bytes kept
        self.seen = 0  # bytes the client got
        self.held = True  # its bytes count in the budget until taken or released
        self.clipped: str | None = None

    def add(self, data: bytes) -> None:
        """Keep `data` (what the client got next), or what of it fits."""
        n = len(data)
        self.seen += n
        if self.clipped is not None or not n:
            return
        budget = self.budget
        flow_room = self.cap - self.size
        total_room = budget.cap - budget.held
        if n > min(flow_room, total_room):
            self.clipped = FLOW_CAP if flow_room <= total_room else TOTAL_CAP
            budget.clipped[self.clipped] += 1
            data = data[: min(flow_room, total_room)]
            n = len(data)
        if n:
            self.chunks.append(data)
            self.size += n
            budget.held += n

    def take(self) -> bytes:
        """The kept body, joined; the copy gives its bytes back to the budget."""
        body = b"".join(self.chunks)
        self.release()
        return body

    def release(self) -> None:
        """Give the held bytes back (once; the flow ended, its body taken or not)."""
        if self.held:
            self.held = False
            self.budget.held -= self.size
        self.chunks = []


@dataclass(slots=True)
class FlowPassage:
    """How mitmproxy and hopmeter moved one flow, and what mitmproxy's features did to it."""

    stream: str = HOPMETER
    buffered_by: str | None = None
    request_buffered_by: str | None = None
    body: BodyCopy | None = None
    # the body object the response hook saw last, to tell an edit by a later hook
    hook_body: bytes | None = None
    given: bytes | None = None  # the kept body, once given to mitmproxy as the content
    edited: bool = False  # a hook changed the body after hopmeter's response hook
    edited_before: bool = False  # ... or, a streamed one, before it (hand_off)
    error: str | None = None  # mitmproxy's own failure on this flow
    killed: bool = False  # an addon killed the flow (`flow.kill()`): its connection was closed
    cause: str = MITMPROXY_ERROR  # what `error` was (core.passage's causes)
    informational: list[int] = field(default_factory=list)  # 1xx statuses taken for the reply

    def as_dict(self) -> dict[str, Any] | None:
        """The record's `mitmproxy` section; None when mitmproxy's features left the flow as
        `hopmeter run` moves every flow (hopmeter's stream callable, nothing kept or edited)."""
        out: dict[str, Any] = {}
        if self.stream != HOPMETER:
            out["stream"] = self.stream
        if self.buffered_by is not None:
            out["buffered_by"] = self.buffered_by
        if self.request_buffered_by is not None:
            out["request_buffered_by"] = self.request_buffered_by
        if self.body is not None:
            out["body_kept_bytes"] = self.body.size
            out["body_bytes"] = self.body.seen
            out["body_clipped"] = self.body.clipped
        if self.edited:
            out["edited"] = "after_streaming" if self.stream != BUFFERED else "response"
        if self.error is not None:
            out["error"] = self.error
        if self.killed:
            out["killed"] = True
        if self.informational:
            out["informational"] = list(self.informational)
        if not out:
            return None
        return {"stream": self.stream, **out}

    def seen(self) -> PassageSeen | None:
        """What the record says of it (its `mitmproxy` section and findings), taken when the flow
        ended; None when mitmproxy's features left it as `hopmeter run` moves every flow."""
        section = self.as_dict()
        if section is None:
            return None
        return PassageSeen(
            section=section,
            error=self.error,
            cause=INFORMATIONAL if self.informational else self.cause,
            edited_after_streaming=self.edited and self.stream != BUFFERED,
            streamed_bytes=self.body.seen if self.body is not None else None,
        )


class PassageTap(ResponseTap):
    """hopmeter's stream callable for a flow whose body is chained or kept: another addon's
    callable first (its exceptions are its own, as without hopmeter: mitmproxy reports them),
    then hopmeter's tap on each piece it returns, then the copy of what goes out."""

    __slots__ = ("body", "flow", "inner")
    # another addon's callable may raise: mitmproxy's layers call it, never the relay
    relay_safe = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inner: Callable[[bytes], bytes | Iterable[bytes]] | None = None
        self.body: BodyCopy | None = None
        self.flow: http.HTTPFlow | None = None  # whose content the copy becomes at the end

    def __call__(self, data: bytes) -> bytes | list[bytes]:
        inner = self.inner
        if inner is None:
            out = ResponseTap.__call__(self, data)
        else:
            returned = inner(data)
            pieces = [returned] if isinstance(returned, bytes) else list(returned)
            got: list[bytes] = []
            for piece in pieces:
                if piece:
                    self._extend(got, ResponseTap.__call__(self, piece))
            if not data:  # the end: hopmeter's own flush after the other callable's
                self._extend(got, ResponseTap.__call__(self, b""))
            out = got
        body = self.body
        if body is not None:
            try:
                for chunk in [out] if isinstance(out, bytes) else out:
                    body.add(chunk)
                if not data:
                    self._give(body)
            except Exception as exc:  # the copy is lost, never a byte of the flow
                self.body = None
                self.on_error("body_copy", exc)
        return out

    def _give(self, body: BodyCopy) -> None:
        """An empty call: the body's end, before any `response` hook, or an empty HTTP/2 DATA
        frame mid-stream (mitmproxy hands those on too). The copy so far becomes the response's
        content now, so that every hook sees it, those of addons loaded before hopmeter too; it
        stays held (more may come), joined into the one object the content is, and is given
        again at the `response` hook if more came (`Passage.hand_off`)."""
        flow, st = self.flow, self.state
        if flow is None or st is None or st.passage is None or not body.held:
            return
        p, response = st.passage, flow.response
        if response is None or not _ours(response, p):
            return
        snapshot = b"".join(body.chunks)
        body.chunks = [snapshot] if snapshot else []
        response.raw_content = p.given = snapshot

    @staticmethod
    def _extend(got: list[bytes], out: bytes | list[bytes]) -> None:
        if isinstance(out, bytes):
            if out:
                got.append(out)
        else:
            got.extend(piece for piece in out if piece)


def _framed(request: http.Request) -> bool:
    """Whether a request's body is framed on its own: an HTTP/1 request always is (a length,
    chunks, or no body), another one when it states its length."""
    return request.http_version.startswith("HTTP/1") or "content-length" in request.headers


def _unsized_json(request: http.Request) -> bool:
    """An HTTP/2 (or 3) request that sends a JSON document (an LLM API's request) without its
    length: held whole and sent with it (`UNSIZED`). Bodiless methods, and bodies that stream
    by nature (gRPC, uploads of any other type), are left as they come."""
    if _framed(request) or request.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return False
    media = str(request.headers.get("content-type", "")).split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def take_request(st: FlowState, request: http.Request, on_error: OnError) -> None:
    """A request body mitmproxy buffered, at the `request` hook (after those of the addons loaded
    before hopmeter): one of unknown length (`UNSIZED`) gets it stated, as an HTTP/1 upstream
    needs it; then it is read as `RequestTap` reads a streamed one: its size, its model and
    stream flag. Never raises: a failure is `on_error`'s."""
    try:
        body = request.raw_content or b""
        if (
            body
            and st.passage
            and st.passage.request_buffered_by == UNSIZED
            and not _framed(request)
        ):
            request.headers["content-length"] = str(len(body))
        st.request_bytes = len(body)
        st.request_model, st.stream_requested = sniff_request(body[:REQUEST_SNIFF_BYTES])
    except Exception as exc:  # a measuring bug must never touch the request
        on_error("request", exc)


def parse_buffer_filter(value: str) -> flowfilter.TFilter | None:
    """`hopmeter_buffer`: a mitmproxy flow filter, or None when empty."""
    if not value.strip():
        return None
    try:
        return flowfilter.parse(value)
    except ValueError as exc:
        raise UsageError(f"hopmeter_buffer {value!r}: not a mitmproxy flow filter: {exc}") from None


def parse_modify_body(specs: Sequence[str]) -> list[ModifySpec]:
    """mitmproxy's modify_body specs, parsed as its ModifyBody addon parses them (a spec it
    refuses is its own error to report: skipped here)."""
    out = []
    for spec in specs:
        try:
            out.append(parse_modify_spec(spec, True))
        except ValueError:
            continue
    return out


@dataclass(slots=True)
class Passage:
    """The options that decide how flows pass (module doc), and the body copies' budget."""

    mode: str = STREAMS
    buffer_filter: flowfilter.TFilter | None = None
    modify_body: list[ModifySpec] = field(default_factory=list)
    keep_body: int = 0
    store_streamed: bool = False  # mitmproxy's store_streamed_bodies: it keeps bodies itself
    budget: BodyBudget = field(default_factory=lambda: BodyBudget(0))
    replaced_warned: bool = False

    def buffer_request(self, flow: http.HTTPFlow) -> str | None:
        """Why the request body is left to mitmproxy to buffer, or None to stream it: an edit
        must apply to it; or, with `hopmeter_stream=streams` (plain mitmproxy's addon), it is a
        body mitmproxy buffers (a request body is no token stream): a `request` hook (a user's
        kill, intercept, replay or edit) then acts before anything of the request is sent
        upstream, as it does without hopmeter. A body mitmproxy streams itself (its
        `stream_large_bodies`) stays streamed."""
        why = self._edits(flow)
        request = flow.request
        if why is None and request.stream is False and _unsized_json(request):
            return UNSIZED  # sent with its length from the `request` hook (`take_request`)
        if why is not None or self.mode == ALL or request.stream is not False:
            return why
        return NOT_A_STREAM

    def decide(self, flow: http.HTTPFlow) -> str | None:
        """Why a response mitmproxy would buffer (its `stream` still False: no size bound and no
        other addon chose to stream it) is left to mitmproxy to buffer, or None to stream it."""
        response = flow.response
        assert response is not None
        why = self._edits(flow)
        if why is not None or self.mode == ALL:
            return why
        media = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media in STREAM_TYPES or "content-length" not in response.headers:
            return None  # a token stream, or a body of unknown length: never held whole
        return NOT_A_STREAM

    def _edits(self, flow: http.HTTPFlow) -> str | None:
        for spec in self.modify_body:
            if spec.matches(flow):
                return BY_MODIFY_BODY
        if self.buffer_filter is not None and self.buffer_filter(flow):
            return BY_FILTER
        return None

    def hand_off(self, flow: http.HTTPFlow, p: FlowPassage, tap: Any) -> None:
        """At the `response` (or `error`) hook, before mitmproxy's own addons (Save, modify_body):
        give mitmproxy the kept body as the response's content, unless it kept one itself, and
        remember the body object the later hooks start from (an edit replaces it). A tap that is no
        longer the stream callable was replaced by an addon loaded after hopmeter."""
        response = flow.response
        if response is None:
            return
        if p.stream != BUFFERED and tap is not None and response.stream is not tap:
            p.stream = REPLACED
            if not self.replaced_warned:  # once: it is so for every flow
                self.replaced_warned = True
                log.warning(
                    "hopmeter: another addon replaced hopmeter's stream callable, so this flow's "
                    "body was not measured; load hopmeter after it: -s yours.py -s "
                    '"$(hopmeter --addon-path)"',
                )
        moved = tap is not None and tap.bytes_out > 0  # not a reply an addon set at `request`
        content = response.raw_content
        addon_reply = tap is not None and not moved and content and p.given is None
        if p.stream in (HOPMETER, CHAINED) and addon_reply:
            # the body did not go through the stream callable: measured whole (`settle`)
            if p.body is not None:
                p.body.release()
                p.body = None
            p.stream, p.buffered_by = BUFFERED, BY_ADDON
        if (
            p.stream != BUFFERED
            and moved
            and content
            and content is not p.given
            and not self.store_streamed
        ):
            # a body streamed without mitmproxy's copy has none here but the copy hopmeter gave
            # at its end (a 101's is empty), unless a hook that ran before this one set it (an
            # addon loaded before hopmeter): an edit that came too late
            p.edited_before = True
        body = p.body
        if p.stream not in (BUFFERED, REPLACED) and body is not None and body.held:
            give(flow, p, body)  # the end never came (an error), or the copy's hand-over failed
        p.hook_body = response.raw_content

    def tap(
        self, flow: http.HTTPFlow, state: FlowState | None, queue: MeasureQueue, on_error: OnError
    ) -> ResponseTap:
        """The response's tap, installed as its stream callable unless the body is left to
        mitmproxy to buffer: chained after another addon's callable, keeping a copy of the body
        when asked, or the plain tap. Set before anything can fail (only measuring is lost)."""
        response = flow.response
        assert response is not None
        chosen = response.stream
        p = state.passage if state is not None else None
        why, keep = None, None
        if p is not None:
            try:
                why = self.decide(flow) if chosen is False else None
                keep = None if why is not None else self.copy()
            except Exception as exc:  # measuring's loss only: the body is streamed
                on_error("passage", exc)
                why, keep = None, None
        if why is not None and p is not None:
            p.stream, p.buffered_by = BUFFERED, why
            return ResponseTap(state, queue, on_error)  # measures; not called
        if callable(chosen) or keep is not None:
            tap: ResponseTap = PassageTap(state, queue, on_error)
            if callable(chosen):
                tap.inner = chosen  # type: ignore[attr-defined]
                if p is not None:
                    p.stream = CHAINED
            tap.body = keep  # type: ignore[attr-defined]
            tap.flow = flow  # type: ignore[attr-defined]
            if p is not None:
                p.body = keep
        else:
            tap = ResponseTap(state, queue, on_error)
        response.stream = tap
        return tap

    def copy(self) -> BodyCopy | None:
        """A body copy for a streamed flow, or None when none is kept."""
        if self.keep_body <= 0 or self.store_streamed:
            return None
        return BodyCopy(self.keep_body, self.budget)


def _ours(response: http.Response, p: FlowPassage) -> bool:
    """Whether the response's content is hopmeter's to set: none yet, or the copy it gave (not
    mitmproxy's own, with store_streamed_bodies, nor one a hook set)."""
    return response.raw_content is None or response.raw_content is p.given


def give(flow: http.HTTPFlow, p: FlowPassage, body: BodyCopy) -> None:
    """Give the kept copy of a streamed body to mitmproxy as the response's content, unless it
    kept one itself (`store_streamed_bodies`), saying in the flow's metadata when it is clipped."""
    kept = body.take()  # the object given at the end, when nothing came since (bytes.join)
    response = flow.response
    if response is None or not _ours(response, p):
        return
    response.raw_content = p.given = kept
    if body.clipped is not None:
        flow.metadata[BODY_META_KEY] = (
            f"clipped ({body.clipped}): kept {body.size} of {body.seen} bytes"
        )


def end_informational(flow: http.HTTPFlow, p: FlowPassage) -> None:
    """A 1xx response reached the `response` hook: mitmproxy took it for the final one, and the
    client would wait for a reply that never comes. Say so in the flow's passage and kill the
    flow, which closes the client's connection (module doc); the flow then ends as an error."""
    assert flow.response is not None
    status = flow.response.status_code
    p.informational.append(status)
    if p.body is not None:  # a 1xx has no body to keep
        p.body.release()
        p.body = None
    p.error = f"HTTP/1 {status} {flow.response.reason} taken for the final response"
    if flow.killable:
        flow.kill()


def informational(flow: http.HTTPFlow) -> bool:
    """Whether the response mitmproxy took for the final one is a 1xx (101 switches protocols
    and is final)."""
    return (
        flow.response is not None
        and 100 <= flow.response.status_code < 200
        and (flow.response.status_code != 101)
    )


H2_PREFACE = "HTTP/2 connection preface (PRI *) on a listener without TLS: closed by mitmproxy"


def h2_preface(flow: http.HTTPFlow) -> bool:
    """Whether the flow is an HTTP/2 client's clear-text connection preface, which mitmproxy's
    disable_h2c addon kills (HTTP/2 only in TLS)."""
    r = flow.request
    return r.method == "PRI" and r.path == "*" and r.http_version == "HTTP/2.0"


class CrashWatch(logging.Handler):
    """Calls `on_crash(client_address, detail)` for each "mitmproxy has crashed!" line of
    mitmproxy's connection handler (attached to its logger while hopmeter is loaded)."""

    def __init__(self, on_crash: Callable[[Any, str], None]) -> None:
        super().__init__(logging.ERROR)
        self.on_crash = on_crash

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg != CRASH_MESSAGE:
            return
        exc = record.exc_info[1] if record.exc_info else None
        detail = said(exc) if exc is not None else "unknown"
        try:
            self.on_crash(getattr(record, "client", None), detail)
        except Exception:  # a log handler that raises would print its own traceback
            self.handleError(record)


PASSAGE_OPTIONS = frozenset(
    {
        "hopmeter_stream",
        "hopmeter_buffer",
        "hopmeter_keep_body",
        "hopmeter_keep_body_total",
        "modify_body",
        "store_streamed_bodies",
    }
)


def configure(passage: Passage, options: Any, updated: set[str]) -> None:
    """Apply the options of module doc to `passage` (mitmproxy's `configure`); a bad value is a
    UsageError naming the option."""
    if not updated & PASSAGE_OPTIONS:
        return
    mode = options.hopmeter_stream
    if mode not in STREAM_MODES:  # `choices` shows in mitmproxy's UIs; nothing enforces it
        raise UsageError(
            f"hopmeter_stream must be one of {', '.join(STREAM_MODES)}, got {mode!r}: 'streams' "
            "leaves what is no token stream to mitmproxy, 'all' streams every body"
        )
    passage.mode = mode
    passage.buffer_filter = parse_buffer_filter(options.hopmeter_buffer)
    passage.keep_body = read(options, "hopmeter_keep_body")
    passage.budget.cap = read(options, "hopmeter_keep_body_total")
    # mitmproxy's own addons' options, absent in a master without them
    passage.modify_body = parse_modify_body(getattr(options, "modify_body", ()) or ())
    passage.store_streamed = bool(getattr(options, "store_streamed_bodies", False))


def settle(flow: http.HTTPFlow, p: FlowPassage, meter: Any, tap: Any) -> None:
    """When the record is taken (after every hook): a buffered body is measured whole, as
    mitmproxy delivered it, at the time it had it all; an edit by a later hook is noted; a copy
    that was never handed off gives its bytes back."""
    if p.body is not None:
        p.body.release()
    response = flow.response
    if response is None or p.informational:
        return
    final = response.raw_content
    p.edited = p.edited_before or (final is not p.hook_body and final != p.hook_body)
    killed = flow.error is not None and flow.error.msg == flow.error.KILLED_MESSAGE
    if p.stream == BUFFERED and final and tap is not None and not tap.bytes_out and not killed:
        tap.bytes_out = len(final)  # what mitmproxy sent whole (the tap was never called)
    if p.stream == BUFFERED and meter is not None and final:
        t_s = (response.timestamp_end or response.timestamp_start) - flow.request.timestamp_start
        try:
            meter.feed(final, t_s)
        except Exception as exc:
            tap.fail(exc)


def close_client(flow: http.HTTPFlow) -> None:
    """Close the flow's client connection (mitmproxy left it open after its layers raised)."""
    answer_and_close(flow, None, "proxy_failed", "")


MAX_ERROR_CHARS = 300  # mitmproxy's error text in a record (its messages are a line or two)
_QUOTED_BYTES = re.compile(r"""(?<!\w)b(['"]).*?(?<!\\)\1|(?<!\w)b['"].*""", re.DOTALL)


def ended_by_error(flow: http.HTTPFlow, p: FlowPassage | None) -> Ended:
    """How a flow that fired `error` ended (`classify_error`); one that ended by mitmproxy's own
    error, not a peer's close, has that error said in its record (`mitmproxy.error`, finding
    `proxy_failed`) unless a failure was said already (a crash of mitmproxy's layers) or it was
    killed (an addon's `flow.kill()`, said as `killed`). The text is scrubbed of anything shaped
    like a credential and clipped."""
    msg = flow.error.msg if flow.error else ""
    ended = classify_error(msg, flow.client_conn.connected)
    killed = flow.error is not None and msg == flow.error.KILLED_MESSAGE  # said as `killed`
    if ended is Ended.ERROR and msg and not killed and p is not None and p.error is None:
        # bytes a message quotes (a bad response line, a bad header line) are the peer's, not
        # mitmproxy's words: withheld, as a body is
        p.error = scrub(_QUOTED_BYTES.sub("b'[withheld]'", msg))[:MAX_ERROR_CHARS]
        p.cause = BODY_SIZE_LIMIT if "body_size_limit" in msg else FLOW_ERROR
    return ended
