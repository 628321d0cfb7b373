"""`hopmeter report` as text: the fleet summary and one line per flow, from real records."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopmeter.core.figures import token_gaps, weighted_quantile
from hopmeter.core.vocab import SEVERITY_ORDER
from hopmeter.export.records import read_records
from hopmeter.report import command as report
from hopmeter.report.fleet import latency
from hopmeter.report.text import clean, ms
from tests.harness.procs import HOPMETER


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hopmeter")
    report.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", *argv])


def _text(capsys: pytest.CaptureFixture[str], *paths: Path) -> list[str]:
    assert report.run(_args(*map(str, paths))) == 0
    return capsys.readouterr().out.splitlines()


def _records(*paths: Path) -> list[dict[str, Any]]:
    return list(read_records([str(p) for p in paths]))


def test_ms_reads_like_the_console() -> None:
    """Seconds print as ms below one second, seconds above, with sensible precision."""
    assert [ms(x) for x in (None, 0.0, 0.0003, 0.0055, 0.053, 1.5)] == [
        "-",
        "0ms",
        "0.30ms",
        "5.5ms",
        "53ms",
        "1.50s",
    ]


def test_control_characters_from_traffic_are_made_visible() -> None:
    """An escape sequence in a model name reaches the terminal as text, not as a command."""
    assert clean("gpt\x1b[2J\x07\u009b-4o\n") == "gpt\\x1b[2J\\x07\\x9b-4o\\x0a"


@pytest.mark.integration
def test_fleet_summary_counts_and_quantiles(
    capsys: pytest.CaptureFixture[str], demo_path: Path, held_path: Path
) -> None:
    """Flows are counted per hop, api and model; TTFB/TTFT are nearest-rank over flows."""
    records = _records(demo_path, held_path)
    lines = _text(capsys, demo_path, held_path)
    hops = Counter(r["hop"] for r in records)
    traces = len({r["trace_id"] for r in records})
    assert lines[0].startswith(f"hopmeter report: {len(records)} flows in {traces} traces (2 seen")
    tally = ", ".join(f"{h} {n}" for h, n in sorted(hops.items(), key=lambda kv: (-kv[1], kv[0])))
    assert lines[1] == f"  flows by hop:   {tally}"
    assert lines[2].startswith("  flows by api:   openai.chat ")
    assert "claude-sonnet-4-5 1" in lines[3] and "gpt-4o 4" in lines[3]
    ttfb = sorted(r["figures"]["ttfb_s"] for r in records)
    (all_row,) = [line for line in lines if line.startswith("  all hops ")]
    assert f"{ms(ttfb[len(ttfb) // 2 - (len(ttfb) % 2 == 0)])}/{ms(ttfb[-1])}" in all_row
    assert all(any(line.startswith(f"  {hop} ") for line in lines) for hop in hops)


@pytest.mark.integration
def test_findings_are_counted_worst_first(
    capsys: pytest.CaptureFixture[str], demo_path: Path, held_path: Path
) -> None:
    """Every finding kind is listed once with its flow count, errors before warnings before info."""
    records = _records(demo_path, held_path)
    lines = _text(capsys, demo_path, held_path)
    start = lines.index("  findings, worst first:")
    rows = [line.split() for line in lines[start + 1 :] if line.startswith("    ")]
    ranks = [SEVERITY_ORDER[row[0]] for row in rows]
    assert ranks == sorted(ranks)
    kinds = Counter(f["kind"] for r in records for f in r["findings"])
    listed = {row[1]: row for row in rows}
    for kind, n in kinds.items():
        assert f"{n} flows" in " ".join(listed[kind]), kind
    assert "segment_batching" in listed  # found by aligning the hops, in no flow's own findings
    assert rows[0][:2] == ["error", "whole_body_hold"]


@pytest.mark.integration
def test_one_line_per_flow_with_its_holds(
    capsys: pytest.CaptureFixture[str], demo_path: Path, held_path: Path
) -> None:
    """After the summary, each flow is one line; an outer flow's line ends with its holds."""
    records = _records(demo_path, held_path)
    lines = _text(capsys, demo_path, held_path)
    flows = lines[lines.index("flows:") + 1 :]
    assert len(flows) == len(records)
    for rec in records:
        (line,) = [f for f in flows if f"[{rec['hop']}]" in f and rec["trace_id"][:8] in f]
        assert f"{rec['api']} {rec['model']}" in line
        if rec.get("hops"):
            assert "hold edge>origin first=" in line and line.endswith("whole_body")


