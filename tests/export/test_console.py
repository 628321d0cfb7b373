"""The console: a line per flow (text or JSON, never content) and a compact window summary."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import orjson
import pytest

from hopmeter.core.record import FlowResult
from hopmeter.export import console
from hopmeter.export.console import Console, flow_json


def flow(hop: str, ttft: float, itl: float, kinds: tuple[str, ...] = ()) -> FlowResult:
    rec: dict[str, Any] = {
        "hop": hop,
        "trace_id": "t",
        "api": "openai.chat",
        "model": "gpt-4o",
        "request": {"method": "POST", "path": "/v1/chat/completions"},
        "response": {"status": 200, "ended": "complete"},
        "figures": {
            "ttfb_s": 0.01,
            "ttft_s": ttft,
            "itl_p50_s": itl,
            "itl_p99_s": itl,
            "max_gap_s": itl,
            "tokens": 10,
            "tokens_source": "usage",
            "duration_s": 1.0,
        },
        "findings": [{"kind": k} for k in kinds],
        "content": "secret reply",
    }
    return FlowResult(record=rec, figures=None, tokens=None)


def test_json_line_has_figures_and_no_content() -> None:
    """--json hands one object per flow, a whole line, to its writer: figures and finding kinds,
    never the content."""
    lines: list[bytes] = []
    Console("json", 0, lines.append).observe(flow("edge", 0.2, 0.02, ("stall",)))
    (line,) = lines
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = orjson.loads(line)
    assert doc == flow_json(flow("edge", 0.2, 0.02, ("stall",)).record)
    assert doc["findings"] == ["stall"] and doc["ttft_s"] == 0.2
    assert b"secret reply" not in line


def test_json_mode_without_a_writer_is_refused() -> None:
    """A json console with nowhere to write is a programming error, raised when it is built."""
    with pytest.raises(ValueError, match="somewhere to write"):
        Console("json", 0)


def test_window_summary_per_hop() -> None:
    """The summary counts flows and gives TTFT percentiles per hop, then starts a new window."""
    c = Console("text", 60)
    for i in range(10):
        c.observe(flow("edge", 0.1 * (i + 1), 0.02, ("stall",) if i == 0 else ()))
    c.observe(flow("origin", 0.05, 0.02))
    line = c.summary()
    assert line.startswith("hopmeter: last 60s: 11 flows")
    assert "[edge] n=10 ttft p50=500ms p99=1000ms itl p50=20ms" in line
    assert "[origin] n=1" in line and "findings stall=1" in line
    assert c.summary() == ""


def test_window_keeps_flows_without_figures_out_of_the_quantiles() -> None:
    """A flow with no TTFT or ITL (no token came) counts in its hop's n, not in the quantiles."""
    c = Console("text", 60)
    c.observe(flow("edge", 0.3, 0.03))
    silent = flow("edge", 0.0, 0.0)
    silent.record["figures"] = {"ttfb_s": 0.01, "ttft_s": None, "itl_p50_s": None}
    c.observe(silent)
    c.observe(flow("edge", 0.1, 0.01))
    c.observe(flow("edge", 0.2, 0.02))
    line = c.summary()
    assert "[edge] n=4 ttft p50=200ms p99=300ms itl p50=20ms" in line


def test_window_past_its_cap_counts_the_rest_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_WINDOW_FLOWS in one window, flows are counted but not kept: the summary says its
    quantiles are of the first ones, and the next window starts with room again."""
    monkeypatch.setattr(console, "MAX_WINDOW_FLOWS", 3)
    c = Console("text", 60)
    for i in range(5):
        c.observe(flow("edge", 0.1 * (i + 1), 0.02))
    line = c.summary()
    assert line.startswith("hopmeter: last 60s: 5 flows (quantiles of the first 3)")
    assert "[edge] n=3 ttft p50=200ms p99=300ms" in line
    c.observe(flow("edge", 0.9, 0.02))
    line = c.summary()
    assert "quantiles of" not in line and "[edge] n=1 ttft p50=900ms" in line


def test_flows_the_proxy_answered_for_a_failed_upstream_get_no_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flow with no response and a named upstream failure is counted in the window but gets
    no line of its own (the upstream guard logs those once per cause per interval)."""
    failed = flow("edge", 0.1, 0.02, ("upstream_unreachable",))
    del failed.record["response"]
    failed.record["ended"] = "connect_refused"
    failed.record["upstream_error"] = {"cause": "connect_refused", "status_sent": 502}
    c = Console("text", 60)
    with caplog.at_level("INFO", logger="hopmeter"):
        c.observe(failed)
        c.observe(flow("edge", 0.1, 0.02))
    assert len(caplog.records) == 1
    assert "findings upstream_unreachable=1" in c.summary()
    assert flow_json(failed.record)["status"] == 502
    assert flow_json(failed.record)["ended"] == "connect_refused"


def test_quiet_console_keeps_the_summary_and_no_summary_keeps_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the per-flow lines off (--quiet) the summaries stay (--quiet's help says so); with
    no summary (interval 0) no window grows, as nothing would ever empty it."""
    c = Console("off", 60)
    with caplog.at_level("INFO", logger="hopmeter"):
        for _ in range(100):
            c.observe(flow("edge", 0.1, 0.02))
    assert caplog.records == []
    assert c.summary().startswith("hopmeter: last 60s: 100 flows")
    silent = Console("off", 0)
    for _ in range(100):
        silent.observe(flow("edge", 0.1, 0.02))
    assert silent.summary() == ""


HANDLERS = """
import asyncio, logging
from mitmproxy import options
from mitmproxy.tools.dump import DumpMaster
from hopmeter.export.outlets import Outlets
from hopmeter.proxy.addon.outlets import QueuedTermLog
from hopmeter.proxy.run.master import LeanMaster, LeanOptions

def names():
    return " ".join(sorted(type(h).__name__ for h in logging.getLogger().handlers))

async def main():
    LeanMaster(LeanOptions(), QueuedTermLog(Outlets()))
    print(names())
    DumpMaster(options.Options(), with_termlog=True, with_dumper=False)
    print(names())

asyncio.run(main())
"""


@pytest.mark.integration
def test_hopmeter_master_logs_without_add_log_events() -> None:
    """The master `hopmeter run` builds installs its terminal log handler (the per-flow line
    reaches the console) but not mitmproxy's handler that turns each record into an `add_log`
    event (which mitmdump's master installs: the check can tell)."""
    done = subprocess.run(
        [sys.executable, "-c", HANDLERS], capture_output=True, text=True, check=True, timeout=60
    )
    ours, with_mitmdumps = (line.split() for line in done.stdout.splitlines())
    assert "QueuedTermLogHandler" in ours and "LegacyLogEvents" not in ours
    assert "LegacyLogEvents" in with_mitmdumps
