"""hopmeter in real mitmweb: marks, verdicts and the content view, read through mitmweb's own API.

One mitmweb, loaded with `-s "$(hopmeter --addon-path)"`, in front of the demo upstream (a clean
and a stalled stream) and of an nginx that gzips and buffers it (a held stream). The flows are
read the way mitmweb's UI reads them (REST API), saved the way its File > Save does (/flows/dump),
opened again in a second mitmweb, and drawn in headless Chromium: the screenshot lands in the
test's tmp dir and in test-output/mitmweb-hopmeter.png at the repository root (git-ignored).
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mitmproxy import http
from mitmproxy import io as mitmio
from mitmproxy.contentviews import Metadata

from hopmeter.proxy.addon.views import HopmeterContentview
from tests.harness import chromium, nginx
from tests.harness.chromium import Chromium
from tests.harness.mitmweb import KNOWN_CONSOLE_ERROR_PATH, MitmWeb
from tests.harness.nginx import NginxServer
from tests.harness.procs import free_port, hopmeter, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not nginx.available(), reason="nginx is not installed"),
]
TEST_OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
# The three streams: (name, scenario, through the gzip-holding nginx)
STREAMS = (
    ("clean", "tokens=20;rate=40;emoji=1", False),
    ("stall", "tokens=20;rate=40;emoji=1;stall_at=8;stall_s=0.7", False),
    ("held", "tokens=60;rate=40", True),  # long enough for gzip to hold it whole
)
GLYPHS = {"clean": "🟢", "stall": "🟠", "held": "🔴"}


@dataclass
class Captured:
    """The running mitmweb and its three flows as its API lists them, by name."""

    web: MitmWeb
    flows: dict[str, dict[str, Any]]
    tmp: Path


def _send(port: int, scenario: str) -> None:
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-hopmeter-scenario": scenario, "accept-encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """mitmweb with hopmeter, the three streams sent through it and marked."""
    tmp = tmp_path_factory.mktemp("mitmweb")
    up, direct, held = free_port(), free_port(), free_port()
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        NginxServer(up, "gzip_hold", prefix=tmp) as gz,
        MitmWeb(
            tmp,
            f"reverse:http://127.0.0.1:{up}@127.0.0.1:{direct}",
            f"reverse:http://127.0.0.1:{gz.port}@127.0.0.1:{held}",
        ) as web,
    ):
        assert web.proc is not None
        web.proc.wait_port(direct)
        for _, scenario, via_nginx in STREAMS:
            _send(held if via_nginx else direct, scenario)

        def marked() -> list[dict[str, Any]] | None:
            flows = web.api.flows()
            done = len(flows) == len(STREAMS) and all(f["marked"] for f in flows)
            return flows if done else None

        flows = wait_for(marked, 30, "three marked flows in mitmweb")
        by_name = dict(zip([s[0] for s in STREAMS], flows, strict=True))
        yield Captured(web, by_name, tmp)


def test_marks_and_comments_name_each_streams_verdict(captured: Captured) -> None:
    """Green, orange and red marks; each comment is the one-line verdict with its findings."""
    flows = captured.flows
    assert {name: f["marked"] for name, f in flows.items()} == GLYPHS
    for f in flows.values():
        assert f["comment"].startswith("TTFT ") and " · ITL p50 " in f["comment"]
    assert flows["clean"]["comment"].endswith("· clean")
    assert flows["stall"]["comment"].endswith("· stall")
    assert "whole_body_hold" in flows["held"]["comment"].rsplit("·", 1)[1]


def test_the_view_is_chosen_for_each_stream_and_shows_its_timeline(captured: Captured) -> None:
    """mitmweb picks the hopmeter view by itself; it leads with the verdict and lists events."""
    api = captured.web.api
    views = {name: api.view(f["id"]) for name, f in captured.flows.items()}
    for name, view in views.items():
        assert view["view_name"] == "hopmeter", (name, view["description"])
        lines = view["text"].splitlines()
        assert lines[0].startswith("hopmeter · openai.chat gpt-4o · 200 · ended complete")
        assert lines[1].endswith(captured.flows[name]["comment"])
        assert any(line.startswith("EVENTS ") for line in lines)
    assert '" 🦙"' in views["clean"]["text"] or '"🦙"' in views["clean"]["text"]
    assert "◀ ▲ STALL" not in views["clean"]["text"]
    assert sum("◀ ▲ STALL" in line for line in views["stall"]["text"].splitlines()) == 1
    assert views["held"]["description"] == "[decoded gzip]"
    assert "  ✖ whole_body_hold (error):" in views["held"]["text"]
    assert sum(line.endswith("≡ burst") for line in views["held"]["text"].splitlines()) > 50


def test_views_by_name_state_options_and_commands(captured: Captured) -> None:
    """Both views by name, options with help, and the commands through mitmweb's API."""
    api = captured.web.api
    held = captured.flows["held"]
    assert api.view(held["id"], "hopmeter")["text"] == api.view(held["id"])["text"]
    record = orjson.loads(api.view(held["id"], "hopmeter-record")["text"])
    assert record["flow_id"] == held["id"] and record["schema"] == "hopmeter.flow/1"
    assert {"hopmeter", "hopmeter-record"} <= set(api.get("/state")["contentViews"])
    options = api.get("/options")
    mine = {k: v for k, v in options.items() if k.startswith("hopmeter_")}
    assert all(v["help"] for v in mine.values()) and "hopmeter_mark" in mine
    assert mine["hopmeter_stall_threshold"]["type"] == "str"
    records = orjson.loads(api.command("hopmeter.record", "@all")["value"])
    assert sorted(r["flow_id"] for r in records) == sorted(f["id"] for f in captured.flows.values())
    red = orjson.loads(api.command("hopmeter.record", "~marker red_circle")["value"])
    assert red["flow_id"] == held["id"]
    out = captured.tmp / "report.html"
    said = api.command("hopmeter.report", "@marked", str(out))["value"]
    assert said == f"hopmeter: wrote the report of 3 flows to {out}" and out.stat().st_size > 1000
    nothing = api.command("hopmeter.record", "!~marked")
    assert "none of these 0 flows has a hopmeter record" in nothing["error"]


