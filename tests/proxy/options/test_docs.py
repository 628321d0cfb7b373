"""Tests for hopmeter.proxy.options.docs: docs/cli.md is what the declarations make."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hopmeter.env import variable
from hopmeter.proxy.options import FLAGS, OPTIONS
from hopmeter.proxy.options.docs import main, render

ROOT = Path(__file__).resolve().parents[3]
CLI_MD = ROOT / "docs" / "cli.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$", flags=re.M)


def test_the_committed_page_is_what_the_declarations_make(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/cli.md is exactly what `.venv/bin/python -m hopmeter.proxy.options.docs` writes."""
    assert main() == 0
    made = capsys.readouterr().out
    assert made == render()
    assert CLI_MD.read_text() == made, (
        "docs/cli.md is stale: .venv/bin/python -m hopmeter.proxy.options.docs > docs/cli.md"
    )


def test_every_flag_has_a_row_with_its_variable_and_default() -> None:
    """Each flag of `hopmeter run` (not the hidden one) is a row naming its variable, its
    default and the option it sets."""
    rows = {cells.split()[0]: rest for cells, rest in ROW.findall(render())}
    for s in FLAGS:
        spelled = (s.metavar or "") if s.positional else s.flag
        if s.hidden:
            assert spelled not in rows
            continue
        row = rows[spelled]
        assert f"`{variable(s.attribute if s.positional else s.flag)}`" in row
        assert s.default_words() in row
        if s.option:
            assert f"`{s.option}`" in row
    assert "`hopmeter_console=off`" in rows["--quiet"]


def test_every_option_has_a_row_with_what_hopmeter_run_sets() -> None:
    """Each option is a row of the options table, with the flag that sets it in `hopmeter run`
    or the value `hopmeter run` gives it."""
    rows = dict(ROW.findall(render()))
    for name in OPTIONS:
        assert name in rows
    assert rows["hopmeter_stream"].endswith("| `all`")
    assert rows["hopmeter_console"].endswith("| `--quiet`, `--json`")
    assert rows["hopmeter_trace_header"].endswith("| `--no-trace-header`")


def test_a_bar_inside_a_cell_is_escaped() -> None:
    """`HOST:PORT|off` stays in its cell: the bar is escaped for the table."""
    assert r"`--metrics HOST:PORT\|off`" in render()
