"""One small addon per place a finished flow goes: records, the console, Prometheus, OpenTelemetry.

Each owns its options (declared in `load` from the table of settings, hopmeter.proxy.options;
checked and applied in `configure`, as mitmproxy's own addons do), builds its exporter from
hopmeter.export, and is an observer of the HopMeter addon (hopmeter.export.FlowObserver) while it
has somewhere to write. The HopMeter addon guards every
call into them: an output that fails is counted as an internal error and the flow goes on.
Records and the console's JSON lines are handed to an outlet (hopmeter.proxy.addon.outlets):
written by a thread, dropped and counted when their queue is full, never waited for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from hopmeter.argtypes import parse_hostport
from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import BROWSER, SCREEN
from hopmeter.errors import OtelConfigError, PortError, UsageError
from hopmeter.export import FlowObserver
from hopmeter.export.console import MODES as CONSOLE_MODES
from hopmeter.export.console import Console
from hopmeter.export.outlets import STDOUT, Outlet, Outlets
from hopmeter.export.prometheus import Metrics, new_registry
from hopmeter.export.server import MetricsServer, serve
from hopmeter.log import get_logger
from hopmeter.proxy import options
from hopmeter.proxy.addon.observers import Observed
from hopmeter.proxy.addon.readiness import Readiness

if TYPE_CHECKING:
    from hopmeter.export.otel import OtelExporter

log = get_logger()

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PAINT_SEGMENT = f"{SCREEN}>{BROWSER}"  # its holds are the paint lags


class RecordsOutput(FlowObserver):
    """Appends one JSON line per finished flow to `hopmeter_records` ("-" = stdout), through
    its outlet: what cannot be written is counted there (`hopmeter_output_lost_lines_total`)."""

    def __init__(self, meter: Observed, outlets: Outlets) -> None:
        self.meter = meter
        self.outlets = outlets
        self.outlet: Outlet | None = None

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.RECORDS)

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_records" not in updated:
            return
        self._close()
        path = ctx.options.hopmeter_records
        if not path:
            return
        try:
            self.outlet = self.outlets.open("records", path)
        except OSError as exc:
            raise exceptions.OptionsError(
                f"cannot write records to {path}: {exc.strerror}; pick a writable path with "
                f"--records"
            ) from exc
        self.meter.add_observer(self)

    def observe(self, result: FlowResult) -> None:
        """Queue the record's line (its writer writes it)."""
        if self.outlet is not None:
            self.outlet.put(orjson.dumps(result.record) + b"\n")

    def done(self) -> None:
        self._close()

    def _close(self) -> None:
        self.meter.remove_observer(self)
        outlet, self.outlet = self.outlet, None
        if outlet is not None:
            self.outlets.release(outlet)


class ConsoleOutput(FlowObserver):
    """A line (or a JSON object) per finished flow, and a summary every so often: the text
    through the log, the JSON lines on standard output through an outlet."""

    def __init__(self, meter: Observed, outlets: Outlets) -> None:
        self.meter = meter
        self.outlets = outlets
        self.console: Console | None = None
        self.outlet: Outlet | None = None

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.CONSOLE)

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_console" not in updated and "hopmeter_summary_interval" not in updated:
            return
        mode = ctx.options.hopmeter_console
        if mode not in CONSOLE_MODES:  # `choices` shows in mitmproxy's UIs; nothing enforces it
            raise exceptions.OptionsError(
                f"hopmeter_console must be one of {', '.join(CONSOLE_MODES)}, got {mode!r}"
            )
        try:
            interval_s = options.read(ctx.options, "hopmeter_summary_interval")
        except UsageError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        running = self.console is not None and self.console.started
        self._stop()
        if mode == "json":
            self.outlet = self.outlets.open("console", STDOUT)
        self.console = Console(mode, interval_s, self.outlet.put if self.outlet else None)
        self.meter.add_observer(self)
        if running:
            self.console.start()

    def running(self) -> None:
        if self.console is not None:
            self.console.start()

    def observe(self, result: FlowResult) -> None:
        """Print the flow's line and count it in the window's summary."""
        if self.console is not None:
            self.console.observe(result)

    def done(self) -> None:
        self._stop()

    def _stop(self) -> None:
        self.meter.remove_observer(self)
        if self.console is not None:
            self.console.stop()
            self.console = None
        outlet, self.outlet = self.outlet, None
        if outlet is not None:
            self.outlets.release(outlet)


