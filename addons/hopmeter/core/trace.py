"""W3C Trace Context (`traceparent`): the id that ties one request's flows at several hops."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hopmeter.core.vocab import TraceReceived

# https://www.w3.org/TR/trace-context/#traceparent-header-field-values: version "00" has exactly
# four fields; a higher version may append more after a dash, which are ignored.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceContext:
    """A trace id, the parent span id and flags; `created` when hopmeter made it up, and
    `received` what came in `traceparent` (absent or malformed when it was made up)."""

    trace_id: str
    span_id: str
    flags: str
    created: bool = False
    received: TraceReceived = TraceReceived.VALID

    def header(self) -> str:
        """The `traceparent` header value (version 00, whatever version came in)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self, span_id: str) -> TraceContext:
        """The context a hop forwards with its own span `span_id` as the parent."""
        return TraceContext(trace_id=self.trace_id, span_id=span_id, flags=self.flags)


def parse_traceparent(value: str) -> TraceContext | None:
    """The context in a `traceparent` header, or None when it is not valid per the spec."""
    m = _TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceContext(trace_id=trace_id, span_id=span_id, flags=flags)
