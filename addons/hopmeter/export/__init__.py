"""Where finished flows go: Prometheus, OpenTelemetry, record files, the console. No mitmproxy.

Every destination is a `FlowObserver`: the proxy layer hands it each finished flow and tells it
when streams start and end and when measuring failed. An observer may raise; the proxy layer
counts that as an internal error and goes on, so one broken destination never costs a flow or
another destination.
"""

from __future__ import annotations

from typing import Protocol

from hopmeter.core.record import FlowResult


class FlowObserver(Protocol):
    """Receives finished flows; the stream and error notices do nothing unless overridden."""

    def observe(self, result: FlowResult) -> None:
        """One finished flow (a trace's outermost flow carries the trace's hops)."""
        ...

    def stream_started(self) -> None:
        """A response began streaming through a listener."""
        return

    def stream_finished(self) -> None:
        """A response that began streaming has ended, however it ended."""
        return

    def internal_error(self, where: str) -> None:
        """A bug in measuring was caught at `where`; the flow went on unmeasured."""
        return

    def beacon(self, outcome: str) -> None:
        """A browser beacon was joined, refused or missed (a hopmeter.core.vocab.BeaconOutcome)."""
        return
