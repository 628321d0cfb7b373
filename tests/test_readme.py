"""README's and the docs' commands are real: every hopmeter command line parses, the Docker lines
match, every flag of `hopmeter run` is in the table README links (docs/cli.md), and every doc
README links exists."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from hopmeter.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _commands() -> list[tuple[str, str]]:
    lines = []
    for path in (ROOT / "README.md", *DOCS):
        for block in re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S):
            joined = block.replace("\\\n", " ")
            lines += [(path.name, ln.split("#", 1)[0].strip()) for ln in joined.splitlines()]
    return [(name, ln) for name, ln in lines if ln.startswith("hopmeter ")]


@pytest.mark.parametrize(("doc", "line"), _commands())
def test_documented_command_parses(doc: str, line: str) -> None:
    """Each `hopmeter ...` line in README and docs/ is accepted by the real parser."""
    build_parser().parse_args(shlex.split(line)[1:])


def test_every_linked_doc_exists() -> None:
    """Every local file README links to is there (README is short: its detail is in them)."""
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert links
    assert not [link for link in links if not (ROOT / link).exists()]


def test_docker_lines_are_the_dockerfile_ones() -> None:
    """The build and run commands in the Dockerfile's header are the ones README documents."""
    header = [
        ln[1:].strip()
        for ln in (ROOT / "Dockerfile").read_text().splitlines()
        if ln.startswith("#   docker ")
    ]
    assert header
    for line in header:
        assert line in README, line


def test_two_commands_are_first() -> None:
    """README opens with the demo and the test command, and CI runs the same test command."""
    assert "scripts/demo" in README and "scripts/test" in README
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_the_flag_table_lists_every_run_flag_with_its_variable() -> None:
    """Each `hopmeter run` flag (and the upstream) is a row of docs/cli.md's table, next to the
    environment variable `--help` names for it; README links the table."""
    from hopmeter import env

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert "(docs/cli.md)" in README
    table = (ROOT / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `(HOPMETER_\w+)` \|", table, flags=re.M)
    documented = {flag.split()[0]: variable for flag, variable in rows}
    for binding in env.bound(sub.choices["run"]):
        action = binding.action
        flag = action.option_strings[-1] if action.option_strings else "UPSTREAM_URL"
        assert documented.get(flag) == binding.name, flag
