"""What a person (or a script) sees while `hopmeter run` runs.

One line per finished flow — hop, api, model, status, TTFB, TTFT, inter-token latency p50/p99,
max gap, tokens, findings worst first — as text through the log, or as one JSON object per line on
stdout (`--json`); and every `--summary-interval` seconds a compact summary of the window. Neither
is written here: the text goes to the log (under `hopmeter run`, a queued handler), the JSON
line to the `write` given (an outlet's `put`, hopmeter.export.outlets), so printing never makes
a stream wait.
"""

from __future__ import annotations

import asyncio
import math
from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson

from hopmeter.core.figures import weighted_quantile
from hopmeter.core.record import FlowResult, summary_line
from hopmeter.log import plain

MODES = ("text", "json", "off")
# Per-window memory is two floats per flow (16 bytes, in arrays per hop: a tuple of three per flow
# was ~120 bytes, ~4 MiB held for a window of 35,000 flows); past this many flows in one window
# the rest are counted but left out of the quantiles, and the summary says so (a busy sidecar
# does thousands per minute).
MAX_WINDOW_FLOWS = 100_000


def flow_json(rec: dict[str, Any]) -> dict[str, Any]:
    """The console's JSON line for one flow: figures only, never content or headers."""
    fig = rec.get("figures") or {}
    resp = rec.get("response") or {}
    return {
        "hop": rec.get("hop"),
        "trace_id": rec.get("trace_id"),
        "api": rec.get("api"),
        "model": rec.get("model"),
        "path": rec["request"]["path"],
        "status": resp.get("status", (rec.get("upstream_error") or {}).get("status_sent")),
        "ended": resp.get("ended", rec.get("ended")),
        "ttfb_s": fig.get("ttfb_s"),
        "ttft_s": fig.get("ttft_s"),
        "itl_p50_s": fig.get("itl_p50_s"),
        "itl_p99_s": fig.get("itl_p99_s"),
        "max_gap_s": fig.get("max_gap_s"),
        "tokens": fig.get("tokens"),
        "findings": [f["kind"] for f in rec.get("findings") or []],
    }


class Console:
    """An observer of finished flows that prints them and summarises each window."""

    def __init__(
        self,
        mode: str = "text",
        interval_s: float = 60.0,
        write: Callable[[bytes], None] | None = None,
    ) -> None:
        """`write` takes each JSON line (needed in "json" mode), and must not wait."""
        if mode == "json" and write is None:
            raise ValueError("the console's json mode needs somewhere to write its lines")
        self.mode = mode
        self.interval_s = interval_s
        self.write = write
        # per hop, the window's TTFT and ITL p50 of each flow (NaN where a flow had none)
        self._window: dict[str, tuple[array[float], array[float]]] = {}
        self._kept = 0
        self._dropped = 0
        self._findings: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None

    def observe(self, result: FlowResult) -> None:
        """One finished flow."""
        rec = result.record
        if self.mode == "text" and _upstream_answered(rec):
            pass  # the upstream guard's log says it, once per cause per interval, not per flow
        elif self.mode == "text":
            plain(summary_line(rec))  # no structlog for a flow's line (hopmeter.log)
        elif self.mode == "json" and self.write is not None:
            self.write(orjson.dumps(flow_json(rec)) + b"\n")
        if self.interval_s <= 0:
            return  # no summary will ever empty the window: keep nothing
        fig = rec.get("figures") or {}
        if self._kept < MAX_WINDOW_FLOWS:
            hop = str(rec.get("hop"))
            columns = self._window.get(hop)
            if columns is None:
                columns = self._window[hop] = (array("d"), array("d"))
            ttft, itl = fig.get("ttft_s"), fig.get("itl_p50_s")
            # NaN: a figure the flow did not have (no token: no TTFT)
            columns[0].append(math.nan if ttft is None else ttft)
            columns[1].append(math.nan if itl is None else itl)
            self._kept += 1
        else:
            self._dropped += 1
        self._findings.update(f["kind"] for f in rec.get("findings") or [])

    @property
    def started(self) -> bool:
        """Whether the periodic summary runs."""
        return self._task is not None

    def start(self) -> None:
        """Begin the periodic summary (needs a running event loop)."""
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._every())

    def stop(self) -> None:
        """Stop the periodic summary."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            line = self.summary()
            if line:
                plain(line)

    def summary(self) -> str:
        """The window's compact summary (and a new window)."""
        window, self._window = self._window, {}
        findings, self._findings = self._findings, Counter()
        kept, dropped = self._kept, self._dropped
        self._kept = self._dropped = 0
        if not kept + dropped:
            return ""
        parts = [f"hopmeter: last {self.interval_s:g}s: {kept + dropped} flows"]
        if dropped:
            parts.append(f"(quantiles of the first {kept})")
        for hop, (ttft_column, itl_column) in sorted(window.items()):
            ttfts = [t for t in ttft_column if not math.isnan(t)]  # NaN: a flow without one
            itls = [i for i in itl_column if not math.isnan(i)]
            parts.append(
                f"[{hop}] n={len(ttft_column)} ttft p50={_ms(_q(ttfts, 0.5))}"
                f" p99={_ms(_q(ttfts, 0.99))} itl p50={_ms(_q(itls, 0.5))}"
            )
        if findings:
            parts.append("findings " + " ".join(f"{k}={n}" for k, n in findings.most_common()))
        return " ".join(parts)


def _upstream_answered(rec: dict[str, Any]) -> bool:
    """The proxy answered in place of a failed upstream: no response, and a named cause.

    Under a flood of failures (the model server is down) a line per flow would bury everything
    else; hopmeter.proxy.addon.guard logs the first of each cause and then one line per interval.
    """
    return "response" not in rec and "upstream_error" in rec


def _q(values: list[float], q: float) -> float | None:
    return weighted_quantile(values, [1] * len(values), q)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}ms"
