"""Wires Prometheus metrics (hopmeter.export.prometheus) to the HopMeter addon and serves them."""

from __future__ import annotations

from typing import Any

from mitmproxy import ctx, exceptions

from hopmeter.core.record import FlowResult
from hopmeter.errors import UsageError
from hopmeter.log import get_logger
from hopmeter.proxy.addon import HopMeter
from hopmeter.proxy.config import parse_hostport

log = get_logger()


class MetricsAddon:
    """Observes every finished flow into Prometheus metrics served on `hopmeter_metrics`."""

    def __init__(self, meter: HopMeter) -> None:
        self.meter = meter
        self.metrics: Any = None
        self.server: Any = None
        meter.observers.append(self)

    def load(self, loader: Any) -> None:
        loader.add_option(
            "hopmeter_metrics",
            str,
            "127.0.0.1:9464",
            'Prometheus endpoint HOST:PORT (/metrics, /healthz), or "off".',
        )

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_metrics" not in updated:
            return
        from hopmeter.export.prometheus import Metrics, MetricsPortError, new_registry, serve  # noqa: PLC0415

        self._stop()
        spec = ctx.options.hopmeter_metrics.strip()
        if self.metrics is None:
            self.metrics = Metrics(new_registry())
        if spec.lower() in ("", "off", "none"):
            return
        try:
            host, port = parse_hostport(spec, "hopmeter_metrics")
        except UsageError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning(
                "hopmeter: WARNING the metrics endpoint listens beyond this host; it "
                "exposes traffic volumes and model names",
                address=f"{host}:{port}",
            )
        try:
            self.server = serve(self.metrics, host, port)
        except MetricsPortError as exc:
            raise exceptions.OptionsError(str(exc)) from None

    def done(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    # observer protocol of HopMeter
    def observe(self, result: FlowResult) -> None:
        """One finished flow, and the holds of each segment when it is a trace's outermost."""
        if self.metrics is not None:
            self.metrics.observe_flow(
                result.record,
                gaps=result.figures.gaps if result.figures is not None else None,
                event_tokens=result.tokens.per_event if result.tokens is not None else None,
            )
            for seg in result.segments:
                self.metrics.observe_holds(seg.segment, seg.holds_s, result.record.get("trace_id"))

    def internal_error(self, where: str) -> None:
        """A measuring bug was caught."""
        if self.metrics is not None:
            self.metrics.internal_error(where)

    def stream_started(self) -> None:
        """A response started."""
        if self.metrics is not None:
            self.metrics.stream_started()

    def stream_finished(self) -> None:
        """A response ended, however."""
        if self.metrics is not None:
            self.metrics.stream_finished()
