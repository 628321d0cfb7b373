"""House rules that tools enforce: the layers' imports, a test file per module, lint and types."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "addons" / "hopmeter"
TESTS = ROOT / "tests"

# Modules that only real processes reach, and the tests that run them (docs/architecture.md,
# "Tests"). A module listed here has no test file of its own; if it gets one, drop it from here.
REACHED_BY_INTEGRATION: dict[str, tuple[str, ...]] = {
    # `hopmeter run`'s flags and errors, and `--workers N`
    "proxy/run/command.py": ("tests/test_cli.py", "tests/integration/test_workers.py"),
    # the script plain mitmdump loads (`hopmeter --addon-path`)
    "proxy/mitmdump/script.py": ("tests/test_cli.py", "tests/integration/test_faults.py"),
    # `hopmeter report`: the text and HTML reports from real records
    "report/command.py": ("tests/report/test_text.py", "tests/report/test_html.py"),
    # `hopmeter upstream`'s flags and errors; the command every integration test starts
    "upstream/command.py": ("tests/test_cli.py", "tests/probe/test_command.py"),
    # `hopmeter demo`, end to end
    "demo/command.py": ("tests/test_cli.py",),
    # the synthetic upstream, behind every scenario through the proxy and nginx
    "upstream/server.py": (
        "tests/integration/test_scenarios.py",
        "tests/integration/test_transparency.py",
        "tests/probe/test_command.py",
    ),
}


def _modules() -> list[Path]:
    """Every module of the package, relative to it, packages' `__init__.py` aside."""
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def _test_file(module: Path) -> Path:
    """Where a module's own tests live: `tests/<path>/test_<name>.py`."""
    return TESTS / module.parent / f"test_{module.name}"


def test_every_module_has_its_test_file() -> None:
    """Each module has tests/<path>/test_<name>.py, or is listed with the tests that reach it."""
    missing = [
        f"addons/hopmeter/{m} -> {_test_file(m).relative_to(ROOT)}"
        for m in _modules()
        if not _test_file(m).is_file() and m.as_posix() not in REACHED_BY_INTEGRATION
    ]
    assert not missing, "modules without a test file:\n" + "\n".join(missing)


def test_the_integration_list_cannot_rot() -> None:
    """Every listed module exists and has no test file of its own; every listed test exists."""
    modules = {m.as_posix() for m in _modules()}
    problems = []
    for module, tests in REACHED_BY_INTEGRATION.items():
        if module not in modules:
            problems.append(f"{module}: no such module")
        elif _test_file(Path(module)).is_file():
            problems.append(f"{module}: has {_test_file(Path(module)).relative_to(ROOT)} now")
        if not tests:
            problems.append(f"{module}: lists no test")
        problems += [f"{module}: {t} does not exist" for t in tests if not (ROOT / t).is_file()]
    assert not problems, "\n".join(problems)


def test_every_mirrored_test_file_names_a_module() -> None:
    """A test_<name>.py beside the package's folders tests a module or package of that name."""
    orphans = []
    for folder in sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        tests = TESTS / folder.relative_to(PACKAGE)
        for test in sorted(tests.glob("test_*.py")):
            name = test.name.removeprefix("test_").removesuffix(".py")
            if not (folder / f"{name}.py").is_file() and not (folder / name).is_dir():
                orphans.append(str(test.relative_to(ROOT)))
    assert not orphans, "test files of no module:\n" + "\n".join(orphans)


