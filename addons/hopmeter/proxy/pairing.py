"""Live pairing of the flows one trace makes through several listeners of this process.

The outermost flow of a trace (the one whose request started first) is written last, with a
`hops` section, once every other flow of the trace has finished: the inner flows usually finish
first (the inner hop sees the end of the body before the outer one), so the wait is short; a
bounded timeout writes it without waiting longer.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from hopmeter.core.hops import Segment, chain
from hopmeter.core.record import FlowResult

# Traces tracked at once. A trace is forgotten when its last flow finishes; this bound only
# matters if flows are never finished (it drops the oldest).
MAX_TRACES = 8192
# How long the outer record waits for inner flows that have not finished. An inner flow finishes
# before the outer one unless something between them is broken; 30 s covers a slow tail.
PARK_TIMEOUT_S = 30.0


@dataclass(slots=True)
class _Trace:
    live_starts: list[float] = field(default_factory=list)  # request starts of flows in flight
    done: list[FlowResult] = field(default_factory=list)
    parked: FlowResult | None = None


class Pairing:
    """Groups finished flows by trace id and attaches per-segment holds to the outermost."""

    def __init__(
        self,
        schedule: Callable[[float, Callable[[], None]], object] | None = None,
        emit: Callable[[FlowResult], None] | None = None,
    ) -> None:
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._schedule = schedule
        self._emit = emit

    def start(self, trace_id: str, t_start: float) -> None:
        """A flow of `trace_id` began (its request started at `t_start`)."""
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _Trace()
            while len(self._traces) > MAX_TRACES:
                self._traces.popitem(last=False)
        trace.live_starts.append(t_start)

    def finish(self, result: FlowResult) -> list[FlowResult]:
        """A flow finished: the records that can be written now, in order."""
        trace_id = result.record.get("trace_id")
        trace = self._traces.get(trace_id) if isinstance(trace_id, str) else None
        if trace is None or not isinstance(trace_id, str):
            return [result]
        t_start = result.record["request"]["t_start"]
        if t_start in trace.live_starts:
            trace.live_starts.remove(t_start)
        trace.done.append(result)
        if trace.live_starts:
            if t_start < min(trace.live_starts) and trace.parked is None:
                # the outer flow ended first: wait for the inner ones before writing it
                trace.parked = result
                if self._schedule is not None:
                    self._schedule(PARK_TIMEOUT_S, lambda: self._expire(trace_id))
                return []
            return [] if result is trace.parked else [result]
        return self._close(trace_id, result)

    def _close(self, trace_id: str, last: FlowResult) -> list[FlowResult]:
        trace = self._traces.pop(trace_id)
        out = [r for r in (trace.parked, last) if r is not None]
        if len(trace.done) < 2:
            return out
        outer = min(trace.done, key=lambda r: r.record["request"]["t_start"])
        segments = chain([r.record for r in trace.done])
        with_hops = attach(outer, segments)
        return [with_hops if r is outer else r for r in out] if outer in out else out

    def drain(self) -> None:
        """Write every parked record now (the proxy is stopping)."""
        for trace_id in list(self._traces):
            self._expire(trace_id)
        self._traces.clear()

    def _expire(self, trace_id: str) -> None:
        trace = self._traces.get(trace_id)
        if trace is None or trace.parked is None:
            return
        parked, trace.parked = trace.parked, None
        trace.done.remove(parked)
        segments = chain([r.record for r in [parked, *trace.done]])
        if self._emit is not None:
            self._emit(attach(parked, segments))


def attach(outer: FlowResult, segments: list[Segment]) -> FlowResult:
    """`outer` with its record's `hops` section and the per-token holds for metrics."""
    if not segments:
        return outer
    record = {**outer.record, "hops": [s.as_dict() for s in segments]}
    return dataclasses.replace(outer, record=record, segments=tuple(segments))
