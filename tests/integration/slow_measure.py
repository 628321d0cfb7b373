"""A mitmproxy script that makes hopmeter's measuring step slow on purpose: every tenth chunk
the meter is fed spins the CPU for 60 ms, as a slow tokenizer or detector would. Loaded after
hopmeter's own script, it stalls the event loop every stream shares, from inside hopmeter."""

import time
from typing import Any

from hopmeter.core import meter

SPIN_S = 0.06
EVERY = 10
_original = meter.FlowMeter.feed
_calls = {"n": 0}


def _slow_feed(self: meter.FlowMeter, data: bytes, now_s: float) -> None:
    _calls["n"] += 1
    if _calls["n"] % EVERY == 0:
        end = time.thread_time() + SPIN_S
        while time.thread_time() < end:  # busy, not asleep: CPU spent inside hopmeter's step
            pass
    _original(self, data, now_s)


meter.FlowMeter.feed = _slow_feed  # type: ignore[method-assign]
addons: list[Any] = []
