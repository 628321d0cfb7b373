"""Tests for hopmeter.proxy.addon.outputs: each output owns its option and observes only when on."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from hopmeter.core.record import FlowResult
from hopmeter.export.outlets import Outlets
from hopmeter.export.prometheus import exported_names
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.outputs import ConsoleOutput, MetricsOutput, OtelOutput, RecordsOutput


def result(n: int) -> FlowResult:
    """A finished flow's result with a minimal record."""
    return FlowResult(record={"schema": "hopmeter.flow/1", "n": n}, figures=None, tokens=None)


def test_records_output_writes_a_line_per_flow(tmp_path: Path) -> None:
    """With a records path, each observed flow is one JSON line, written by the outlets' writer;
    without one, nothing observes."""
    meter, outlets = HopMeter(), Outlets()
    out = RecordsOutput(meter, outlets)
    path = tmp_path / "r.jsonl"
    with taddons.context(meter, out) as tctx:
        assert out not in meter.observers
        tctx.configure(out, hopmeter_records=str(path))
        assert out in meter.observers
        out.observe(result(1))
        out.observe(result(2))
        tctx.configure(out, hopmeter_records="")
        assert out not in meter.observers
    outlets.close(time.monotonic() + 10)
    assert [orjson.loads(line)["n"] for line in path.read_bytes().splitlines()] == [1, 2]
    (state,) = outlets.states()
    assert (state.output, state.written) == ("records", 2)


