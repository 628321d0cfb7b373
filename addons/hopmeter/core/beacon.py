"""The browser's beacon (schema "hopmeter.beacon/1"): bytes in, a checked `Beacon` out.

The snippet (`hopmeter/data/browser/beacon.js`) sends one beacon per reply: when the page's body
reader got each chunk (its bytes and the visible characters a correct decoder makes of the bytes
so far) and each frame that changed the reply's element on screen (the characters it showed, the
work around it, how many separate writes made it). Never text, unless the page opted in.

Times travel as whole ticks of 0.1 ms (the page clock's own grain) since `t0`, the page's
`performance.timeOrigin + performance.now()` when fetch() was called, each list delta-coded from
the entry before it so that a long reply fits the 64 KiB a beacon may carry. Counts of
characters are delta-coded too. Everything from the page is untrusted: every field is checked for
its type and bounds here, and a beacon that fails names its first problem (`BeaconError`, a 400).

    {"schema": "hopmeter.beacon/1", "traceparent": "00-<trace>-<span>-01", "url": "/v1/chat",
     "t0": 1733050000123.4, "status": 200, "headers": 52, "end": 8123, "how": "done",
     "sent": 18230, "rt": [4, 50],
     "reads": {"t": [..], "bytes": [..], "chars": [..], "shown": [..], "alone": [..], "lost": 0,
               "step": 1},
     "stream": {"bytes": 9041, "chars": 718, "shown": 718, "fffd": 0},
     "screen": {"t": [..], "raf": [..], "write": [..], "chars": [..], "tasks": [..],
                "removed": [..], "fffd": [..], "lost": 0, "step": 1, "slow": 0,
                "paint": 61, "present": 64, "plain": false},
     "text": "only when the page opted in"}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson

from hopmeter.core.trace import parse_traceparent
from hopmeter.errors import BeaconError

SCHEMA = "hopmeter.beacon/1"
# A beacon's body is at most this long: navigator.sendBeacon refuses a body over 64 KiB (Chromium
# 156 sent 65,536 bytes and refused 65,537; the quota is shared by beacons still in flight).
MAX_BEACON_BYTES = 65_536
# Reads and frames listed per beacon. The snippet merges neighbours past this, or to fit 64 KiB
# (about 12 bytes an entry when delta-coded). It bounds a beacon's join, done once on the
# proxy's loop: 2,048 reads and frames cost ~15 ms of CPU (bench/micro_beacon.py), a reply of
# some 2,000 tokens; a longer one is listed two reads an entry, and so on.
MAX_ENTRIES = 2048
# Ticks of the page clock per millisecond (the snippet rounds every time to 0.1 ms, its grain).
TICKS_PER_MS = 10
# Ticks are whole numbers below this: 10^10 ticks are 11.6 days, longer than any reply.
MAX_TICKS = 10**10
# Opted-in reply text kept from a beacon, in characters (the rest is cut).
MAX_TEXT_CHARS = 32_768
# How the body's reading ended, as the snippet says it.
ENDINGS = ("done", "error", "cancel", "pagehide", "hidden")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reads:
    """The page's body reads: per listed read its time, bytes and characters so far."""

    t_ms: tuple[float, ...]  # since t0
    bytes: tuple[int, ...]  # of this read (merged reads: since the entry before)
    chars: tuple[int, ...]  # visible characters so far: answer, reasoning and tool arguments
    shown: tuple[int, ...]  # answer characters so far: what the reply's element shows
    # answer characters so far as a decoder per read makes them (a U+FFFD for each piece of a
    # character split between reads): `shown` when no read split one
    alone: tuple[int, ...]
    lost: int  # reads past the snippet's bound, not listed
    step: int  # reads merged into each listed one (1: every read listed)


@dataclass(frozen=True, slots=True, kw_only=True)
class Frames:
    """The frames that changed the reply's element: painted when, showing what, after what."""

    t_ms: tuple[float, ...]  # painted: after the frame's layout (= Paint Timing's paintTime)
    raf_ms: tuple[float, ...]  # the frame's animation callbacks began
    write_ms: tuple[float, ...]  # the first write to the element that this frame shows
    chars: tuple[int, ...]  # characters the element showed (code points of its textContent)
    tasks: tuple[int, ...]  # separate tasks that wrote to it for this frame
    removed: tuple[int, ...]  # characters taken out of it (a re-render removes what it showed)
    fffd: tuple[int, ...]  # U+FFFD it showed
    lost: int
    step: int
    slow: int  # frames that came over 25 ms after the one before while the reply streamed
    paint_ms: float | None  # Element Timing: the element's first text painted (Chromium)
    present_ms: float | None  # ... and presented on the glass
    plain: bool  # the page said the element shows the reply as plain text (no Markdown)