# The mitmproxy layer's functions stay short enough to read at once (issue 31: the flag table
# and the runner had grown past it); a longer one is split, not excused.
PROXY_FUNCTION_LINES = 80


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """The functions (methods and nested ones too) of `source` longer than `limit` lines."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_in_the_proxy_layer_is_over_80_lines() -> None:
    """Every function under hopmeter/proxy/ is at most 80 lines, its docstring included."""
    long = [
        f"{path.relative_to(ROOT)}: {name} ({lines} lines)"
        for path in sorted((PACKAGE / "proxy").rglob("*.py"))
        for name, lines in long_functions(path.read_text(), PROXY_FUNCTION_LINES)
    ]
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


# HopMeter keeps its hooks and options; a flow's end, its waits and outputs live beside it
# (proxy/addon/ending.py, observers.py, outputs.py), so it does not grow back into the hub.
METER_LINES = 350


def test_the_measuring_addon_stays_its_hooks_and_options() -> None:
    """proxy/addon/meter.py (HopMeter) is at most 350 lines."""
    lines = (PACKAGE / "proxy" / "addon" / "meter.py").read_text().count("\n")
    assert lines <= METER_LINES, f"proxy/addon/meter.py has {lines} lines (at most {METER_LINES})"


def test_the_length_check_sees_a_long_function() -> None:
    """The check counts a function's lines, nested and async ones included (it can fail)."""
    source = (
        "async def outer():\n"
        "    def inner():\n"
        "        a = 1\n"
        "        b = 2\n"
        "        return a + b\n"
        "    return inner\n"
    )
    assert long_functions(source, 3) == [("outer", 6), ("inner", 4)]
    assert long_functions(source, 4) == [("outer", 6)]
    assert long_functions("def f():\n    pass\n", 4) == []


# Imports each named module in turn (packages: every module under them), then prints which of the
# banned libraries got loaded and by which import. Run in a fresh interpreter: this one has
# imported everything already.
_IMPORT_CHECK = """
import importlib, pkgutil, sys
banned, names, skip = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3].split(",")
def loaded():
    return {m.split(".")[0] for m in sys.modules} & set(banned)
def walk(name):
    yield name
    mod = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
        if info.name not in skip:
            yield info.name
culprits = {}
for top in names:
    for name in walk(top):
        importlib.import_module(name)
        for lib in loaded() - set(culprits):
            culprits[lib] = name
print(" ".join(f"{lib} (by {name})" for lib, name in sorted(culprits.items())))
"""


def _loaded_by(names: list[str], banned: list[str], skip: tuple[str, ...] = ()) -> str:
    """Which `banned` libraries importing `names` (and every module under them) loads, and how."""
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, ",".join(banned), ",".join(names), ",".join(skip)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.integration
def test_core_imports_no_proxy_or_exporter_library() -> None:
    """Importing every core module loads neither mitmproxy, prometheus_client nor opentelemetry."""
    banned = ["mitmproxy", "prometheus_client", "opentelemetry"]
    assert _loaded_by(["hopmeter.core"], banned) == ""


@pytest.mark.integration
def test_exporters_and_reports_import_no_mitmproxy() -> None:
    """Importing hopmeter.export (OpenTelemetry's module aside) and hopmeter.report loads no
    mitmproxy."""
    names = ["hopmeter.export", "hopmeter.report"]
    assert _loaded_by(names, ["mitmproxy"], skip=("hopmeter.export.otel",)) == ""


@pytest.mark.integration
def test_the_command_line_imports_no_mitmproxy() -> None:
    """Importing hopmeter.cli loads no mitmproxy: `hopmeter report` must start fast."""
    assert _loaded_by(["hopmeter.cli"], ["mitmproxy"]) == ""


@pytest.mark.integration
def test_the_check_sees_a_banned_import() -> None:
    """The import check names the library and the module that loaded it (it can fail)."""
    assert _loaded_by(
        ["hopmeter.proxy.run.config", "hopmeter.proxy.addon.meter"], ["mitmproxy"]
    ) == ("mitmproxy (by hopmeter.proxy.addon.meter)")


@pytest.mark.integration
def test_lint_passes() -> None:
    """scripts/lint, as a contributor runs it: ruff's rules (including the core's banned
    imports), its formatter and mypy --strict find nothing, in the venv running the suite."""
    result = subprocess.run(
        ["bash", "scripts/lint"],
        cwd=ROOT,
        env={**os.environ, "HOPMETER_VENV": sys.prefix},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
