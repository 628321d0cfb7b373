"""A flow's token timeline as span attributes, and back: what a join needs to travel over OTLP.

A hop join needs, for every event that carried tokens, when it arrived (an offset from the
request start), the visible content offset it reached and how many tokens it carried
(docs/design.md §5). They travel as homogeneous integer arrays, the one attribute shape that no
SDK value-length limit and no backend string limit truncates (OpenTelemetry common/README.md,
"Attribute Limits": only strings are cut; Tempo's max_attribute_bytes only cuts strings):

  hopmeter.timeline.t_us     int[]  arrival of each token-carrying event, µs since the span start
  hopmeter.timeline.offset   int[]  content offset (visible characters so far) after that event
  hopmeter.timeline.tokens   int[]  tokens each event carried; absent when every one carried 1
  hopmeter.timeline.out_us   int[]  when each event left this hop's process (µs since the span
                                    start; -1 where it was not followed); absent when none was
  hopmeter.timeline.dropped  int    token events left out (past the cap, or past the record's)
  hopmeter.timeline.span_us  int    first to last token event, µs, of the whole stream: only when
                                    events were left out (the whole-body test needs the real span)
  hopmeter.timeline.v        int    format version

Only token-carrying events are kept (alignment ignores the others). Past the cap the head is
kept: alignment by content offset stays exact for every kept token, while down-sampling would move
inner tokens to later outer events and bias every hold upward.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import le
from typing import Any

from hopmeter.errors import TimelineError

PREFIX = "hopmeter.timeline."
T_US = PREFIX + "t_us"
OFFSET = PREFIX + "offset"
TOKENS = PREFIX + "tokens"
OUT_US = PREFIX + "out_us"
DROPPED = PREFIX + "dropped"
SPAN_US = PREFIX + "span_us"
VERSION = PREFIX + "v"
FORMAT_VERSION = 1

# Token events a span carries. 12 B an event in protobuf, so 1,024 is ~13 KB a span, and 128
# spans a batch stay near 1.7 MB, far below a Collector's 4 MiB gRPC and 20 MiB HTTP limits;
# the SDK spends ~3 µs an element encoding it (measured; docs/fleet.md).
MAX_EVENTS = 1024
# Longer arrays are refused by a receiver as absurd: 16x the cap, room for other senders.
HARD_MAX_EVENTS = 16_384
# Values must fit in int32 (the receiver keeps them as array('i')): 35.8 minutes of µs.
MAX_VALUE = 2**31 - 1
MAX_TOKENS_PER_EVENT = 1_000_000  # a whole reply reconciled into one event, with room


def encode(
    events: Sequence[Sequence[Any]],
    events_dropped: int = 0,
    cap: int = MAX_EVENTS,
    out_s: Sequence[float | None] = (),
) -> dict[str, Any]:
    """Span attributes for a record's `events` ([t_offset_s, tokens, content_offset], ...);
    `out_s`, when given, is when each of those events left the hop (hopmeter.core.hops.events_out).
    """
    token = [len(e) >= 3 and type(e[1]) is int and e[1] > 0 for e in events]
    kept = [(e[0], e[1], e[2]) for e, keep in zip(events, token, strict=True) if keep]
    outs = [o for o, keep in zip(out_s, token, strict=True) if keep] if out_s else []
    dropped = max(0, int(events_dropped)) + max(0, len(kept) - cap)
    attrs: dict[str, Any] = {VERSION: FORMAT_VERSION}
    if kept and dropped:
        attrs[SPAN_US] = round((kept[-1][0] - kept[0][0]) * 1e6)
    kept = kept[:cap]
    attrs[T_US] = [round(t * 1e6) for t, _, _ in kept]
    attrs[OFFSET] = [int(c) for _, _, c in kept]
    if any(k != 1 for _, k, _ in kept):
        attrs[TOKENS] = [k for _, k, _ in kept]
    outs = outs[:cap]
    if any(o is not None for o in outs):
        attrs[OUT_US] = [-1 if o is None else max(0, round(o * 1e6)) for o in outs]
    if dropped:
        attrs[DROPPED] = dropped
    return attrs


@dataclass(frozen=True, slots=True)
class Timeline:
    """A decoded timeline, compact: 8 bytes an event (12 with per-event tokens)."""

    t_us: array[int]
    offset: array[int]
    tokens: array[int] | None  # None: one token per event
    dropped: int
    span_us: int | None  # the whole stream's token span when events were left out
    out_us: array[int] | None = None  # when each event left the hop; -1: not followed

    def outs(self) -> list[float | None]:
        """When each event left the hop, seconds since the span start, aligned with `events()`;
        empty when the hop did not follow its bytes out."""
        if self.out_us is None:
            return []
        return [None if o < 0 else o / 1e6 for o in self.out_us]

    def __len__(self) -> int:
        return len(self.t_us)

    def events(self) -> list[list[float]]:
        """The record's `events` shape: [t_offset_s, tokens, content_offset]."""
        tokens = self.tokens if self.tokens is not None else [1] * len(self.t_us)
        return [[t / 1e6, k, c] for t, k, c in zip(self.t_us, tokens, self.offset, strict=True)]

    def nbytes(self) -> int:
        """Bytes the arrays hold."""
        arrays = (self.t_us, self.offset, self.tokens or array("i"))
        return sum(a.itemsize * len(a) for a in arrays)


