"""A real headless Chromium driven over the DevTools protocol, for browser tests.

    with Chromium(tmp_path) as browser:
        page = browser.open("file:///.../report.html")
        page.evaluate("document.title")
        page.screenshot(tmp_path / "report.png")
        assert page.errors() == []

Chromium (Debian's `chromium` package) runs with its own profile under the test's tmp dir, no
sandbox (CI runs as root), and every background fetch off. The DevTools websocket is spoken with
wsproto (a mitmproxy dependency), one blocking socket, one page session. `errors()` collects what
a person would see in the console as an error: console.error/assert calls, uncaught exceptions,
and browser log entries at level error (failed loads, Content-Security-Policy violations).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from hopmeter.demo.chat_page import CHROMIUM_FLAGS, stop_chromium

CHROMIUM = os.environ.get("HOPMETER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# the demo's headless flags (a fresh profile, nothing fetched in the background, a fixed window),
# plus what a test needs: no sandbox (CI runs as root) and the DevTools protocol it drives
FLAGS = (
    *CHROMIUM_FLAGS,
    "--no-sandbox",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)
START_TIMEOUT_S = 30.0  # Chromium starts in ~1 s here; generous for a loaded CI box
CALL_TIMEOUT_S = 30.0


class BrowserError(RuntimeError):
    """Chromium would not start, or a DevTools call failed; the message says which."""


def available() -> bool:
    """True when the chromium binary exists and runs."""
    try:
        done = subprocess.run([CHROMIUM, "--version"], check=False, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class _Socket:
    """One DevTools websocket: send a command, read messages until its answer."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT_S)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host=f"127.0.0.1:{port}", target=path)))
        self._parts: list[str] = []
        while not self._handshake_done():
            pass

    def _handshake_done(self) -> bool:
        self.ws.receive_data(self._recv())
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                return True
            if isinstance(event, RejectConnection):
                raise BrowserError(f"DevTools refused the websocket: {event.status_code}")
        return False

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise BrowserError("DevTools closed the websocket")
        return data

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(self.ws.send(TextMessage(data=orjson.dumps(message).decode())))

    def read(self) -> list[dict[str, Any]]:
        """The next complete messages (blocking until at least one socket read)."""
        self.ws.receive_data(self._recv())
        out = []
        for event in self.ws.events():
            if isinstance(event, TextMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    out.append(orjson.loads("".join(self._parts)))
                    self._parts.clear()
            elif isinstance(event, Ping):
                self.sock.sendall(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                raise BrowserError("DevTools closed the websocket")
        return out

    def close(self) -> None:
        self.sock.close()


class Page:
    """One tab, attached with a flat session; events are kept for `errors()`."""

    def __init__(self, conn: _Socket, session: str) -> None:
        self._conn = conn
        self._session = session
        self._ids = itertools.count(1000)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command to the page and return its result (events seen meanwhile are kept)."""
        n = next(self._ids)
        self._conn.send({"id": n, "method": method, "params": params, "sessionId": self._session})
        deadline = time.monotonic() + CALL_TIMEOUT_S
        answer: dict[str, Any] | None = None
        while answer is None and time.monotonic() < deadline:
            # keep every event of the batch, also those that came after the answer
            for msg in self._conn.read():
                if msg.get("id") == n:
                    answer = msg
                elif "method" in msg:
                    self.events.append(msg)
        if answer is None:
            raise BrowserError(f"{method}: no answer within {CALL_TIMEOUT_S}s")
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return dict(answer.get("result") or {})

    def wait_events(self, *methods: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """Wait until events of `methods` have been seen, in that order."""
        deadline = time.monotonic() + timeout_s
        while True:
            want = iter(methods)
            need = next(want, None)
            for msg in self.events:
                if need is not None and msg.get("method") == need:
                    need = next(want, None)
            if need is None:
                return
            if time.monotonic() > deadline:
                raise BrowserError(f"no {need} within {timeout_s}s")
            self.events += [m for m in self._conn.read() if "method" in m]

    def navigate(self, url: str) -> None:
        """Load `url` and wait for its load event (not a stale one of the blank page)."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_events("Page.frameNavigated", "Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, selector: str = "") -> Path:
        """A PNG of the whole page (not just the viewport), or of one element, written to `path`."""
        if selector:
            box = self.evaluate(
                f"(() => {{ const r = document.querySelector({orjson.dumps(selector).decode()})"
                ".getBoundingClientRect(); return {x: r.x + scrollX, y: r.y + scrollY, "
                "width: r.width, height: r.height}; })()"
            )
        else:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            box = {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}
        clip = {**box, "scale": 1}
        shot = self.call(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error-level log entries seen so far."""
        self.call("Runtime.evaluate", expression="0")  # drain what arrived before now
        out = []
        for msg in self.events:
            p = msg.get("params") or {}
            if msg["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails')}")
            elif msg["method"] == "Runtime.consoleAPICalled" and p.get("type") in (
                "error",
                "assert",
            ):
                out.append(f"console.{p['type']}: {p.get('args')}")
            elif msg["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out


class Chromium:
    """A headless Chromium process with its profile in `tmp`; a context manager."""

    def __init__(self, tmp: Path, width: int = 1100, height: int = 900) -> None:
        self.profile = tmp / "chromium-profile"
        self.size = (width, height)
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: _Socket | None = None
        self._log: BinaryIO | None = None
        self._ids = itertools.count(1)

    def start(self) -> Chromium:
        """Start Chromium and connect to its DevTools endpoint."""
        self.profile.mkdir(parents=True, exist_ok=True)
        (self.profile / "DevToolsActivePort").unlink(missing_ok=True)  # a reused profile's port
        self._log = log = (self.profile.parent / "chromium.log").open("wb")
        args = [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        args.append(f"--window-size={self.size[0]},{self.size[1]}")
        self._proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrowserError(f"chromium did not start; see {log.name}")
            time.sleep(0.05)
        port, path = port_file.read_text().split("\n")[:2]
        try:
            self._conn = _Socket(int(port), path)
        except (OSError, BrowserError):
            self.stop()
            raise
        return self

    def _browser_call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._conn is not None
        n = next(self._ids)
        self._conn.send({"id": n, "method": method, "params": params})
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            for msg in self._conn.read():
                if msg.get("id") == n:
                    if "error" in msg:
                        raise BrowserError(f"{method}: {msg['error']}")
                    return dict(msg.get("result") or {})
        raise BrowserError(f"{method}: no answer within {CALL_TIMEOUT_S}s")

    def open(self, url: str) -> Page:
        """A new tab with console and log capture on, navigated to `url`."""
        target = self._browser_call("Target.createTarget", url="about:blank")["targetId"]
        session = self._browser_call("Target.attachToTarget", targetId=target, flatten=True)
        assert self._conn is not None
        page = Page(self._conn, session["sessionId"])
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.size[0],
            height=self.size[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        page.navigate(url)
        return page

    def stop(self) -> None:
        """Close the connection and end the browser and its helpers (SIGTERM, then SIGKILL)."""
        proc, self._proc = self._proc, None
        log, self._log = self._log, None
        if log is not None:
            log.close()  # the browser holds its own copy of the descriptor
        if self._conn is not None:
            # asked to close, the browser ends and reaps its helpers itself
            with contextlib.suppress(OSError, BrowserError):
                self._conn.send({"id": 0, "method": "Browser.close", "params": {}})
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            self._conn.close()
            self._conn = None
        stop_chromium(proc)  # any helpers left (they share its process group)

    def __enter__(self) -> Chromium:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
