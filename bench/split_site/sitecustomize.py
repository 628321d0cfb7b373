"""bench/split.py's parts of hopmeter, turned off for one proxy process (never in a product run).

Python imports `sitecustomize` from the path at start-up; bench/split.py puts this folder first on
the proxy's PYTHONPATH with HOPMETER_BENCH_OFF set to a comma list of the parts to turn off:

- `measure`: no response gets a meter (the stream callable stamps nothing and queues nothing; the
  record says the response was not measured), as for a body hopmeter does not measure.
- `delivery`: no response's chunks are followed out to the client (no write counter on the
  client's connection, no looks at its queues; the record has no `delivery`).

Everything else runs as in `hopmeter run`: the hooks, the stream callable itself, the flow's end,
the record and the metrics.
"""

import os

_OFF = {part for part in os.environ.get("HOPMETER_BENCH_OFF", "").split(",") if part}


def _no_meter(flow: object, headers: object) -> None:
    """`new_meter` of a response left unmeasured."""
    del flow, headers


def _not_followed(self: object, flow: object, *, chaos: bool) -> None:
    """`DeliveryLane.attach` of a flow whose chunks are not followed out."""
    del self, flow, chaos


if _OFF:
    if _OFF - {"measure", "delivery"}:
        raise SystemExit(f"HOPMETER_BENCH_OFF: unknown parts {sorted(_OFF)}")
    from hopmeter.proxy.addon import meter as _meter
    from hopmeter.proxy.delivery import lane as _lane

    if "measure" in _OFF:
        vars(_meter)["new_meter"] = _no_meter  # the name meter.py's responseheaders calls
    if "delivery" in _OFF:
        _lane.DeliveryLane.attach = _not_followed  # type: ignore[method-assign,assignment]
