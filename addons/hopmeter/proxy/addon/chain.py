"""The addons hopmeter loads, in order: the same list in `hopmeter run` (at the place
`mitmdump -s` loads scripts) and in a user's own mitmproxy (`proxy/mitmdump/script.py`)."""

from __future__ import annotations

from typing import Any

from hopmeter.proxy.addon.browser_gate import BrowserGate
from hopmeter.proxy.addon.guard import UpstreamGuard
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.outlets import OutputQueues
from hopmeter.proxy.addon.outputs import ConsoleOutput, MetricsOutput, OtelOutput, RecordsOutput
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.addon.ui import HopView


def default_addons(queues: OutputQueues | None = None, *, views: bool = True) -> list[Any]:
    """The addons hopmeter runs, in order (`hopmeter run` and `mitmdump -s` load the same):
    the measuring addon, the upstream guard (after it: it reads the stream tap the measuring
    addon installs), the readiness check, browser measuring (idle unless `hopmeter_browser`),
    then the outputs that observe the measuring addon, then what mitmweb and the console show
    (idle elsewhere), and last the owner of the outputs' queues (its `done` writes what the
    others' `done` left queued). `queues` is the runner's, when it routes its log through them;
    `views` False leaves out the content views (`hopmeter run`: hopmeter.proxy.addon.ui)."""
    meter = HopMeter()
    readiness = Readiness()
    queues = queues if queues is not None else OutputQueues()
    outlets = queues.outlets
    outputs = [
        MetricsOutput(meter, readiness, outlets),
        RecordsOutput(meter, outlets),
        ConsoleOutput(meter, outlets),
        OtelOutput(meter),
        HopView(meter.ending, views=views),
    ]
    guard = UpstreamGuard(meter, readiness)
    return [meter, guard, readiness, BrowserGate(meter.ending), *outputs, queues]