def test_records_to_a_full_disk_are_counted_lost_and_the_flow_goes_on() -> None:
    """A records file that cannot take a line (/dev/full) costs the observer nothing: the line is
    lost under `enospc`, and no error reaches the measuring addon."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    meter, outlets = HopMeter(), Outlets()
    out = RecordsOutput(meter, outlets)
    with taddons.context(meter, out) as tctx:
        tctx.configure(out, hopmeter_records="/dev/full")
        out.observe(result(1))
        tctx.configure(out, hopmeter_records="")
    outlets.close(time.monotonic() + 10)
    (state,) = outlets.states()
    assert state.written == 0 and state.lost["enospc"] == 1


def test_records_output_refuses_an_unwritable_path(tmp_path: Path) -> None:
    """A records path that cannot be opened names itself and the flag that fixes it."""
    meter = HopMeter()
    out = RecordsOutput(meter, Outlets())
    with (
        taddons.context(meter, out) as tctx,
        pytest.raises(exceptions.OptionsError, match="--records"),
    ):
        tctx.configure(out, hopmeter_records=str(tmp_path / "missing" / "r.jsonl"))


def test_console_json_lines_go_to_standard_output_through_an_outlet(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """In json mode each flow is one line on standard output, written by the outlet's thread and
    counted as the `console` output; the outlet is released when the mode changes."""
    meter, outlets = HopMeter(), Outlets()
    out = ConsoleOutput(meter, outlets)
    with taddons.context(meter, out) as tctx:
        tctx.configure(out, hopmeter_console="json", hopmeter_summary_interval="0")
        assert out.outlet is not None
        rec = {"schema": "hopmeter.flow/1", "hop": "edge", "request": {"path": "/v1/x"}}
        out.observe(FlowResult(record=rec, figures=None, tokens=None))
        tctx.configure(out, hopmeter_console="text")
        assert out.outlet is None
    outlets.close(time.monotonic() + 10)
    (line,) = capfd.readouterr().out.splitlines()
    assert orjson.loads(line)["hop"] == "edge" and orjson.loads(line)["path"] == "/v1/x"
    (state,) = outlets.states()
    assert (state.output, state.written) == ("console", 1)


def test_console_output_checks_its_choices() -> None:
    """The console mode is one of its choices; a negative summary interval is refused."""
    meter = HopMeter()
    out = ConsoleOutput(meter, Outlets())
    with taddons.context(meter, out) as tctx:
        with pytest.raises(exceptions.OptionsError, match="one of text, json, off"):
            tctx.configure(out, hopmeter_console="loud")
        with pytest.raises(exceptions.OptionsError, match="summary_interval"):
            tctx.configure(out, hopmeter_summary_interval="-1")
        tctx.options.set("hopmeter_summary_interval=0")
        assert out.console is not None
        tctx.configure(out, hopmeter_console="off")
        assert out in meter.observers and out.console is not None


def test_metrics_output_exposes_the_outputs_it_is_given() -> None:
    """The outlets handed to the metrics output are on its registry: lines lost, written, held."""
    meter, outlets = HopMeter(), Outlets()
    outlets.open("log", "-")
    out = MetricsOutput(meter, outlets=outlets)
    with taddons.context(meter, out) as tctx:
        tctx.configure(out, hopmeter_metrics="off")
        assert out.metrics is not None
        samples = {
            (s.name, tuple(sorted(s.labels.items())))
            for family in out.metrics.registry.collect()
            for s in family.samples
        }
    outlets.close(time.monotonic() + 10)
    assert {"hopmeter_output_queued_bytes", "hopmeter_output_written_lines_total"} <= set(
        exported_names(out.metrics.registry)
    )
    assert (
        "hopmeter_output_lost_lines_total",
        (("output", "log"), ("reason", "queue_full")),
    ) in samples


def test_metrics_output_counts_without_an_endpoint() -> None:
    """`hopmeter_metrics=off` still keeps the instruments; no server is started."""
    meter = HopMeter()
    out = MetricsOutput(meter)
    with taddons.context(meter, out) as tctx:
        tctx.configure(out, hopmeter_metrics="off")
        assert out.server is None and out.metrics is not None
        out.internal_error("response_tap")
        with pytest.raises(exceptions.OptionsError, match="HOST:PORT"):
            tctx.configure(out, hopmeter_metrics="nowhere:port")


def test_otel_output_refuses_a_non_http_endpoint() -> None:
    """An OTLP endpoint that is not an http(s) URL is refused at configure time."""
    meter = HopMeter()
    out = OtelOutput(meter)
    with (
        taddons.context(meter, out) as tctx,
        pytest.raises(exceptions.OptionsError, match="not an http"),
    ):
        tctx.configure(out, hopmeter_otel_endpoint="collector:4318")
    assert out not in meter.observers


@pytest.mark.loopback
def test_otel_output_builds_its_exporter_with_or_without_the_timeline() -> None:
    """hopmeter_otel_timeline (on by default) reaches the exporter; changing it rebuilds it."""
    meter = HopMeter()
    out = OtelOutput(meter)
    with taddons.context(meter, out) as tctx:
        tctx.configure(out, hopmeter_otel_endpoint="http://127.0.0.1:4318")
        assert out.exporter is not None and out.exporter.timeline is True
        tctx.configure(out, hopmeter_otel_timeline=False)
        assert out.exporter is not None and out.exporter.timeline is False
        assert out in meter.observers
        tctx.configure(out, hopmeter_otel_endpoint="")
        assert out.exporter is None and out not in meter.observers


@pytest.mark.loopback
def test_a_taken_metrics_port_names_mitmproxys_setting_in_mitmproxy() -> None:
    """In a user's mitmdump a taken port's error says how to set another there (`--set
    hopmeter_metrics=...`; `hopmeter run` says its `--metrics` flag instead)."""
    meter = HopMeter()
    out = MetricsOutput(meter)
    with socket.socket() as taken, taddons.context(meter, out) as tctx:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            with pytest.raises(exceptions.OptionsError) as info:
                tctx.configure(out, hopmeter_metrics=f"127.0.0.1:{port}")
        finally:
            out.done()  # mitmproxy rolled the option back: the default's endpoint is up again
        message = str(info.value)
        assert f"metrics port {port} on 127.0.0.1 is already in use" in message
        assert "--set hopmeter_metrics=HOST:PORT" in message
        assert "--set hopmeter_metrics=off" in message and "--metrics" not in message


def test_no_proxy_server_no_metrics_endpoint() -> None:
    """`mitmdump -n` (reading a flow file) runs no proxy: nothing is bound (so it never clashes
    with a running instance's port), and the flows read are still counted."""
    meter = HopMeter()
    out = MetricsOutput(meter)
    with taddons.context(meter, out) as tctx:
        tctx.options.update(server=False)
        tctx.configure(out, hopmeter_metrics="127.0.0.1:0")
        assert out.server is None and out.metrics is not None
