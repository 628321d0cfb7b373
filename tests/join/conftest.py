"""A join service and its receivers on a private event loop, for the join package's tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hopmeter.join.service import JoinService, ServeConfig


def config(tmp: Path, **over: object) -> ServeConfig:
    """A ServeConfig with loopback ports picked by the OS and records in `tmp`."""
    fields: dict[str, object] = {
        "http": ("127.0.0.1", 0),
        "grpc": None,
        "metrics": None,
        "records": str(tmp / "joined.jsonl"),
        "window_s": 30.0,
        "max_traces": 1000,
        "max_events": 100_000,
    }
    fields.update(over)
    return ServeConfig(**fields)  # type: ignore[arg-type]


class Served:
    """A receiver's handler served on 127.0.0.1 from a loop in a thread."""

    def __init__(self, handler: Callable[..., object]) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.port = 0

        async def start() -> asyncio.Server:
            server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            return server

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the loop's thread (the service is not thread-safe) and return its result."""

        async def run() -> object:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        """Stop serving, cancel what is still running and close the loop."""

        async def shut() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[JoinService]:
    svc = JoinService(config(tmp_path))
    yield svc
    svc.stop()
