"""The package's import contract (docs/architecture.md, "Layers"): no cycle between its parts,
counting the imports made inside functions, and mitmproxy's proxy core reached from one place.

Read from the source with `ast`, so an import inside a function (made late to keep a command
light) counts as much as one at the top: a cycle cannot hide behind one.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "addons" / "hopmeter"
# mitmproxy's proxy core (its layers, server, events, mode specs): private or close to it, and
# what the fast paths mirror; reached from this folder alone, by at most this many modules
PROXY_CORE = "mitmproxy.proxy"
PROXY_CORE_FOLDER = "hopmeter.proxy.fastpath"
PROXY_CORE_MODULES = 3


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def part_of(module: str) -> str:
    """The part of the package a module belongs to: a subpackage of `hopmeter.proxy`, a package
    of `hopmeter`, or a module at the top (cli, errors, argtypes, ...) on its own."""
    parts = module.split(".")
    if parts[1:2] == ["proxy"] and len(parts) >= 3 and (PACKAGE / "proxy" / parts[2]).is_dir():
        return ".".join(parts[:3])
    return ".".join(parts[:2])


@cache
def imports() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a hopmeter module or of mitmproxy,
    wherever it is written; the line is negative for an import inside a function."""
    found = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        inner = {
            id(node)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(fn)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
                targets += [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules() or target.startswith("mitmproxy"):
                    found.append((name, target, -node.lineno if id(node) in inner else node.lineno))
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_part_of_the_package_imports_one_that_imports_it() -> None:
    """Between the package's parts (hopmeter's packages, hopmeter.proxy's subpackages, the
    modules at the top) the imports make no cycle, imports inside functions counted."""
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    for importer, imported, _ in imports():
        if imported.startswith("hopmeter"):
            a, b = part_of(importer), part_of(imported)
            if a != b:
                edges[a].add(b)
                where[a, b].add(importer)
    cycles = _cycles(edges)
    detail = [
        f"{' <-> '.join(c)}: "
        + "; ".join(f"{a} -> {b} in {sorted(where[a, b])}" for a in c for b in c if (a, b) in where)
        for c in cycles
    ]
    assert not cycles, "import cycles between parts of the package:\n" + "\n".join(detail)


def test_the_check_finds_a_cycle() -> None:
    """The cycle check names a cycle when there is one (it can fail)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_mitmproxys_proxy_core_is_reached_from_one_folder() -> None:
    """mitmproxy.proxy.* is imported by at most three modules, all in hopmeter.proxy.fastpath
    (behind its version gate)."""
    importers = {a for a, b, _ in imports() if b == PROXY_CORE or b.startswith(PROXY_CORE + ".")}
    assert importers, "the check found no importer at all: it is not reading the imports"
    outside = sorted(m for m in importers if not m.startswith(PROXY_CORE_FOLDER + "."))
    assert not outside, f"mitmproxy.proxy imported outside {PROXY_CORE_FOLDER}: {outside}"
    assert len(importers) <= PROXY_CORE_MODULES, sorted(importers)


def test_every_import_inside_a_function_says_why() -> None:
    """An import of a hopmeter module made inside a function carries its reason on its line
    (`# noqa: PLC0415 - why`, or a comment just above): a late import is a choice, not a way
    around a cycle."""
    silent = set()
    for importer, imported, line in imports():
        if line > 0 or not imported.startswith("hopmeter"):
            continue
        path = modules()[importer]
        lines = path.read_text().splitlines()
        here, above = lines[-line - 1], lines[-line - 2].strip()
        if "noqa: PLC0415" not in here and not above.startswith("#"):
            silent.add(f"{path.relative_to(ROOT)}:{-line}")
    assert not silent, "imports inside functions without a reason:\n" + "\n".join(sorted(silent))
