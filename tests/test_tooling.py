"""House rules that tools enforce: a sans-I/O core, lint and strict types on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_core_imports_no_mitmproxy_or_prometheus() -> None:
    """Importing every core module loads neither mitmproxy nor prometheus_client."""
    code = (
        "import pkgutil, sys, importlib, hopmeter.core as c\n"
        "for m in pkgutil.iter_modules(c.__path__):\n"
        "    importlib.import_module('hopmeter.core.' + m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('mitmproxy', 'prometheus_client')]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_lint_and_format_pass() -> None:
    """ruff's rules (including the core's banned imports) and its formatter are clean."""
    for args in (["check", "addons", "tests"], ["format", "--check", "addons", "tests"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes() -> None:
    """mypy --strict finds nothing in the package or the bench harness."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
