"""A mitmproxy script that breaks hopmeter's measuring code on purpose: the third chunk it is
handed raises. Loaded after hopmeter's own script to prove a measuring bug cannot touch a flow."""

from typing import Any

from hopmeter.core import meter

_original = meter.FlowMeter.feed
_calls = {"n": 0}


def _broken_feed(self: meter.FlowMeter, data: bytes, now_s: float) -> None:
    _calls["n"] += 1
    if _calls["n"] == 3:
        raise RuntimeError("injected fault")
    _original(self, data, now_s)


meter.FlowMeter.feed = _broken_feed  # type: ignore[method-assign]
addons: list[Any] = []
