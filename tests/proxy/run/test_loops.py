"""`--loop`: asyncio's loop by default, uvloop's when asked, one clear line when uvloop is asked
for and missing."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest
import uvloop

from hopmeter.cli import build_parser
from hopmeter.core.vocab import EventLoop
from hopmeter.proxy.run.loops import loop_factory, takes_eager_start


def test_asyncio_is_the_default_even_where_uvloop_is_installed() -> None:
    """uvloop is installed here (a dependency on Linux and macOS), and `hopmeter run` still runs
    on the standard library's loop unless asked (its ~2 MiB of idle RSS buys no CPU per event)."""
    assert importlib.util.find_spec("uvloop") is not None
    assert build_parser().parse_args(["run", "http://127.0.0.1:9"]).loop is EventLoop.ASYNCIO
    args = build_parser().parse_args(["run", "http://127.0.0.1:9", "--loop", "uvloop"])
    assert args.loop is EventLoop.UVLOOP


def test_asyncio_is_the_standard_librarys_loop() -> None:
    """--loop asyncio leaves asyncio.run's own loop."""
    assert loop_factory(EventLoop.ASYNCIO) is None


def test_uvloop_makes_a_uvloop_loop() -> None:
    """--loop uvloop gives asyncio.run a uvloop loop, on which coroutines run."""

    async def which() -> type[asyncio.AbstractEventLoop]:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop())

    assert issubclass(
        asyncio.run(which(), loop_factory=loop_factory(EventLoop.UVLOOP)), uvloop.Loop
    )


@pytest.mark.smoke
@pytest.mark.parametrize("loop", list(EventLoop))
def test_mitmproxys_eager_task_factory_runs_on_every_loop(loop: EventLoop) -> None:
    """With asyncio's eager task factory set, as mitmproxy's master sets it, a task starts at
    once on either loop (uvloop 0.22+ passes `eager_start`, which Python 3.13.0's factory lacks)."""
    started: list[str] = []

    async def step() -> None:
        started.append("task")

    async def main() -> list[str]:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
        task = asyncio.create_task(step())
        started.append("after create_task")
        await task
        return started

    assert asyncio.run(main(), loop_factory=loop_factory(loop)) == ["task", "after create_task"]


def test_a_factory_without_eager_start_is_called_as_written() -> None:
    """A task factory that takes no `eager_start` is called without it when it is left at None,
    and given it when a caller asks for it; factories that take it are not wrapped."""
    calls: list[dict[str, object]] = []

    def old_style(loop: object, coro: object, *, name: object = None, context: object = None):
        calls.append({"name": name, "context": context})
        return asyncio.Task(coro, loop=loop, name=name, context=context)  # type: ignore[arg-type]

    assert not takes_eager_start(old_style)
    assert takes_eager_start(asyncio.Task) and takes_eager_start(lambda loop, coro, **kw: None)

    async def main() -> None:
        running = asyncio.get_running_loop()
        running.set_task_factory(old_style)
        assert running.get_task_factory() is not old_style  # adapted
        await running.create_task(asyncio.sleep(0))
        running.set_task_factory(None)

    asyncio.run(main(), loop_factory=loop_factory(EventLoop.UVLOOP))
    assert calls == [{"name": None, "context": None}]


@pytest.mark.integration
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_missing_uvloop_is_one_line_naming_the_fix(workers: str) -> None:
    """Without the uvloop package, `hopmeter run --loop uvloop` exits 2 with one line that says
    how to install it or run on asyncio, before anything listens."""
    hide = (
        "import sys; sys.modules['uvloop'] = None; from hopmeter.cli import main; sys.exit(main())"
    )
    argv = ["run", "http://127.0.0.1:9", "--loop", "uvloop", "--metrics", "off"]
    done = subprocess.run(
        [sys.executable, "-c", hide, *argv, "--workers", workers, "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "uvloop is not installed" in line and "--loop asyncio" in line
