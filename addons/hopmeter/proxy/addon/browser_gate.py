"""Browser measuring's place in the chain, loaded only when it is on.

`BrowserGate` declares `hopmeter_browser` and, once it is on, imports and builds the
`BrowserMeter` (hopmeter.proxy.addon.browser_meter: the snippet, the beacon endpoint, the joins and
what they import, ~1 MiB of modules a proxy without `--browser` never runs) and hands it its
hooks. The paths hopmeter answers itself, and `answered_here`, which the measuring addon and the
upstream guard read on every request, are here: they need none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from hopmeter.proxy import options

if TYPE_CHECKING:
    from hopmeter.proxy.addon.browser_meter import BrowserMeter
    from hopmeter.proxy.addon.ending import Ending

SNIPPET_PATH = "/_hopmeter/beacon.js"
BEACON_PATH = "/_hopmeter/beacon"
OWN_PATHS = (SNIPPET_PATH, BEACON_PATH)


def path_of(flow: http.HTTPFlow) -> str:
    """The request's path without its query."""
    return flow.request.path.split("?", 1)[0]


def answered_here(flow: http.HTTPFlow) -> bool:
    """Whether hopmeter answers this request itself (browser measuring on, one of its two
    paths): never measured, never forwarded, no upstream to wait for. Read from the option, so
    the measuring addon and the upstream guard need no handle on browser measuring."""
    return bool(getattr(ctx.options, "hopmeter_browser", False)) and path_of(flow) in OWN_PATHS


class BrowserGate:
    """Declares `hopmeter_browser`; builds the `BrowserMeter` the first time it is on, and from
    then on passes it every hook it has (it stays: records may be waiting in its joins)."""

    def __init__(self, ending: Ending) -> None:
        self.ending = ending
        self.meter: BrowserMeter | None = None

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.BROWSER)

    def configure(self, updated: set[str]) -> None:
        if self.meter is None:
            if not ctx.options.hopmeter_browser:
                return
            from hopmeter.proxy.addon.browser_meter import BrowserMeter  # noqa: PLC0415 - on use

            self.meter = BrowserMeter(self.ending)
            updated = set(ctx.options.keys())  # it has seen no option yet
        self.meter.configure(updated)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self.meter is not None:
            self.meter.requestheaders(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        if self.meter is not None:
            self.meter.request(flow)
