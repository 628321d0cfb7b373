"""`hopmeter report --html`: one self-contained page with each trace's lanes, from real records.

The page's structure is read back with the standard library's HTML parser; the browser test
(tests/integration/test_report_browser.py) checks what Chromium makes of it.
"""

from __future__ import annotations

import argparse
import itertools
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopmeter.errors import HopmeterError
from hopmeter.export.records import read_records
from hopmeter.report import command as report


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hopmeter")
    report.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", *argv])


@dataclass
class Section:
    """What one trace section holds."""

    attrs: dict[str, str]
    lanes: list[str] = field(default_factory=list)  # data-hop, top to bottom
    bands: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # data-kind
    text: list[str] = field(default_factory=list)


class Page(HTMLParser):
    """Every tag and text of the page, and the trace sections' lanes, bands and findings."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.sections: list[Section] = []
        self.text: list[str] = []
        self._in_section = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        cls = a.get("class", "").split()
        if tag == "section" and "trace" in cls:
            self.sections.append(Section(attrs=a))
        elif self.sections and tag == "g" and "lane" in cls:
            self.sections[-1].lanes.append(a["data-hop"])
        elif self.sections and tag == "g" and "band" in cls:
            self.sections[-1].bands.append(a["data-segment"])
        elif self.sections and tag == "li" and "finding" in cls:
            self.sections[-1].findings.append(a["data-kind"])

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.sections:
            self.sections[-1].text.append(data)


def _page(tmp_path: Path, *paths: Path, extra: tuple[str, ...] = ()) -> Page:
    out = tmp_path / "report.html"
    assert report.run(_args(*map(str, paths), "--html", str(out), "--quiet", *extra)) == 0
    return Page(out.read_text(encoding="utf-8"))


def _traces(*paths: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in read_records([str(p) for p in paths]):
        out.setdefault(rec["trace_id"], []).append(rec)
    return out


@pytest.mark.integration
def test_one_section_per_trace_with_one_lane_per_hop(
    tmp_path: Path, demo_path: Path, held_path: Path, streaming_path: Path
) -> None:
    """Each trace is a section; its lanes are its hops, the one nearest the model on top."""
    page = _page(tmp_path, demo_path, held_path, streaming_path)
    traces = _traces(demo_path, held_path, streaming_path)
    assert len(page.sections) == len(traces)
    for section in page.sections:
        recs = traces[section.attrs["id"].removeprefix("trace-")]
        hops = [r["hop"] for r in sorted(recs, key=lambda r: r["request"]["t_start"])]
        assert section.lanes == hops[::-1]
        assert section.attrs["data-hops"] == str(len(hops))
        assert section.bands == (["edge>origin"] if len(hops) == 2 else [])


@pytest.mark.integration
def test_every_finding_is_shown_with_its_fix(
    tmp_path: Path, demo_path: Path, held_path: Path
) -> None:
    """Each hop's and segment's finding is listed in its trace's section with a fix sentence."""
    page = _page(tmp_path, demo_path, held_path)
    traces = _traces(demo_path, held_path)
    for section in page.sections:
        recs = traces[section.attrs["id"].removeprefix("trace-")]
        own = [f["kind"] for r in recs for f in r["findings"]]
        segment = [f["kind"] for r in recs for h in r.get("hops") or [] for f in h["findings"]]
        assert sorted(section.findings) == sorted(own + segment)
        text = "".join(section.text)
        assert text.count("Fix: ") == len(own + segment)
        for fix in {f["fix"] for r in recs for f in r["findings"]}:
            assert fix in text


@pytest.mark.integration
def test_held_trace_headline_and_holds_table(tmp_path: Path, held_path: Path) -> None:
    """A whole-body hold is the trace's headline and its segment row says how long and live."""
    page = _page(tmp_path, held_path)
    traces = _traces(held_path)
    for section in page.sections:
        (outer,) = [r for r in traces[section.attrs["id"][6:]] if r.get("hops")]
        first = outer["hops"][0]["first_token_hold_s"]
        text = " ".join(section.text)
        assert "Segment edge>origin held the whole body: first token " in text
        assert f"{first:.2f}s" in text and "live" in text


@pytest.mark.integration
def test_page_is_self_contained(tmp_path: Path, demo_path: Path, streaming_path: Path) -> None:
    """No script, no link, no external URL; a CSP forbids fetching anything."""
    page = _page(tmp_path, demo_path, streaming_path)
    html = (tmp_path / "report.html").read_text()
    assert not [t for t, _ in page.tags if t in ("script", "link", "iframe", "img", "object")]
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched
    (csp,) = [a for t, a in page.tags if t == "meta" and a.get("http-equiv")]
    assert csp["content"].startswith("default-src 'none'")
    assert not [a for _, a in page.tags for k in a if k.startswith("on")]


@pytest.mark.integration
def test_strings_from_traffic_are_escaped(tmp_path: Path, demo_path: Path) -> None:
    """A model, path and hop name carrying markup arrive as text, not as elements."""
    rec = next(iter(read_records([str(demo_path)])))
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    rec.update(model=evil, hop=evil + "\x1b[31m")
    rec["request"]["path"] = "/v1/" + evil
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(orjson.dumps(rec) + b"\n")
    page = _page(tmp_path, path)
    assert not [t for t, _ in page.tags if t in ("script", "img")]
    assert not [a for _, a in page.tags for k in a if k.startswith("on")]
    text = "".join(page.text)
    assert evil in text and "\x1b" not in text and "\\x1b[31m" in text
    (section,) = page.sections
    assert section.lanes == [evil + "\\x1b[31m"]


