"""The shipped `hopmeter` command: clear one-line errors, the addon path, the demo."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.procs import HOPMETER, free_port


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HOPMETER, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--bogus"], "unrecognized arguments: --bogus"),
        (["run", "--listen", "nowhere"], "--listen 'nowhere': expected HOST:PORT"),
        (["run", "ftp://x"], "expected an http:// or https:// URL"),
        (["run", "--listener", "edge"], "--listener 'edge': expected NAME=MODE"),
        (["run", "--listener", "edge=nonsense:x@1"], "listener mode 'nonsense:x@1'"),
        (["run", "--stall-threshold", "-1"], "must be above 0"),
        (["run", "--set", "novalue"], "--set 'novalue': expected NAME=VALUE"),
        (["run", "--set", "no_such_option=1", "--metrics", "off"], "no_such_option"),
        (["run", "--records", "/no/such/dir/r.jsonl"], "folder /no/such/dir does not exist"),
        (
            ["run", "--tokenizer", "/no/such.tiktoken", "--metrics", "off"],
            "cannot read tokenizer file",
        ),
        (["upstream", "--scenario", "colaesce=2"], "unknown scenario key 'colaesce'"),
        (["upstream", "--replay", "/no/such.sse"], "cannot read transcript"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    """A bad flag or value exits non-zero with one line naming it, never a traceback."""
    result = run(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("flag", ["--listen", "--metrics"])
def test_port_in_use_is_one_clear_line(flag: str) -> None:
    """A port already taken is named with the fix, before anything starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = ["--metrics", "off"] if flag == "--listen" else ["--listen", "127.0.0.1:0"]
        result = run("run", flag, f"127.0.0.1:{port}", *other)
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_addon_path_is_a_loadable_script() -> None:
    """--addon-path prints the script plain mitmdump users load with -s."""
    result = run("--addon-path")
    path = Path(result.stdout.strip())
    assert result.returncode == 0
    assert path.name == "script.py" and path.is_file()
    assert "addons = default_addons()" in path.read_text()


@pytest.mark.integration
def test_demo_measures_every_sample(tmp_path: Path) -> None:
    """`hopmeter demo` runs on its own and prints a measured line per sample stream."""
    records = tmp_path / "demo.jsonl"
    result = run("demo", "--records", str(records), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "7 flows measured." in result.stdout
    assert result.stdout.count("ttft=") == 7
    assert "findings=stall" in result.stdout
    assert "whole_body_hold" in result.stdout
    assert "not_streamed" in result.stdout
    assert len(records.read_text().splitlines()) == 7


# What a `hopmeter run` with records and metrics on never uses until a flag or a flow asks for
# it: the other commands' packages, the workers' parent (--workers), the OpenTelemetry export
# (--otlp), browser measuring (--browser), the optional tokenizer libraries, `regex`, which
# only tests use (the reference the pre-tokenizer is held to), structlog (a line with fields:
# a fault or a rare event, hopmeter.log), pairing by content (listeners of several hops) and
# mitmproxy's content views (which only a UI or mitmdump's flow details show); nor statistics
# and fractions at all (hopmeter.core.figures has the median and mean hopmeter takes).
NOT_IDLE = (
    "hopmeter.report",
    "hopmeter.join",
    "hopmeter.probe",
    "hopmeter.demo",
    "hopmeter.upstream",
    "hopmeter.testing",
    "hopmeter.export.otel",
    "hopmeter.export.join_metrics",
    "hopmeter.proxy.run.workers",
    "hopmeter.proxy.addon.browser_meter",
    "hopmeter.core.browser",
    "opentelemetry",
    "tiktoken",
    "tokenizers",
    "regex",
    "structlog",
    "hopmeter.proxy.addon.views",
    "mitmproxy.contentviews",
    "statistics",
    "fractions",
)
MARK = "idle modules: "

# A child that runs the shipped command's entry point and, once the proxy answers on its
# listening port, says which of NOT_IDLE it has imported and stops it as SIGTERM would.
CHILD = """
import os, signal, socket, sys, threading, time
from hopmeter.cli import main

NOT_IDLE, PORT, ARGV = {not_idle!r}, {port}, {argv!r}


def report():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", PORT), 0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    found = sorted(m for m in sys.modules if m.startswith(NOT_IDLE))
    print({mark!r} + repr(found), file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=report, daemon=True).start()
sys.exit(main(ARGV))
"""


@pytest.mark.integration
def test_an_idle_run_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    """`hopmeter run` with records and metrics on, listening and idle, has imported none of the
    modules only other commands, flags or the first flow need."""
    port = free_port()
    argv = [
        "run",
        f"http://127.0.0.1:{free_port()}",
        "--listen",
        f"127.0.0.1:{port}",
        "--records",
        str(tmp_path / "records.jsonl"),
        "--metrics",
        f"127.0.0.1:{free_port()}",
    ]
    code = CHILD.format(not_idle=NOT_IDLE, port=port, argv=argv, mark=MARK)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, check=False
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith(MARK)]
    assert lines, done.stderr
    assert ast.literal_eval(lines[0].removeprefix(MARK)) == []
