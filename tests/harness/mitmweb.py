"""Real mitmweb with hopmeter's addons, and a client for mitmweb's own REST API.

    with MitmWeb(tmp_path, f"reverse:http://127.0.0.1:{up}@{port}") as web:
        web.api.flows()                               # GET /flows, as mitmweb's UI reads it
        web.api.view(flow_id, "hopmeter")             # a content view, rendered by mitmweb
        web.api.command("hopmeter.record", "@all")    # POST /commands/<name>

mitmweb runs as its own process, loaded with `-s "$(hopmeter --addon-path)"` as a user would, on
loopback ports, with a web password. The API wants it on every request (`Authorization: Bearer`),
and writes (POST/PUT/DELETE) pass tornado's double-submit XSRF check: the same value in the cookie
`_mitmproxy_xsrf` and the header `X-XSRFToken` (mitmproxy/tools/web/app.py).
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any, Self

import httpx
import orjson

from tests.harness.procs import Proc, free_port

MITMWEB = str(Path(sys.executable).with_name("mitmweb"))
START_TIMEOUT_S = 60.0  # mitmweb starts in ~3 s here; generous for a loaded CI box
# mitmweb 12.3.1's packaged index.html links a stylesheet it does not serve: its own console
# error on every page load, nothing to do with hopmeter.
KNOWN_CONSOLE_ERROR_PATH = "/src/css/vendor.less"


class WebApi:
    """mitmweb's REST API, authenticated, with the XSRF pair on writes."""

    def __init__(self, port: int, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.password = password
        xsrf = secrets.token_hex(16)
        self._client = httpx.Client(
            base_url=self.base,
            headers={"authorization": f"Bearer {password}", "x-xsrftoken": xsrf},
            cookies={"_mitmproxy_xsrf": xsrf},
            timeout=30,
        )

    def get(self, path: str) -> Any:
        """GET a JSON document; an AssertionError naming the status otherwise."""
        r = self._client.get(path)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text[:200]}"
        return orjson.loads(r.content)

    def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """Any request, with a JSON body when given."""
        return self._client.request(method, path, json=body)

    def flows(self) -> list[dict[str, Any]]:
        """Every flow as mitmweb's UI sees it (marks as glyphs, comments, content hashes)."""
        flows: list[dict[str, Any]] = self.get("/flows")
        return flows

    def view(self, flow_id: str, view: str = "auto", part: str = "response") -> dict[str, Any]:
        """A content view of a flow's request or response: {text, view_name, description, ...}."""
        doc: dict[str, Any] = self.get(f"/flows/{flow_id}/{part}/content/{view}.json")
        return doc

    def command(self, name: str, *args: str) -> dict[str, Any]:
        """Run a command: {"value": ...} or {"error": ...}."""
        r = self.request("POST", f"/commands/{name}", {"arguments": list(args)})
        assert r.status_code == 200, f"command {name}: {r.status_code} {r.text[:200]}"
        doc: dict[str, Any] = orjson.loads(r.content)
        return doc

    def dump(self) -> bytes:
        """Every flow as a .mitm file (what the UI's File > Save writes)."""
        r = self._client.get("/flows/dump")
        assert r.status_code == 200, f"GET /flows/dump: {r.status_code}"
        return r.content

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()


class MitmWeb:
    """A mitmweb process with hopmeter loaded; a context manager."""

    def __init__(self, tmp: Path, *modes: str, args: tuple[str, ...] = (), name: str = "mitmweb"):
        from hopmeter.cli import addon_path  # the worktree's script, as `hopmeter --addon-path`

        self.tmp = tmp
        self.web_port = free_port()
        self.password = secrets.token_hex(12)
        self.argv = [
            MITMWEB,
            "--no-web-open-browser",
            *("--web-host", "127.0.0.1", "--web-port", str(self.web_port)),
            *("--listen-host", "127.0.0.1"),
            *(arg for mode in modes for arg in ("--mode", mode)),
            *("-s", str(addon_path())),
            *("--set", f"web_password={self.password}", "--set", f"confdir={tmp / 'mitm'}"),
            *("--set", "hopmeter_metrics=off", "--set", "hopmeter_console=off"),
            *args,
        ]
        self.log = tmp / f"{name}.log"
        self.proc: Proc | None = None
        self.api = WebApi(self.web_port, self.password)

    @property
    def url(self) -> str:
        """The UI's address, logged in (the token sets mitmweb's auth cookie)."""
        return f"{self.api.base}/?token={self.password}"

    def start(self) -> Self:
        """Start mitmweb and wait until its web port accepts connections."""
        self.proc = Proc(self.argv, self.log)
        try:
            self.proc.wait_port(self.web_port, START_TIMEOUT_S)
        except AssertionError:
            self.stop()
            raise
        return self

    def output(self) -> str:
        """What mitmweb logged so far."""
        return self.proc.output() if self.proc is not None else ""

    def stop(self) -> None:
        """Stop mitmweb (SIGTERM, then SIGKILL) and close the API client."""
        self.api.close()
        if self.proc is not None:
            self.proc.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
