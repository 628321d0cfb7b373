"""hopmeter in the real mitmproxy console (in a pseudo-terminal): a measured flow is marked and
commented, keeps its record and its streamed body, as saved by the console's own command."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mitmproxy import http
from mitmproxy import io as mitmio
from mitmproxy.contentviews import Metadata

from hopmeter.cli import addon_path
from hopmeter.proxy.addon.views import HopmeterContentview
from tests.harness.procs import free_port, hopmeter, port_open, wait_for

pytestmark = pytest.mark.integration
MITMPROXY = str(Path(sys.executable).with_name("mitmproxy"))
STALLED = "tokens=20;rate=40;stall_at=5;stall_s=0.6"


@contextlib.contextmanager
def console(tmp: Path, upstream: int, port: int) -> Iterator[int]:
    """mitmproxy's console with hopmeter, on a 200x50 pseudo-terminal; yields the terminal's fd.

    Its output is read (and kept in console.out) all along: a terminal nobody reads blocks it.
    """
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    argv = [MITMPROXY, "-s", str(addon_path())]
    argv += ["--mode", f"reverse:http://127.0.0.1:{upstream}@127.0.0.1:{port}"]
    argv += ["--set", "hopmeter_metrics=off", "--set", f"confdir={tmp / 'mitm'}"]
    proc = subprocess.Popen(
        argv,
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    os.close(child)
    screen = (tmp / "console.out").open("wb")

    def read() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(main, 65536):
                screen.write(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: proc.poll() is None and port_open(port), 30, "the console's proxy port")
        yield main
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        os.close(main)
        reader.join(5)
        screen.close()


def _saved(terminal: int, path: Path) -> list[http.HTTPFlow] | None:
    """Type `:save.file @all PATH` into the console; the flows once written and marked."""
    path.unlink(missing_ok=True)
    os.write(terminal, f":save.file @all {path}\r".encode())
    try:
        flows = wait_for(lambda: (path.exists() and path.read_bytes()) or None, 5, "the file")
        loaded = list(mitmio.FlowReader(io.BytesIO(flows)).stream())
    except (AssertionError, ValueError, OSError):
        return None
    return [f for f in loaded if isinstance(f, http.HTTPFlow) and f.marked] or None


def test_a_flow_in_the_console_is_marked_commented_and_shown(tmp_path: Path) -> None:
    """A stalled stream through the console: orange mark, the verdict as comment, the record and
    the body saved with it, and the hopmeter view renders from what was saved."""
    up, port = free_port(), free_port()
    path = tmp_path / "console.mitm"
    with (
        hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{up}", name="up", ports=(up,)),
        console(tmp_path, up, port) as terminal,
    ):
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "gpt-4o", "stream": True},
            headers={"x-hopmeter-scenario": STALLED},
            timeout=30,
        )
        assert r.status_code == 200
        (f,) = wait_for(lambda: _saved(terminal, path), 30, "a marked flow saved by the console")
    assert f.marked == ":orange_circle:"
    assert f.comment.startswith("TTFT ") and f.comment.endswith("· stall")
    assert f.metadata["hopmeter"]["flow_id"] == f.id
    assert f.response is not None and f.response.content == r.content  # the body was kept
    meta = Metadata(flow=f, http_message=f.response, content_type="text/event-stream")
    view = HopmeterContentview().prettify(f.response.content, meta)
    assert view.splitlines()[1] == f"▲ {f.comment}" and "◀ ▲ STALL" in view