def test_a_saved_file_shows_the_same_view_offline_and_in_a_second_mitmweb(
    captured: Captured,
) -> None:
    """Saved as mitmweb's File > Save does and read back, each flow keeps its record, mark and
    comment, and the view renders the same text, offline and in another mitmweb."""
    api = captured.web.api
    saved = captured.tmp / "flows.mitm"
    saved.write_bytes(api.dump())
    live = {f["id"]: api.view(f["id"])["text"] for f in captured.flows.values()}
    loaded = list(mitmio.FlowReader(io.BytesIO(saved.read_bytes())).stream())
    assert sorted(f.id for f in loaded) == sorted(live)
    for f in loaded:
        assert isinstance(f, http.HTTPFlow) and f.response is not None
        meta = Metadata(flow=f, http_message=f.response, content_type="text/event-stream")
        assert HopmeterContentview().prettify(f.response.content or b"", meta) == live[f.id]
    with MitmWeb(captured.tmp, args=("--rfile", str(saved)), name="mitmweb-reopened") as again:
        flows = wait_for(lambda: again.api.flows() or None, 30, "the saved flows listed")
        assert sorted(f["id"] for f in flows) == sorted(live)
        for f in flows:
            assert f["marked"] in GLYPHS.values() and f["comment"].startswith("TTFT ")
            assert again.api.view(f["id"])["text"] == live[f["id"]]
        assert "Traceback" not in again.output()


@pytest.mark.skipif(not chromium.available(), reason="chromium is not installed")
def test_screenshot_of_the_view_in_chromium(captured: Captured, tmp_path: Path) -> None:
    """mitmweb's UI draws the marks, the comments and the stall flow's hopmeter view, in
    headless Chromium, with no console error but mitmweb's own missing stylesheet."""
    web = captured.web
    stall = captured.flows["stall"]["id"]
    with Chromium(tmp_path, width=1400, height=860) as browser:
        page = browser.open(f"{web.url}#/flows/{stall}/response")
        wait_for(
            lambda: page.evaluate(
                "!!document.querySelector('.contentview pre')?.innerText.includes('◀ ▲ STALL')"
            ),
            30,
            "the hopmeter view drawn",
        )
        seen = page.evaluate(
            "({view: document.querySelector('.contentview h5')?.innerText,"
            " marks: [...document.querySelectorAll('.flow-table tbody tr')].map(r => r.innerText),"
            " comments: [...document.querySelectorAll('.flow-table .col-comment')]"
            ".map(e => e.innerText)})"
        )
        shot = page.screenshot(tmp_path / "mitmweb-hopmeter.png")
        errors = page.errors()
    TEST_OUTPUT.mkdir(exist_ok=True)
    shutil.copy(shot, TEST_OUTPUT / "mitmweb-hopmeter.png")
    assert [e for e in errors if KNOWN_CONSOLE_ERROR_PATH not in e] == []
    assert seen["view"] == "hopmeter"
    assert sorted(g for row in seen["marks"] for g in GLYPHS.values() if g in row) == sorted(
        GLYPHS.values()
    )
    assert sum(c.startswith("TTFT ") for c in seen["comments"]) == 3
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_measured_flow_can_be_edited_and_duplicated_in_the_ui(captured: Captured) -> None:
    """Editing a comment and duplicating a flow work (live state never sits in the flow), and a
    comment edited by hand survives."""
    api = captured.web.api
    clean = captured.flows["clean"]["id"]
    assert api.request("PUT", f"/flows/{clean}", {"comment": "looked at it"}).status_code == 200
    assert api.request("POST", f"/flows/{clean}/duplicate").status_code == 200
    flows = api.flows()
    assert len(flows) == len(STREAMS) + 1
    assert next(f for f in flows if f["id"] == clean)["comment"] == "looked at it"