@dataclass(frozen=True, slots=True, kw_only=True)
class Beacon:
    """One reply as the page saw it; times in ms since `t0_ms` (epoch ms on the page's clock)."""

    trace_id: str
    span_id: str
    url: str
    t0_ms: float
    status: int
    headers_ms: float | None  # fetch() resolved: the response headers reached the page
    end_ms: float | None  # the body ended (or the page left) at
    how: str  # one of ENDINGS
    sent_ms: float  # the beacon was built
    request_start_ms: float | None  # Resource Timing requestStart (same origin only)
    response_start_ms: float | None  # ... responseStart
    reads: Reads
    stream_bytes: int
    stream_chars: int
    stream_shown: int
    stream_fffd: int  # U+FFFD a correct decoder finds in the stream (the server sent them)
    screen: Frames | None  # None: the page marked no element, or its tab was hidden
    text: str | None  # the element's text, only when the page opted in


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """A beacon read as far as its trace: enough to refuse it before checking the rest."""

    trace_id: str
    span_id: str
    doc: Mapping[str, Any]


def parse_beacon(body: bytes) -> Beacon:
    """The checked beacon in `body`; `BeaconError` naming the first problem otherwise."""
    return check_beacon(read_envelope(body))


def read_envelope(body: bytes) -> Envelope:
    """JSON, the schema and the traceparent of a beacon (its other fields are not looked at)."""
    if len(body) > MAX_BEACON_BYTES:
        raise BeaconError(f"beacon of {len(body)} bytes; at most {MAX_BEACON_BYTES}")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BeaconError(f"beacon is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BeaconError("beacon is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise BeaconError(f"beacon schema {_show(doc.get('schema'))}; expected {SCHEMA!r}")
    tp = _str(doc, "traceparent", 64)
    trace = parse_traceparent(tp)
    if trace is None:
        raise BeaconError(f"beacon traceparent {tp!r} is not a W3C traceparent")
    return Envelope(trace_id=trace.trace_id, span_id=trace.span_id, doc=doc)


def check_beacon(envelope: Envelope) -> Beacon:
    """Every field of a beacon checked for its type and bounds."""
    doc = envelope.doc
    how = _str(doc, "how", 16)
    if how not in ENDINGS:
        raise BeaconError(f"beacon how {how!r}; expected one of {', '.join(ENDINGS)}")
    reads = _reads(_obj(doc, "reads"))
    stream = _obj(doc, "stream")
    rt = doc.get("rt")
    if rt is not None and (not isinstance(rt, list) or len(rt) != 2):
        raise BeaconError("beacon rt: expected [requestStart, responseStart] or null")
    text = doc.get("text")
    if text is not None and not isinstance(text, str):
        raise BeaconError("beacon text: expected a string")
    screen = doc.get("screen")
    return Beacon(
        trace_id=envelope.trace_id,
        span_id=envelope.span_id,
        url=_str(doc, "url", 2048),
        t0_ms=_number(doc, "t0"),
        status=_count(doc, "status", 999),
        headers_ms=_tick_or_none(doc, "headers"),
        end_ms=_tick_or_none(doc, "end"),
        how=how,
        sent_ms=_ticks(doc, "sent"),
        request_start_ms=None if rt is None else _tick_or_none({"rt": rt[0]}, "rt"),
        response_start_ms=None if rt is None else _tick_or_none({"rt": rt[1]}, "rt"),
        reads=reads,
        stream_bytes=_count(stream, "bytes", where="stream"),
        stream_chars=_count(stream, "chars", where="stream"),
        stream_shown=_count(stream, "shown", where="stream"),
        stream_fffd=_count(stream, "fffd", where="stream"),
        screen=None if screen is None else _frames(_obj(doc, "screen")),
        text=None if text is None else text[:MAX_TEXT_CHARS],
    )


def _reads(o: Mapping[str, Any]) -> Reads:
    t = _column(o, "reads.t", None)
    n = len(t)
    chars = _column(o, "reads.chars", n)
    shown = _column(o, "reads.shown", n) if "shown" in o else chars
    alone = _column(o, "reads.alone", n) if "alone" in o else shown
    if min((*chars, *shown, *alone, *t), default=0) < 0:
        raise BeaconError("beacon reads: times and characters only grow")
    return Reads(
        t_ms=_times(t),
        bytes=tuple(_nonnegative(_column(o, "reads.bytes", n), "reads.bytes")),
        chars=tuple(accumulate(chars)),
        shown=tuple(accumulate(shown)),
        alone=tuple(accumulate(alone)),
        lost=_count(o, "lost", where="reads", default=0),
        step=max(1, _count(o, "step", MAX_ENTRIES, where="reads", default=1)),
    )


def _frames(o: Mapping[str, Any]) -> Frames:
    t = _column(o, "screen.t", None)
    n = len(t)
    if min(t, default=0) < 0:
        raise BeaconError("beacon screen.t: frames only move forward")
    painted = _times(t)
    raf = _nonnegative(_column(o, "screen.raf", n), "screen.raf")
    write = _column(o, "screen.write", n)
    chars = tuple(accumulate(_column(o, "screen.chars", n)))
    if min(chars, default=0) < 0:
        raise BeaconError("beacon screen.chars: an element cannot show fewer than 0 characters")
    fffd = _column(o, "screen.fffd", n) if "fffd" in o else [0] * n
    return Frames(
        t_ms=painted,
        raf_ms=tuple(p - r / TICKS_PER_MS for p, r in zip(painted, raf, strict=True)),
        write_ms=tuple(p - w / TICKS_PER_MS for p, w in zip(painted, write, strict=True)),
        chars=chars,
        tasks=tuple(_nonnegative(_column(o, "screen.tasks", n), "screen.tasks")),
        removed=tuple(_nonnegative(_column(o, "screen.removed", n), "screen.removed")),
        fffd=tuple(_nonnegative(fffd, "screen.fffd")),
        lost=_count(o, "lost", where="screen", default=0),
        step=max(1, _count(o, "step", MAX_ENTRIES, where="screen", default=1)),
        slow=_count(o, "slow", where="screen", default=0),
        paint_ms=_tick_or_none(o, "paint", where="screen"),
        present_ms=_tick_or_none(o, "present", where="screen"),
        plain=o.get("plain") is True,
    )


def _times(deltas: Sequence[int]) -> tuple[float, ...]:
    """Delta-coded ticks to milliseconds since t0 (x / 10: the nearest float to x ticks)."""
    return tuple(x / TICKS_PER_MS for x in accumulate(deltas))


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _obj(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise BeaconError(f"beacon {key}: expected an object, got {_show(value)}")
    return value


def _str(doc: Mapping[str, Any], key: str, longest: int) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or len(value) > longest:
        raise BeaconError(f"beacon {key}: expected a string of at most {longest} characters")
    return value


def _count(
    doc: Mapping[str, Any],
    key: str,
    most: int = MAX_TICKS,
    where: str = "",
    default: int | None = None,
) -> int:
    """A whole number 0-`most` at `key` (`default` when the key is absent, if there is one)."""
    if default is not None and key not in doc:
        return default
    value = doc.get(key)
    if type(value) is not int or not 0 <= value <= most:
        name = f"{where}.{key}" if where else key
        raise BeaconError(f"beacon {name}: expected a whole number 0-{most}, got {_show(value)}")
    return value


def _number(doc: Mapping[str, Any], key: str) -> float:
    value = doc.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1e14:
        raise BeaconError(f"beacon {key}: expected epoch milliseconds, got {_show(value)}")
    return float(value)


def _ticks(doc: Mapping[str, Any], key: str, where: str = "") -> float:
    return _count(doc, key, where=where) / TICKS_PER_MS


def _tick_or_none(doc: Mapping[str, Any], key: str, where: str = "") -> float | None:
    return None if doc.get(key) is None else round(_ticks(doc, key, where), 1)


def _column(o: Mapping[str, Any], name: str, length: int | None) -> list[int]:
    """The list `name` ("reads.t") of whole numbers, of `length` entries (None: any number up
    to MAX_ENTRIES)."""
    key = name.rpartition(".")[2]
    value = o.get(key)
    if not isinstance(value, list) or len(value) > MAX_ENTRIES:
        raise BeaconError(f"beacon {name}: expected a list of at most {MAX_ENTRIES} numbers")
    if length is not None and len(value) != length:
        raise BeaconError(f"beacon {name}: {len(value)} entries where the times have {length}")
    # checked in C (map, min, max): a full beacon has thousands of numbers, parsed on the loop
    if value and (
        set(map(type, value)) != {int} or min(value) <= -MAX_TICKS or max(value) >= MAX_TICKS
    ):
        raise BeaconError(f"beacon {name}: expected whole numbers only")
    return value


def _nonnegative(values: Sequence[int], name: str) -> Sequence[int]:
    if min(values, default=0) < 0:
        raise BeaconError(f"beacon {name}: expected no negative number")
    return values
