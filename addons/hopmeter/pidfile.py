"""A pid file, so that a rotation can signal the process that writes the file it rotated.

logrotate's `postrotate` runs `kill -HUP "$(cat PATH)"` (deploy/logrotate/hopmeter), as nginx's
snippet reads nginx's pid file. The file is written whole (a temporary file renamed over it) once
the command's flags are checked, and removed at exit if it still names this process.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from hopmeter.errors import UsageError


@contextlib.contextmanager
def pid_file(path: str, flag: str = "--pid-file") -> Iterator[None]:
    """Write this process's id to `path` ("" for none) for as long as the block runs."""
    if not path:
        yield
        return
    target = Path(path).expanduser()
    mine = f"{os.getpid()}\n"
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        partial.write_text(mine, encoding="ascii")
        partial.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise UsageError(
            f"{flag} {path}: cannot write it ({exc.strerror}); pick a writable path"
        ) from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if target.read_text(encoding="ascii") == mine:
                target.unlink()


# The signals that reopen a long-running command's files at their paths after a rotation:
# SIGHUP, and SIGUSR1 as for nginx's logs (a `postrotate` written for nginx must not stop it:
# USR1's default action ends a process). Neither ever stops one.
REOPEN_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGHUP", "SIGUSR1") if hasattr(signal, name)
)


def ignore_hangup() -> None:
    """Ignore the reopen signals until the command's event loop handles them (reopening its
    files): a rotation that signals a process still starting must not stop it. Children inherit
    the ignore."""
    for sig in REOPEN_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
