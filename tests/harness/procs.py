"""Real processes for integration tests: the shipped `hopmeter` command, on loopback, polled;
and how every test waits: polling a condition with a timeout (`wait_for`, `until` on a loop)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson

T = TypeVar("T")
HOPMETER = [sys.executable, "-m", "hopmeter.cli"]


_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, and never handed out before in this
    test run: the kernel may pick a port it just released again, and two servers started
    together (nginx and hopmeter of two scenario configs) must not both be told the same one."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def wait_for[T](condition: Callable[[], T | None], timeout_s: float = 15.0, what: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}")
        time.sleep(0.02)


async def until[T](condition: Callable[[], T | None], timeout_s: float = 15.0, what: str = "") -> T:
    """wait_for on a running event loop: poll `condition` between the loop's turns (the code
    under test runs on them); fail with `what` after the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}")
        await asyncio.sleep(0.005)


def port_open(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    """A child process with its output in a file, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def output(self) -> str:
        """Everything the process printed so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_port(self, port: int, timeout_s: float = 20.0) -> None:
        """Wait until the process listens on `port`, failing early if it exits."""

        def ready() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.args} exited {self.popen.returncode}:\n{self.output()}"
                )
            return port_open(port)

        wait_for(ready, timeout_s, f"port {port} of {self.args[3:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Signal the process and wait for it to exit; its exit status."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (or its peak, VmHWM) in KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def rss_mib(pid: int) -> float:
    """A process's resident memory, MiB."""
    return rss_kib(pid) / 1024


@contextlib.contextmanager
def hopmeter(
    tmp: Path,
    *args: str,
    name: str = "hopmeter",
    ports: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Proc]:
    """Run `hopmeter ARGS...` and wait until each of `ports` accepts connections."""
    proc = Proc([*HOPMETER, *args], tmp / f"{name}.log", env)
    try:
        for port in ports:
            proc.wait_port(port)
        yield proc
    finally:
        proc.stop()


def read_records(path: Path, count: int, timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """Wait until `path` holds at least `count` flow records, and return them."""

    def enough() -> list[dict[str, Any]] | None:
        if not path.exists():
            return None
        lines = [ln for ln in path.read_bytes().splitlines() if ln.strip()]
        return [orjson.loads(ln) for ln in lines] if len(lines) >= count else None

    return wait_for(enough, timeout_s, f"{count} records in {path}")


class DemoPath:
    """The demo upstream and a `hopmeter run` in front of it, as two real processes."""

    def __init__(self, tmp: Path, upstream_port: int, port: int, proxy: Proc) -> None:
        self.tmp = tmp
        self.upstream_port = upstream_port
        self.port = port
        self.proxy = proxy
        self.records = tmp / "records.jsonl"
        self.url = f"http://127.0.0.1:{port}"
        self.upstream_url = f"http://127.0.0.1:{upstream_port}"


class Measuring:
    """A running `hopmeter run`: its process, port, base URL and records file."""

    def __init__(self, proc: Proc, port: int, records: Path) -> None:
        self.proc = proc
        self.port = port
        self.records = records
        self.url = f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def measuring(
    tmp: Path, upstream: str, *run_args: str, ports: tuple[int, ...] = ()
) -> Iterator[Measuring]:
    """`hopmeter run UPSTREAM` on a free loopback port, records to tmp/records.jsonl.

    `run_args` are added to the command line (metrics are off unless they say otherwise);
    `ports` are further ports to wait for (e.g. a metrics endpoint).
    """
    port = free_port()
    records = tmp / "records.jsonl"
    metrics = () if "--metrics" in run_args else ("--metrics", "off")
    with hopmeter(
        tmp,
        "run",
        upstream,
        *("--listen", f"127.0.0.1:{port}", "--records", str(records)),
        *metrics,
        *run_args,
        ports=(port, *ports),
    ) as proc:
        yield Measuring(proc, port, records)


@contextlib.contextmanager
def demo_path(
    tmp: Path, *run_args: str, upstream_args: tuple[str, ...] = (), ports: tuple[int, ...] = ()
) -> Iterator[DemoPath]:
    """`hopmeter upstream` and `hopmeter run` in front of it (`measuring`)."""
    up = free_port()
    with (
        hopmeter(
            tmp,
            "upstream",
            "--listen",
            f"127.0.0.1:{up}",
            *upstream_args,
            name="upstream",
            ports=(up,),
        ),
        measuring(tmp, f"http://127.0.0.1:{up}", *run_args, ports=ports) as proxy,
    ):
        yield DemoPath(tmp, up, proxy.port, proxy.proc)