class MetricsOutput(FlowObserver):
    """Observes every finished flow into Prometheus metrics served on `hopmeter_metrics`, with
    /healthz and, given the proxy's `readiness`, /readyz beside them."""

    def __init__(
        self, meter: Observed, readiness: Readiness | None = None, outlets: Outlets | None = None
    ) -> None:
        self.meter = meter
        self.readiness = readiness
        self.outlets = outlets  # its outputs' losses and queues are on /metrics
        self.metrics: Metrics | None = None
        self.server: MetricsServer | None = None
        # how an error tells the user to choose another address or none: mitmproxy's `--set`
        # (`hopmeter run` says its flags: hopmeter.proxy.run.runner)
        self.setting = ("--set hopmeter_metrics=HOST:PORT", "--set hopmeter_metrics=off")

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.METRICS)

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_metrics" not in updated:
            return
        self._stop()
        spec = ctx.options.hopmeter_metrics.strip()
        if self.metrics is None:
            self.metrics = Metrics(new_registry())
            if self.outlets is not None:
                self.metrics.watch_outputs(self.outlets.states)
        self.meter.add_observer(self)
        if spec.lower() in ("", "off", "none"):
            return
        try:
            host, port = parse_hostport(spec, "hopmeter_metrics")
        except UsageError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        if host not in LOOPBACK:
            log.warning(
                "hopmeter: WARNING the metrics endpoint listens beyond this host; it "
                "exposes traffic volumes and model names",
                address=f"{host}:{port}",
            )
        if not ctx.options.server:  # `mitmdump -n` (reading a flow file): no proxy to watch
            return
        try:
            ready = self.readiness.answer if self.readiness is not None else None
            choose, off = self.setting
            self.server = serve(self.metrics, host, port, ready, choose=choose, off=off)
        except PortError as exc:
            raise exceptions.OptionsError(str(exc)) from None

    def done(self) -> None:
        self.meter.remove_observer(self)
        self._stop()

    def _stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def observe(self, result: FlowResult) -> None:
        """One finished flow, and the holds of each segment when it is a trace's outermost."""
        if self.metrics is None:
            return
        paint = next((s.holds_s for s in result.segments if s.segment == PAINT_SEGMENT), None)
        self.metrics.observe_result(result, paint_lags=paint)
        trace_id = result.record.get("trace_id")
        for seg in result.segments:
            self.metrics.observe_segment(seg, trace_id)

    def internal_error(self, where: str) -> None:
        """A measuring bug was caught."""
        if self.metrics is not None:
            self.metrics.internal_error(where)

    def beacon(self, outcome: str) -> None:
        """A browser beacon was joined, refused or missed."""
        if self.metrics is not None:
            self.metrics.beacon(outcome)

    def stream_started(self) -> None:
        """A response started."""
        if self.metrics is not None:
            self.metrics.stream_started()

    def stream_finished(self) -> None:
        """A response ended, however."""
        if self.metrics is not None:
            self.metrics.stream_finished()


class OtelOutput(FlowObserver):
    """One OpenTelemetry span per finished flow, to `hopmeter_otel_endpoint` over OTLP/HTTP."""

    def __init__(self, meter: Observed) -> None:
        self.meter = meter
        self.exporter: OtelExporter | None = None

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.OTEL)

    def configure(self, updated: set[str]) -> None:
        if updated & {"hopmeter_otel_endpoint", "hopmeter_otel_timeline"}:
            self._set(ctx.options.hopmeter_otel_endpoint.strip())

    def observe(self, result: FlowResult) -> None:
        """Export the flow's span (batched on the exporter's own thread)."""
        if self.exporter is not None:
            self.exporter.observe(result)

    def done(self) -> None:
        self._set("")

    def _set(self, endpoint: str) -> None:
        self.meter.remove_observer(self)
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
        if not endpoint:
            return
        try:
            from hopmeter.export.otel import OtelExporter  # noqa: PLC0415 - an optional extra
        except ImportError as exc:
            raise exceptions.OptionsError(
                f"hopmeter_otel_endpoint needs the OpenTelemetry extra: pip install "
                f"'hopmeter[otel]' ({exc})"
            ) from None
        try:
            self.exporter = OtelExporter(endpoint, timeline=ctx.options.hopmeter_otel_timeline)
        except OtelConfigError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        self.meter.add_observer(self)