@pytest.mark.integration
def test_single_hop_stall_is_drawn_in_its_lane(tmp_path: Path, demo_path: Path) -> None:
    """A one-hop flow with a stall gets one lane with an orange stall run titled with its gap."""
    page = _page(tmp_path, demo_path)
    html = (tmp_path / "report.html").read_text()
    stalled = [r for r in read_records([str(demo_path)]) if r["figures"]["stalls"]]
    assert stalled and all(len(s.lanes) == 1 for s in page.sections)
    for rec in stalled:
        # the lane's gaps come from the record's event times, each rounded to the microsecond,
        # so the largest may differ from the rounded max_gap_s by a microsecond: compare as much
        times = [t for t, tokens, _ in rec["events"] if tokens > 0]
        gap = max(b - a for a, b in itertools.pairwise(times))
        assert gap == pytest.approx(rec["figures"]["max_gap_s"], abs=2e-6)
        assert f"<title>stall {gap:.3f} s</title>" in html


@pytest.mark.integration
def test_max_traces_keeps_the_worst(tmp_path: Path, demo_path: Path, held_path: Path) -> None:
    """With --max-traces 2 the two held traces are drawn and the rest counted."""
    page = _page(tmp_path, demo_path, held_path, extra=("--max-traces", "2"))
    assert [s.lanes for s in page.sections] == [["origin", "edge"], ["origin", "edge"]]
    assert "7 more traces not drawn (--max-traces)." in "".join(page.text)


def test_missing_output_folder_is_a_usage_error(tmp_path: Path) -> None:
    """--html into a folder that does not exist names the folder before anything is read."""
    args = _args(str(tmp_path / "absent.jsonl"), "--html", str(tmp_path / "nope" / "r.html"))
    with pytest.raises(HopmeterError, match=r"--html .*: folder .*nope does not exist"):
        report.run(args)


@pytest.mark.integration
def test_an_output_that_cannot_be_written_is_a_usage_error(tmp_path: Path, demo_path: Path) -> None:
    """--html naming a folder (or a file that cannot be written) says so, with the fix."""
    args = _args(str(demo_path), "--html", str(tmp_path), "--quiet")
    with pytest.raises(HopmeterError, match=r"--html .*: cannot write it \(Is a directory\)"):
        report.run(args)


def test_a_record_not_as_hopmeter_writes_it_is_named(tmp_path: Path) -> None:
    """A record that was cut or edited (a field missing, a figure of the wrong type) is an error
    naming which record and why, not a traceback from deep inside the report."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"schema":"hopmeter.flow/1","flow_id":"a","hop":"edge","figures":"x"}\n')
    with pytest.raises(HopmeterError, match=r"record 1 of .*r.jsonl \(flow_id 'a'\) is not as"):
        report.run(_args(str(path)))


@pytest.mark.integration
def test_segments_show_the_inner_hops_own_hold_apart(tmp_path: Path, streaming_path: Path) -> None:
    """Real two-hop records carry out times: each band draws the origin's own part in its own
    colour, and the holds table gives the origin's own p99 and the wire's apart."""
    page = _page(tmp_path, streaming_path)
    assert page.sections and all(s.bands == ["edge>origin"] for s in page.sections)
    assert any(tag == "path" and a.get("class") == "own" for tag, a in page.tags)
    assert "inner hop's own p99" in page.text and "wire p99" in page.text
    for recs in _traces(streaming_path).values():
        (outer,) = [r for r in recs if r.get("hops")]
        seg = outer["hops"][0]
        assert seg["tokens_out"] == seg["tokens_aligned"] > 0
        assert seg["wire_hold_p99_s"] is not None and seg["inner_hold_p99_s"] is not None


def test_the_page_s_lanes_are_drawn_and_explained(tmp_path: Path) -> None:
    """A record with a joined beacon: three lanes from the model's side down (edge, browser,
    screen), the two segments between them, the note that says what the page's lanes are, and
    the client finding with its fix."""
    from tests.report.literal import PAGE_EDGE

    path = tmp_path / "page.jsonl"
    path.write_bytes(orjson.dumps(PAGE_EDGE) + b"\n")
    page = _page(tmp_path, path)
    (section,) = page.sections
    assert section.attrs["data-hops"] == "3"
    assert section.lanes == ["edge", "browser", "screen"]
    assert section.bands == ["browser>edge", "screen>browser"]
    assert section.findings == ["client_smoothing_buffer"]
    text = "".join(section.text)
    assert "body reader got each token" in text and "jitter buffer" in text
    assert "POST /v1/chat/completions" in text  # named by the edge's record, not a page lane


def test_token_streams_come_first_worst_first_and_the_rest_is_summed_up(tmp_path: Path) -> None:
    """A page's own assets (no token) before its replies in time: the replies are drawn first,
    the one with an error finding before the clean one, and the assets are one collapsed table
    at the end, not a section each."""
    from tests.report.literal import T0, flow

    asset = flow("edge", T0, [], trace="asset")
    asset["request"]["path"] = "/demo/"
    clean = flow("edge", T0 + 1, [[0.1, 1, 5], [0.2, 1, 9]], trace="clean")
    broken = flow("edge", T0 + 2, [[0.1, 1, 5]], trace="broken")
    broken["findings"] = [{"kind": "truncated", "severity": "error", "evidence": {}}]
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (asset, clean, broken)))
    page = _page(tmp_path, path)
    assert [s.attrs["id"] for s in page.sections] == ["trace-broken", "trace-clean"]
    details = [a for tag, a in page.tags if tag == "details"]
    assert [a.get("class") for a in details] == ["other-flows"]
    text = "".join(page.text)
    assert "1 other flows carried no token" in text
    assert text.index("POST /demo/") > text.index("trace broken")  # listed after the streams
