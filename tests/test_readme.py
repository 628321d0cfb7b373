"""README's and the docs' commands are real: every hopmeter command line parses, the Docker lines
match, every flag of `hopmeter run` is in the table README links (docs/cli.md), and every doc
README links exists."""

from __future__ import annotations

import argparse
import ast
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


ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "addons" / "hopmeter"
# where a path in docs/architecture.md may start: the repository, the package, or proxy/
PATH_BASES = (ROOT, PACKAGE, PACKAGE / "proxy")


def _defined_names() -> set[str]:
    """Every name the package, its tests and benches define, and mitmproxy's, h11's and
    asyncio's and subprocess's (the map names the private parts the fast path reaches into, and
    how the tests start processes)."""
    import asyncio
    import subprocess

    import h11
    import mitmproxy

    roots = [PACKAGE, ROOT / "tests", ROOT / "bench"]
    roots += [Path(m.__file__).parent for m in (asyncio, h11, mitmproxy) if m.__file__]
    files = [p for root in roots for p in root.rglob("*.py")]
    names: set[str] = set()
    for path in [*files, Path(subprocess.__file__)]:
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
    return names


def _path_exists(ref: str) -> bool:
    """`proxy/addon/tap.py`, `run/config.py`, `core/vocab.Api`, `proxy/run/command.add_parser`."""
    if any((base / ref).exists() for base in PATH_BASES):
        return True
    folder, _, leaf = ref.rpartition("/")
    module = leaf.split(".")[0] + ".py"
    return "." in leaf and any((base / folder / module).is_file() for base in PATH_BASES)


def test_the_architecture_map_names_only_what_exists() -> None:
    """Every file, class, function and metric docs/architecture.md names is in the code, so a
    newcomer following a chunk or an option through it never meets a name that is gone."""
    text = ARCHITECTURE.read_text()
    refs = set(re.findall(r"`([^`\s]+)`", text))
    defined = _defined_names()
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    gone = []
    for ref in sorted(refs):
        if "<" in ref or "*" in ref or ref.startswith(("-", "hopmeter.flow/")):
            continue  # a pattern, a flag (test_documented_command_parses), the schema's name
        if "/" in ref or re.search(r"\.(toml|js|md|json|ya?ml|txt)$", ref):
            ok = ref.endswith("/") and any((b / ref).is_dir() for b in PATH_BASES)
            ok = ok or _path_exists(ref)
        elif ref.endswith(".py"):
            ok = any(True for _ in ROOT.glob(f"[!.]*/**/{ref}"))
        elif m := re.fullmatch(r"hopmeter_(\w+?)(?:_total|_seconds)?(\{[\w,]*\})?", ref):
            ok = f'"{m[1]}' in source or f"hopmeter_{m[1]}" in source
        elif re.fullmatch(r"\.?[A-Za-z_][\w.]*(\(.*\))?", ref):
            name = ref.split("(")[0].rstrip(".").split(".")[-1]
            ok = name in defined
        else:
            continue  # an expression (flow.metadata["hopmeter"], addon=)
        if not ok:
            gone.append(ref)
    assert not gone, f"docs/architecture.md names what the code does not have: {gone}"
