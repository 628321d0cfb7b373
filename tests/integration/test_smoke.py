"""The smoke: every command once, the way a user first meets it, on the Python and the
dependency versions that run the test.

The whole suite runs on the oldest supported Python; `scripts/smoke` runs the tests marked
`smoke` (this file and a few others) on every other supported Python the machine has, and on
the newest versions pyproject allows when they differ from the lock, so a new Python or a new
release of a dependency that breaks a command is seen the day it happens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from hopmeter.cli import COMMANDS, addon_path
from tests.harness.mitmweb import MitmWeb
from tests.harness.procs import HOPMETER, Proc, free_port, hopmeter, read_records, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.smoke]
CHAT = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
MITMDUMP = str(Path(sys.executable).with_name("mitmdump"))


def _hopmeter(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HOPMETER, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def test_every_command_answers() -> None:
    """`--version`, `--addon-path` and every command's `--help` exit 0 (each command family
    imports cleanly on this Python and these versions)."""
    assert _hopmeter("--version").stdout.startswith("hopmeter ")
    assert Path(_hopmeter("--addon-path").stdout.strip()) == addon_path()
    names = ["run", "upstream", "join", "report", "probe", "demo"]
    assert len(names) == len(COMMANDS)
    for name in names:
        done = _hopmeter(name, "--help")
        assert done.returncode == 0 and f"usage: hopmeter {name}" in done.stdout, done.stderr


def test_run_on_its_defaults_then_probe_report_and_join(tmp_path: Path) -> None:
    """`hopmeter run` with nothing but a port (its built-in demo upstream, its default loop,
    relay and tokenizer), behind a second `hopmeter run`, streams to the OpenAI SDK and passes
    `hopmeter probe`; `report` and `join` read the records the two wrote."""
    origin, edge, metrics = free_port(), free_port(), free_port()
    records = {hop: tmp_path / f"{hop}.jsonl" for hop in ("edge", "origin")}
    with (
        hopmeter(
            tmp_path,
            *("run", "--listen", f"127.0.0.1:{origin}", "--metrics", f"127.0.0.1:{metrics}"),
            *("--hop", "origin", "--records", str(records["origin"])),
            name="origin",
            ports=(origin,),
        ) as proxy,
        hopmeter(
            tmp_path,
            *("run", f"http://127.0.0.1:{origin}", "--listen", f"127.0.0.1:{edge}"),
            *("--metrics", "off", "--hop", "edge", "--records", str(records["edge"])),
            name="edge",
            ports=(edge,),
        ),
    ):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{edge}/v1", api_key="sk-smoke")
        pieces = [
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(**CHAT)
            if chunk.choices
        ]
        assert "".join(pieces).strip()
        (record,) = read_records(records["origin"], 1)
        assert record["ended"] == "complete" and record["figures"]["tokens"] > 0
        probe = _hopmeter("probe", f"http://127.0.0.1:{edge}/v1", "--line-endings", "lf")
        assert probe.returncode == 0 and "\nPASS " in probe.stdout, probe.stdout
        assert "ended=complete" in proxy.output()
        scraped = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        assert "hopmeter_flows_total" in scraped
        read_records(records["edge"], 2)
    report = _hopmeter("report", str(records["edge"]), str(records["origin"]))
    assert report.returncode == 0 and "openai.chat" in report.stdout, report.stderr
    join = _hopmeter("join", str(records["edge"]), str(records["origin"]))
    assert join.returncode == 0 and "edge>origin" in join.stdout, join.stdout + join.stderr


def test_the_demo_measures_its_seven_streams() -> None:
    """`hopmeter demo`, with nothing running, measures each of its sample streams to the end."""
    done = _hopmeter("demo", timeout_s=120)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if "[demo]" in ln]
    assert len(lines) == 7 and all("ended=complete" in ln for ln in lines), done.stdout


def test_mitmdump_with_the_addon_measures_a_stream(tmp_path: Path) -> None:
    """Plain mitmdump loaded with `-s $(hopmeter --addon-path)` passes a stream on and prints
    hopmeter's line for it."""
    up, port = free_port(), free_port()
    with hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{up}", name="up", ports=(up,)):
        dump = Proc(
            [
                MITMDUMP,
                *("--mode", f"reverse:http://127.0.0.1:{up}@127.0.0.1:{port}"),
                *("-s", str(addon_path()), "--set", "hopmeter_metrics=off"),
                *("--set", f"confdir={tmp_path / 'mitm'}"),
            ],
            tmp_path / "mitmdump.log",
        )
        try:
            dump.wait_port(port, 60)
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, timeout=30)
            assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
            wait_for(lambda: "ended=complete" in dump.output(), 20, "hopmeter's line")
        finally:
            dump.stop()


def test_mitmweb_shows_a_flow_with_hopmeters_view(tmp_path: Path) -> None:
    """mitmweb with the addon lists the flow and renders hopmeter's content view for it."""
    up, port = free_port(), free_port()
    with (
        hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{up}", name="up", ports=(up,)),
        MitmWeb(tmp_path, f"reverse:http://127.0.0.1:{up}@127.0.0.1:{port}") as web,
    ):
        assert web.proc is not None
        web.proc.wait_port(port, 60)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200
        (flow,) = wait_for(
            lambda: [f for f in web.api.flows() if f.get("comment")], 20, "the flow's verdict"
        )
        view = web.api.view(flow["id"], "hopmeter")
        assert "ttft" in view["text"].lower(), view