def decode(attrs: Mapping[str, Any]) -> Timeline | None:
    """The timeline in a span's attributes; None when it carries none; TimelineError if absurd."""
    if T_US not in attrs and OFFSET not in attrs:
        return None
    version = attrs.get(VERSION, FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise TimelineError(f"{VERSION} {version!r} is not {FORMAT_VERSION}")
    t_us = _ints(T_US, attrs.get(T_US), MAX_VALUE)
    offset = _ints(OFFSET, attrs.get(OFFSET), MAX_VALUE)
    if len(t_us) != len(offset):
        raise TimelineError(f"{T_US} and {OFFSET} differ in length ({len(t_us)}, {len(offset)})")
    tokens = None
    if TOKENS in attrs:
        tokens = _ints(TOKENS, attrs[TOKENS], MAX_TOKENS_PER_EVENT)
        if len(tokens) != len(t_us) or (tokens and min(tokens) < 1):
            raise TimelineError(f"{TOKENS} is not one count of 1 or more per event")
    if not (_rising(t_us) and _rising(offset)):
        raise TimelineError("the timeline goes back in time or in content")
    out_us = None
    if OUT_US in attrs:
        out_us = _ints(OUT_US, attrs[OUT_US], MAX_VALUE, low=-1)
        if len(out_us) != len(t_us):
            raise TimelineError(f"{OUT_US} is not one time per event")
    return Timeline(
        t_us=t_us,
        offset=offset,
        tokens=tokens,
        dropped=_count(DROPPED, attrs.get(DROPPED, 0)),
        span_us=_count(SPAN_US, attrs[SPAN_US]) if SPAN_US in attrs else None,
        out_us=out_us,
    )


def _ints(name: str, value: object, limit: int, low: int = 0) -> array[int]:
    """A list of ints low..limit as a compact array; TimelineError for anything else."""
    if not isinstance(value, list | tuple):
        raise TimelineError(f"{name} is not an array")
    if len(value) > HARD_MAX_EVENTS:
        raise TimelineError(f"{name} has {len(value)} elements (at most {HARD_MAX_EVENTS})")
    if not set(map(type, value)) <= {int}:  # bools and floats too are refused
        raise TimelineError(f"{name} holds something other than integers")
    try:
        out = array("i", value)  # C conversion; past int32 raises OverflowError
    except OverflowError:
        raise TimelineError(f"{name} holds a value out of range") from None
    if out and (min(out) < low or max(out) > limit):
        raise TimelineError(f"{name} holds a value out of range")
    return out


def _rising(values: array[int]) -> bool:
    return all(map(le, values, values[1:]))


def _count(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_VALUE:
        raise TimelineError(f"{name} is not a count")
    return value
