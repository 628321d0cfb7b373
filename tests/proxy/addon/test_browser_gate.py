"""Tests for hopmeter.proxy.addon.browser_gate: browser measuring built only once it is on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mitmproxy import ctx
from mitmproxy.test import taddons, tflow

from hopmeter.proxy.addon.browser_gate import BrowserGate, answered_here
from hopmeter.proxy.addon.browser_meter import BrowserMeter
from hopmeter.proxy.addon.ending import Through
from hopmeter.proxy.addon.meter import HopMeter


def snippet_request() -> tflow.http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = "GET"
    flow.request.path = "/_hopmeter/beacon.js?v=1"
    return flow


def test_while_off_nothing_is_built_and_requests_pass() -> None:
    """Option off: no BrowserMeter, the flow's end keeps its pass-through beacon link, and the
    snippet's path is an ordinary request (no response set, not answered here)."""
    meter = HopMeter()
    gate = BrowserGate(meter.ending)
    with taddons.context(meter, gate) as tctx:
        tctx.configure(meter, hopmeter_hop="edge")
        tctx.configure(gate, hopmeter_log_content=True)
        flow = snippet_request()
        gate.requestheaders(flow)
        gate.request(flow)
        assert gate.meter is None and isinstance(meter.ending.beacons, Through)
        assert flow.response is None and not answered_here(flow)


def test_turned_on_it_builds_the_meter_with_every_option_seen() -> None:
    """Option on: the gate builds one BrowserMeter on the same flow's end, configured with the
    options set before it existed (log content), and hands it the request hooks."""
    meter = HopMeter()
    gate = BrowserGate(meter.ending)
    with taddons.context(meter, gate) as tctx:
        tctx.configure(meter, hopmeter_hop="edge", hopmeter_log_content=True)
        tctx.configure(gate, hopmeter_browser=True)
        built = gate.meter
        assert isinstance(built, BrowserMeter) and built.enabled
        assert built.joins.log_content and meter.ending.beacons is built.joins
        flow = snippet_request()
        meter.requestheaders(flow)
        gate.requestheaders(flow)
        gate.request(flow)
        assert flow.response is not None and flow.response.status_code == 200
        assert answered_here(flow)
        ctx.options.update(hopmeter_browser=False)
        assert gate.meter is built and not built.enabled  # kept: records may wait in its joins


@pytest.mark.integration
def test_the_chain_imports_no_browser_measuring_until_it_is_on() -> None:
    """Loading hopmeter's addons and configuring them without the option imports neither the
    browser meter nor the joins it uses; turning the option on does."""
    browser = ("hopmeter.proxy.addon.browser_meter", "hopmeter.core.browser")
    code = (
        "import sys\n"
        "from mitmproxy.test import taddons\n"
        "from hopmeter.proxy.addon.chain import default_addons\n"
        "addons = default_addons()\n"
        "with taddons.context(*addons) as tctx:\n"
        f"    print([m for m in {browser!r} if m in sys.modules])\n"
        "    tctx.options.update(hopmeter_browser=True)\n"
        f"    print([m for m in {browser!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", str(list(browser))], done.stdout
