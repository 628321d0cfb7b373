"""`hopmeter demo --browser`: the demo chat page through a proxy that measures the browser too.

The demo upstream serves a chat page (/demo/) with a good client and each bad one from the seed
"GPU to pixel"'s table; the proxy runs with browser measuring on, so the page loads hopmeter's
snippet and each reply's record gets the browser and screen lanes. A person opens the printed
URL and presses buttons; with `--headless` a headless Chromium opens the page instead, runs the
clients asked for, and the demo stops once each reply's record was written. Then
`hopmeter report RECORDS --html report.html` draws the lanes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hopmeter.core.record import FlowResult, summary_line
from hopmeter.demo.command import wait_port
from hopmeter.errors import UsageError
from hopmeter.export import FlowObserver
from hopmeter.proxy.options import run_options
from hopmeter.proxy.run.config import ProxyConfig
from hopmeter.upstream.server import UpstreamServer

# The clients of the demo page (hopmeter/data/browser/demo.js), in the order ?client=all runs.
CLIENTS = (
    "good",
    "decoder_per_chunk",
    "split_nn",
    "reparse",
    "per_token",
    "reveal_after_end",
    "smooth",
)
# A headless run gives up after this long per reply: the longest demo reply streams for 5 s,
# and its beacon comes a second after its screen settles.
HEADLESS_S_PER_REPLY = 30.0
# Headless Chromium's flags: a fresh profile, nothing fetched in the background, a fixed window
# (its frames run at 60 Hz with these, measured; --disable-frame-rate-limit would break that).
CHROMIUM_FLAGS = (
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1100,900",
)


def chromium_path() -> str:
    """The Chromium to run headless: $HOPMETER_CHROMIUM, else chromium on the PATH."""
    found = os.environ.get("HOPMETER_CHROMIUM") or shutil.which("chromium")
    if not found:
        raise UsageError(
            "--headless needs Chromium: install it (Debian: apt install chromium) or set "
            "HOPMETER_CHROMIUM to its path"
        )
    return found


def clients_from(value: str) -> list[str]:
    """The demo clients named in a comma list ("all": every one)."""
    names = list(CLIENTS) if value == "all" else [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in CLIENTS]
    if unknown or not names:
        raise UsageError(
            f"--headless {value!r}: expected all or a comma list of {', '.join(CLIENTS)}"
        )
    return names


async def run_browser_demo(*, records: str, port: int, headless: str) -> int:
    """Serve the demo page through a browser-measuring proxy until stopped (or, headless, until
    every asked reply's record was written); one line per reply."""
    from hopmeter.proxy.run.runner import quiet_mitmproxy_logs, run_proxy  # noqa: PLC0415 - heavy

    wanted = clients_from(headless) if headless else []
    browser_bin = chromium_path() if headless else ""
    upstream = UpstreamServer()
    up_port = await upstream.start("127.0.0.1", 0)
    cfg = ProxyConfig(
        modes=[f"reverse:http://127.0.0.1:{up_port}@127.0.0.1:{port}"],
        options=run_options(
            hopmeter_hop="edge",
            hopmeter_records=records,
            hopmeter_metrics="off",
            hopmeter_console="off",
            hopmeter_browser=True,
        ),
    )
    replies: list[dict[str, Any]] = []
    master_box: list[Any] = []

    class Replies(FlowObserver):
        def observe(self, result: FlowResult) -> None:
            rec = result.record
            if "browser" not in rec:
                return
            replies.append(rec)
            print(f"- {summary_line(rec)}", flush=True)
            if wanted and len(replies) >= len(wanted):
                master_box[0].shutdown()

    def on_master(master: Any) -> None:
        master_box.append(master)
        master.addons.get("hopmeter").add_observer(Replies())

    chromium: subprocess.Popen[bytes] | None = None
    profile = tempfile.TemporaryDirectory(prefix="hopmeter-demo-")
    url = f"http://127.0.0.1:{port}/demo/"

    async def show() -> None:
        nonlocal chromium
        await wait_port(port)
        where = f"; records: {records}" if records else " (add --records PATH to keep them)"
        print(f"hopmeter demo: the chat page is at {url}{where}", flush=True)
        if not wanted:
            print("hopmeter demo: open it in a browser; Ctrl-C to stop", flush=True)
            return
        page = f"{url}?client=" + ",".join(wanted)
        chromium = _start_chromium(browser_bin, Path(profile.name), page)
        asyncio.get_running_loop().call_later(
            HEADLESS_S_PER_REPLY * len(wanted), master_box[0].shutdown
        )

    tasks: list[asyncio.Task[None]] = []

    async def before() -> None:  # the proxy listens once run() starts: show the page then
        tasks.append(asyncio.create_task(show()))

    quiet_mitmproxy_logs(False)
    try:
        await run_proxy(cfg, before=before, on_master=on_master)
        for task in tasks:
            if task.done() and task.exception() is not None:
                print(f"hopmeter demo: {task.exception()}", file=sys.stderr)
                return 1
    finally:
        stop_chromium(chromium)
        profile.cleanup()
    print(f"\n{len(replies)} replies measured in the browser.", flush=True)
    if records and replies:
        print(f"Draw their lanes: hopmeter report {records} --html report.html", flush=True)
    if wanted and len(replies) < len(wanted):
        print(f"hopmeter demo: only {len(replies)} of {len(wanted)} replies came", file=sys.stderr)
        return 1
    return 0


def _start_chromium(binary: str, profile: Path, url: str) -> subprocess.Popen[bytes]:
    args = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    if os.geteuid() == 0:  # Chromium refuses to run as root with its sandbox
        args.append("--no-sandbox")
    return subprocess.Popen(
        [*args, url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stop_chromium(proc: subprocess.Popen[bytes] | None) -> None:
    """End Chromium and its helpers, zygotes and renderers (they share its process group):
    SIGTERM, then SIGKILL."""
    if proc is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
            return
