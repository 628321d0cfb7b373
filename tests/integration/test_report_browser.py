"""The HTML report in a real headless Chromium: it renders, one lane per hop, findings, no errors.

Records come from real runs: two listeners around a holding and a streaming nginx, and the demo
(single-hop flows). The screenshot of the whole page lands in the test's tmp dir and in
test-output/report.png at the repository root (git-ignored), for a person to look at.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import orjson
import pytest

from hopmeter.export.records import read_records
from hopmeter.report import command as report
from tests.harness import chromium, nginx
from tests.harness.chromium import Chromium

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not chromium.available(), reason="chromium is not installed"),
    pytest.mark.skipif(not nginx.available(), reason="nginx is not installed"),
]
TEST_OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
# What the page must show, read in the browser: per trace, its lanes drawn with a height, the
# number of hops it says it has, and its findings as visible list items.
SECTIONS_JS = """[...document.querySelectorAll('section.trace')].map(s => ({
  id: s.id,
  hops: Number(s.dataset.hops),
  lanes: [...s.querySelectorAll('svg.lanes g.lane')].map(g => ({
    hop: g.dataset.hop, height: g.getBoundingClientRect().height})),
  bands: [...s.querySelectorAll('svg.lanes g.band')].length,
  findings: [...s.querySelectorAll('li.finding')].map(li => ({
    kind: li.dataset.kind, visible: li.offsetHeight > 0, text: li.innerText})),
  svgWidth: s.querySelector('svg.lanes').getBoundingClientRect().width,
}))"""


@pytest.fixture(scope="module")
def page_path(
    tmp_path_factory: pytest.TempPathFactory, held_path: Path, streaming_path: Path, demo_path: Path
) -> Path:
    """The report of real records (the session's, tests/conftest.py), plus one whose strings carry
    markup, written as HTML."""
    tmp = tmp_path_factory.mktemp("report")
    held, streaming, demo = held_path, streaming_path, demo_path
    rec = next(iter(read_records([str(demo)])))
    rec.update(model='<script>console.error("escaped?")</script>', trace_id="hostile")
    hostile = tmp / "hostile.jsonl"
    hostile.write_bytes(orjson.dumps(rec) + b"\n")
    out = tmp / "report.html"
    parser = argparse.ArgumentParser(prog="hopmeter")
    report.add_parser(parser.add_subparsers(dest="command"))
    paths = [str(p) for p in (held, streaming, demo, hostile)]
    args = parser.parse_args(["report", *paths, "--html", str(out), "--quiet"])
    assert report.run(args) == 0
    return out


def test_report_renders_lanes_and_findings_without_errors(page_path: Path, tmp_path: Path) -> None:
    """Chromium renders every trace with one lane per hop and its findings, and logs no error."""
    with Chromium(tmp_path) as browser:
        page = browser.open(page_path.as_uri())
        assert page.evaluate("document.title").startswith("hopmeter report: ")
        sections = page.evaluate(SECTIONS_JS)
        shot = page.screenshot(tmp_path / "report.png")
        page.screenshot(tmp_path / "report-held.png", "section.trace")
        errors = page.errors()
    TEST_OUTPUT.mkdir(exist_ok=True)
    shutil.copy(shot, TEST_OUTPUT / "report.png")
    shutil.copy(tmp_path / "report-held.png", TEST_OUTPUT / "report-held.png")
    assert errors == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert len(sections) == 4 + 7 + 1  # four two-hop traces, the demo's seven, the hostile one
    for s in sections:
        assert len(s["lanes"]) == s["hops"] and s["bands"] == s["hops"] - 1
        assert all(lane["height"] > 20 for lane in s["lanes"])
        assert s["svgWidth"] > 500
        assert all(f["visible"] and "Fix: " in f["text"] for f in s["findings"])
    two_hop = [s for s in sections if s["hops"] == 2]
    assert len(two_hop) == 4
    assert all([lane["hop"] for lane in s["lanes"]] == ["origin", "edge"] for s in two_hop)
    held = two_hop[0]["findings"]
    assert {"whole_body_hold", "compression_on_stream"} <= {f["kind"] for f in held}


def test_escaped_markup_shows_as_text(page_path: Path, tmp_path: Path) -> None:
    """A model name carrying a script tag is shown as its text and runs nothing."""
    with Chromium(tmp_path) as browser:
        page = browser.open(page_path.as_uri())
        title = page.evaluate("document.querySelector('#trace-hostile h2').textContent")
        scripts = page.evaluate("document.scripts.length")
        errors = page.errors()
    assert '<script>console.error("escaped?")</script>' in title
    assert scripts == 0 and errors == []
