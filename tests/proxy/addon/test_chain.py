"""Tests for hopmeter.proxy.addon.chain: the addons hopmeter loads, in order, and one flow
through all of them in mitmproxy's test context."""

from __future__ import annotations

from pathlib import Path

import orjson
from mitmproxy import hooks
from mitmproxy.test import taddons, tflow

from hopmeter.proxy.addon.browser_gate import BrowserGate
from hopmeter.proxy.addon.chain import default_addons
from hopmeter.proxy.addon.guard import UpstreamGuard
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.outlets import OutputQueues
from hopmeter.proxy.addon.outputs import ConsoleOutput, MetricsOutput, OtelOutput, RecordsOutput
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.addon.ui import HopView
from hopmeter.proxy.run.drain import Drain
from hopmeter.proxy.run.runner import FreezeAtStart
from tests.harness.procs import wait_for

SSE = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"model":"gpt-4o"}\n\n'
DONE = b"data: [DONE]\n\n"


def test_the_measuring_addon_comes_first_then_one_output_each() -> None:
    """The list is the HopMeter addon, the upstream guard (it reads the tap HopMeter installs)
    and the readiness check, then browser measuring, metrics, records, console, spans and what
    mitmweb shows, each with that same HopMeter (or its flow's end), and last the owner of the
    outputs' queues that metrics, records and console share; nothing that changes the whole
    process is in it (the drain, which takes the signals, is `hopmeter run`'s alone)."""
    meter, guard, readiness, *outputs, queues = default_addons()
    assert type(meter) is HopMeter
    assert (type(guard), type(readiness)) == (UpstreamGuard, Readiness)
    assert guard.meter is meter and guard.readiness is readiness
    assert outputs[1].readiness is readiness  # /readyz is served beside /metrics
    assert [type(o) for o in outputs] == [
        BrowserGate,
        MetricsOutput,
        RecordsOutput,
        ConsoleOutput,
        OtelOutput,
        HopView,
    ]
    browser, *observers, view = outputs
    assert browser.ending is view.ending is meter.ending  # they hold records in its flow's end
    assert all(o.meter is meter for o in observers)
    assert type(queues) is OutputQueues
    assert all(o.outlets is queues.outlets for o in outputs[1:4])
    everything = [meter, guard, readiness, *outputs, queues]
    assert not any(isinstance(a, FreezeAtStart | Drain) for a in everything)


def test_every_output_that_is_on_gets_the_flow(tmp_path: Path) -> None:
    """Loaded together and configured, each output that has somewhere to write observes the
    meter, and one streamed flow reaches the records file and the metrics."""
    addons = default_addons()
    meter, _guard, _readiness, _browser, metrics, records, console, _otel, _view, _queues = addons
    path = tmp_path / "records.jsonl"
    with taddons.context(*addons) as tctx:
        tctx.options.update(
            hopmeter_hop="edge",
            hopmeter_records=str(path),
            hopmeter_metrics="off",
            hopmeter_console="off",
        )
        assert list(meter.observers) == [metrics, records, console]  # no OTel endpoint: no spans
        flow = tflow.tflow(resp=True)
        flow.request.path = "/v1/chat/completions"
        flow.response.headers["content-type"] = "text/event-stream"
        flow.response.content = None
        meter.requestheaders(flow)
        meter.responseheaders(flow)
        tap = flow.response.stream
        assert callable(tap)
        for chunk in (SSE, DONE, b""):
            tap(chunk)
        meter.response(flow)
        (line,) = wait_for(lambda: path.read_bytes().splitlines(), what="the record")
        assert orjson.loads(line)["hop"] == "edge"
        assert metrics.metrics is not None
        flows = metrics.metrics.registry.get_sample_value(
            "hopmeter_flows_total",
            {
                "hop": "edge",
                "api": "openai.chat",
                "model": "gpt-4o",
                "route": "/v1/chat/completions",
                "status_class": "2xx",
                "ended": "complete",
            },
        )
        assert flows == 1.0
        tctx.master.addons.trigger(hooks.DoneHook())
        assert records.outlet is None and records not in meter.observers  # the file is closed
