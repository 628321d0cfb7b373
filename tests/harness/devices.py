"""Devices that run out of room, for tests of what hopmeter does when a write fails.

`/dev/full` fails every write with ENOSPC and never recovers; a small tmpfs, mounted for the test
(root only: skipped with the reason otherwise), fills up and frees up as the test says.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size_kib: int = 64) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted at `where` for the block; skips the test if this
    process may not mount one (not root, or a container without the capability)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill up needs root")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(path: Path) -> int:
    """Write `path` until its device has no room left; the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    written = 0
    try:
        while True:
            written += os.write(fd, b"\0" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return written
