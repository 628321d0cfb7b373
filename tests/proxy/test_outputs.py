"""Tests for hopmeter.proxy.outputs: each output owns its option and observes only when on."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from hopmeter.core.record import FlowResult
from hopmeter.proxy.addon import HopMeter
from hopmeter.proxy.outputs import ConsoleOutput, MetricsOutput, OtelOutput, RecordsOutput


def result(n: int) -> FlowResult:
    """A finished flow's result with a minimal record."""
    return FlowResult(record={"schema": "hopmeter.flow/1", "n": n}, figures=None, tokens=None)


def test_records_output_writes_a_line_per_flow(tmp_path: Path) -> None:
    """With a records path, each observed flow is one JSON line; without one, nothing observes."""
    meter = HopMeter()
    out = RecordsOutput(meter)
    path = tmp_path / "r.jsonl"
    with taddons.context(meter, out) as tctx:
        assert out not in meter.observers
        tctx.configure(out, hopmeter_records=str(path))
        assert out in meter.observers
        out.observe(result(1))
        out.observe(result(2))
        tctx.configure(out, hopmeter_records="")
        assert out not in meter.observers
    assert [orjson.loads(line)["n"] for line in path.read_bytes().splitlines()] == [1, 2]


def test_records_output_refuses_an_unwritable_path(tmp_path: Path) -> None:
    """A records path that cannot be opened names itself and the flag that fixes it."""
    meter = HopMeter()
    out = RecordsOutput(meter)
    with (
        taddons.context(meter, out) as tctx,
        pytest.raises(exceptions.OptionsError, match="--records"),
    ):
        tctx.configure(out, hopmeter_records=str(tmp_path / "missing" / "r.jsonl"))


def test_console_output_checks_its_choices() -> None:
    """The console mode is one of its choices; a negative summary interval is refused."""
    meter = HopMeter()
    out = ConsoleOutput(meter)
    with taddons.context(meter, out) as tctx:
        with pytest.raises(exceptions.OptionsError, match="one of text, json, off"):
            tctx.configure(out, hopmeter_console="loud")
        with pytest.raises(exceptions.OptionsError, match="summary_interval"):
            tctx.configure(out, hopmeter_summary_interval="-1")
        tctx.options.set("hopmeter_summary_interval=0")
        assert out.console is not None
        tctx.configure(out, hopmeter_console="off")
        assert out in meter.observers and out.console is not None


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