@pytest.mark.integration
def test_pooled_itl_of_one_flow_is_its_own(demo_path: Path) -> None:
    """Pooling one flow's token-weighted gaps gives the ITL p50 the flow's record states."""
    for rec in _records(demo_path):
        if rec["figures"]["itl_p50_s"] is None:
            continue
        events = rec["events"]
        gaps = token_gaps([e[0] for e in events], [e[1] for e in events])
        expected = weighted_quantile(gaps.values_s, list(gaps.weights), 0.5)
        assert latency([rec]).itl[0] == expected
        assert expected == pytest.approx(
            rec["figures"]["itl_p50_s"], abs=5e-6
        )  # offsets are rounded


@pytest.mark.integration
def test_hostile_strings_are_escaped(
    capsys: pytest.CaptureFixture[str], demo_path: Path, tmp_path: Path
) -> None:
    """A model name with a terminal escape prints escaped in the summary and the flow line."""
    rec = _records(demo_path)[0]
    rec["model"] = "evil\x1b]0;pwned\x07"
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(orjson.dumps(rec) + b"\n")
    out = "\n".join(_text(capsys, path))
    assert "\x1b" not in out and "\x07" not in out
    assert out.count("evil\\x1b]0;pwned\\x07") == 2


def test_no_records_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A file without flow records exits 1 and says so on stderr."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"schema": "something.else"}\n')
    assert report.run(_args(str(empty))) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"hopmeter report: no hopmeter.flow/1 records in {empty}\n"


@pytest.mark.integration
def test_shipped_command(demo_path: Path, tmp_path: Path) -> None:
    """`hopmeter report RECORDS --html OUT` prints the summary and writes the page (once wired)."""
    helped = subprocess.run(
        [*HOPMETER, "report", "--help"], check=False, capture_output=True, timeout=60
    )
    if helped.returncode != 0:
        pytest.skip("`hopmeter report` is not wired into cli.py yet")
    out = tmp_path / "report.html"
    done = subprocess.run(
        [*HOPMETER, "report", str(demo_path), "--html", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("hopmeter report: 7 flows in 7 traces")
    assert done.stdout.endswith(f"hopmeter report: wrote {out}\n")
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.integration
def test_report_imports_no_mitmproxy() -> None:
    """The report reads JSON only: importing all of it loads neither mitmproxy nor prometheus."""
    code = (
        "import pkgutil, sys, importlib, hopmeter.report as r\n"
        "for m in pkgutil.iter_modules(r.__path__):\n"
        "    importlib.import_module('hopmeter.report.' + m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('mitmproxy', 'prometheus_client')]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_page_s_lanes_are_in_their_record_s_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A record with a joined beacon is one line: its hop's figures, the first painted token,
    the client finding and the two segments' holds; the page's lanes get no lines of their own."""
    from tests.report.literal import PAGE_EDGE

    path = tmp_path / "page.jsonl"
    path.write_bytes(orjson.dumps(PAGE_EDGE) + b"\n")
    lines = [line for line in _text(capsys, path) if " page " in line or "[" in line]
    (line,) = [line for line in lines if "POST /v1/chat/completions" in line]
    assert "[edge]" in line and "painted=115ms" in line and "client=client_smoothing_buffer" in line
    assert "hold screen>browser first=9.5ms" in line and "hold browser>edge" in line
    assert not [line for line in lines if "[screen]" in line or "[browser]" in line]
