"""The fast tier (`scripts/test --fast`, pytest's `--fast`): the tests that start no process and
open no socket, and a guard that keeps the tier honest.

Two markers say what a test needs beyond its own process (registered in pyproject.toml):
`integration`, it starts a process (hopmeter, nginx, Prometheus, Chromium, ruff, a Python
child); `loopback`, it binds or connects a socket in this process (a server on 127.0.0.1:0, a
client to it, `free_port()`). The fast tier deselects both (tests/integration/ it does not even
collect) and runs the rest with the guard on:
while a test runs (its fixtures included), starting a process or binding or connecting a socket
raises `TierViolation` there and then, and the test fails naming the marker to give it, even if
the code under test caught the exception. Without `--fast` nothing here is installed.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

# What the fast tier leaves out, and why a test would carry each.
MARKERS = {
    "integration": "starts a process or a browser",
    "loopback": "binds or connects a socket in this process",
}

# Every file here is marked integration (tests/harness/test_tier.py checks): the tier does not
# even collect it, which saves importing ~35 modules and starting nginx -v and chromium --version
# to decide their skips.
INTEGRATION = Path(__file__).resolve().parents[1] / "integration"

# uvloop (the default loop of `hopmeter run`) opens sockets and starts processes in libuv, past
# the socket and subprocess modules: its loop's own methods are guarded too.
UVLOOP_SOCKETS = (
    "create_server",
    "create_connection",
    "create_unix_server",
    "create_unix_connection",
    "create_datagram_endpoint",
    "sock_connect",
)
UVLOOP_PROCESSES = ("subprocess_exec", "subprocess_shell")
SOCKET_METHODS = ("bind", "connect", "connect_ex", "sendto")  # sendto binds an unbound socket
OS_PROCESSES = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")


class TierViolation(Exception):
    """A test of the fast tier started a process or opened a socket."""


class FastTier:
    """The pytest plugin of the fast tier: deselects the marked tests, guards the others."""

    def __init__(self) -> None:
        self._item: pytest.Item | None = None
        self._seen: dict[str, str] = {}  # test id -> the first thing it did that the tier bars

    @staticmethod
    def pytest_ignore_collect(collection_path: Path) -> bool | None:
        """Leave tests/integration/ out without collecting it."""
        if collection_path == INTEGRATION or INTEGRATION in collection_path.parents:
            return True
        return None

    @staticmethod
    def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        """Leave out the tests that carry a marker of MARKERS."""
        kept, left = [], []
        for item in items:
            (left if any(item.get_closest_marker(m) for m in MARKERS) else kept).append(item)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        """Guard the test's setup, call and teardown (session fixtures start in some test's)."""
        self._item = item
        with pytest.MonkeyPatch.context() as patch:
            for owner, name, replacement in _guards(self._bar):
                patch.setattr(owner, name, replacement)
            try:
                return (yield)
            finally:
                self._item = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Iterator[pytest.TestReport]:
        """Fail a test that did what the tier bars, with the message, whatever else happened
        (a test that skips when a process or port is missing is failed too: it needs a marker)."""
        report: pytest.TestReport = yield
        what = self._seen.pop(item.nodeid, None)
        if what is not None:
            report.outcome = "failed"
            report.longrepr = what
        return report

    def _bar(self, marker: str, what: str) -> TierViolation:
        """Note what the current test did and make the exception that stops it."""
        test = self._item.nodeid if self._item else "(between tests)"
        message = (
            f"{test} {what}, which the fast tier bars: "
            f"mark it @pytest.mark.{marker} ({MARKERS[marker]})"
        )
        if self._item:
            self._seen.setdefault(self._item.nodeid, message)
        return TierViolation(message)


def _guards(bar: Callable[[str, str], TierViolation]) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each way to start a process or open a socket."""

    def popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise bar("integration", f"started a process ({_argv(args)})")

    def spawn(name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise bar("integration", f"started a process ({name})")

        return refuse

    def sock(name: str) -> Callable[..., Any]:
        def refuse(self: socket.socket, *args: Any) -> Any:
            self.close()  # closed here, so that no ResourceWarning lands on a later test
            raise bar("loopback", f"opened a socket ({name} {args[-1]!r})")  # the address

        return refuse

    def loop_socket(name: str) -> Callable[..., Any]:
        def refuse(self: object, *args: Any, **kwargs: Any) -> Any:
            raise bar("loopback", f"opened a socket (uvloop {name})")

        return refuse

    return [
        (subprocess.Popen, "__init__", popen_init),
        *((os, name, spawn(f"os.{name}")) for name in OS_PROCESSES if hasattr(os, name)),
        *((socket.socket, name, sock(name)) for name in SOCKET_METHODS),
        *((uvloop.Loop, name, loop_socket(name)) for name in UVLOOP_SOCKETS),
        *((uvloop.Loop, name, spawn(f"uvloop {name}")) for name in UVLOOP_PROCESSES),
    ]


def _argv(args: Any) -> str:
    """The start of a command line, short enough for one line of a message."""
    words = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    text = " ".join(" ".join(str(w).split()) for w in words[:4])
    return text if len(text) < 120 else text[:117] + "..."
