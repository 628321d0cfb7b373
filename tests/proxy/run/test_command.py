"""Tests for hopmeter.proxy.run.command: what an idle `hopmeter run` has imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.procs import free_port

# What a `hopmeter run` with records and metrics on never uses until a flag or a flow asks for
# it: the other commands' packages, the workers' parent (--workers), the OpenTelemetry export
# (--otlp), browser measuring (--browser), the optional tokenizer libraries, and `regex`, which
# only the first flow's tokenizer pattern needs.
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
