"""The locked dependency sets (requirements/*.txt, made by scripts/lock): complete, hashed, in
step with pyproject.toml, and what scripts/setup installed."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
# what a venv holds beside the lock: the installer, and hopmeter itself (editable)
NOT_LOCKED = {"pip", "hopmeter"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


@cache
def pins(name: str) -> dict[str, tuple[Version, Marker | None, int]]:
    """A lock file's pins: package -> (version, marker, number of hashes)."""
    found: dict[str, tuple[Version, Marker | None, int]] = {}
    current = None
    for line in (LOCKS / name).read_text().splitlines():
        pin = _PIN.match(line)
        if pin:
            marker = Marker(pin[3]) if pin[3] else None
            current = canonicalize_name(pin[1])
            assert current not in found, f"{name}: {current} pinned twice"
            found[current] = (Version(pin[2]), marker, 0)
        elif line.strip().startswith("--hash=sha256:") and current is not None:
            version, marker, hashes = found[current]
            found[current] = (version, marker, hashes + 1)
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"{name}: a line that is not a pin, a hash or a comment: {line}")
    return found


def _applies(marker: Marker | None, extra: str = "") -> bool:
    return marker is None or marker.evaluate({"extra": extra})


@pytest.mark.parametrize("lock", ["run.txt", "test.txt"])
def test_every_pin_is_exact_and_hashed(lock: str) -> None:
    """Each package of a lock is pinned to one version with at least one sha256: pip's
    --require-hashes refuses anything else."""
    found = pins(lock)
    assert len(found) > 20
    assert not [name for name, (_, _, hashes) in found.items() if not hashes]


def test_the_run_lock_is_the_test_locks_versions() -> None:
    """What the proxy runs on (run.txt, the Dockerfile's) is what the suite was run with."""
    run, test = pins("run.txt"), pins("test.txt")
    assert set(run) <= set(test)
    assert {n: v for n, (v, _, _) in run.items()} == {n: test[n][0] for n in run}


@pytest.mark.parametrize(
    ("lock", "extras"), [("run.txt", ("otel",)), ("test.txt", ("otel", "test"))]
)
def test_the_lock_satisfies_pyproject(lock: str, extras: tuple[str, ...]) -> None:
    """Every dependency pyproject.toml asks for (and the build system's) is pinned in the lock
    at a version it allows: a changed bound without `scripts/lock` fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [(Requirement(r), "") for r in project["project"]["dependencies"]]
    wanted += [(Requirement(r), "") for r in project["build-system"]["requires"]]
    for extra in extras:
        wanted += [
            (Requirement(r), extra) for r in project["project"]["optional-dependencies"][extra]
        ]
    found = pins(lock)
    problems = []
    for req, extra in wanted:
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue  # not for this platform (uvloop on Windows)
        name = canonicalize_name(req.name)
        if name not in found:
            problems.append(f"{req}: not in {lock}")
        elif not req.specifier.contains(found[name][0], prereleases=True):
            problems.append(f"{req}: {lock} pins {found[name][0]}")
    assert not problems, "run scripts/lock:\n" + "\n".join(problems)


def test_the_venv_holds_exactly_the_lock() -> None:
    """scripts/setup test installed every package test.txt pins for this platform and Python,
    at that version, and nothing else."""
    stamp = Path(sys.prefix, ".hopmeter-lock")
    if not stamp.is_file() or not stamp.read_text().startswith("requirements/test.txt "):
        pytest.skip("this venv was not made by scripts/setup test (a smoke of newer versions)")
    locked = {n: v for n, (v, marker, _) in pins("test.txt").items() if _applies(marker)}
    installed = {
        canonicalize_name(d.metadata["Name"]): Version(d.version)
        for d in importlib.metadata.distributions()
    }
    assert {n: v for n, v in installed.items() if n not in NOT_LOCKED} == locked
