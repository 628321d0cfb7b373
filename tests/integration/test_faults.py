"""A bug in measuring code leaves the flow intact and is logged and counted, in plain mitmdump."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.harness.procs import Proc, free_port, read_records, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

EVENTS = [
    f'data: {{"choices":[{{"delta":{{"content":"w{i} 🦙"}}}}]}}\n\n'.encode() for i in range(10)
] + [b"data: [DONE]\n\n"]


async def _serve(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream"})
    for event in EVENTS:
        await ex.chunk(event)
    await ex.end()


def test_injected_fault_keeps_the_flow_and_is_counted(tmp_path: Path) -> None:
    """With the meter raising on the third chunk, the client still gets every byte, in mitmdump."""
    from hopmeter.cli import addon_path

    script = addon_path()
    fault = Path(__file__).with_name("fault_inject.py")
    port, metrics_port = free_port(), free_port()
    records = tmp_path / "records.jsonl"
    mitmdump = str(Path(sys.executable).with_name("mitmdump"))
    with ScriptedUpstream(_serve) as up:
        proc = Proc(
            [
                mitmdump,
                "-s",
                str(script),
                "-s",
                str(fault),
                "--mode",
                f"reverse:http://127.0.0.1:{up.port}@127.0.0.1:{port}",
                "--set",
                f"hopmeter_records={records}",
                "--set",
                f"hopmeter_metrics=127.0.0.1:{metrics_port}",
                "--set",
                f"confdir={tmp_path / 'mitm'}",
            ],
            tmp_path / "mitmdump.log",
        )
        try:
            proc.wait_port(port)
            body = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "gpt-4o", "stream": True},
            ).content
            rec = read_records(records, 1)[0]

            def counted() -> str | None:
                text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
                line = [
                    ln
                    for ln in text.splitlines()
                    if ln.startswith("hopmeter_internal_errors_total{")
                ]
                return line[0] if line and not line[0].endswith(" 0.0") else None

            metric = wait_for(counted, what="internal error counted")
        finally:
            proc.stop()
    assert body == b"".join(EVENTS)
    assert rec["measuring_error"].startswith("RuntimeError: injected fault")
    assert rec["response"]["bytes_out"] == len(body)
    assert metric.endswith(" 1.0")
    assert "measuring failed" in proc.output()
