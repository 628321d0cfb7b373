"""tune_listeners on real asyncio servers: a deep accept queue, SO_REUSEPORT only for workers."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from hopmeter.proxy.run.listen import LISTEN_BACKLOG, tune_listeners

pytestmark = pytest.mark.loopback  # every test serves or connects on 127.0.0.1, in this process

needs_ss = pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")


@pytest.fixture(autouse=True)
def _restore_start_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_listeners replaces asyncio.start_server for the process: put it back afterwards."""
    monkeypatch.setattr(asyncio, "start_server", asyncio.start_server)


def _backlog(port: int) -> int:
    """The accept-queue size the kernel gave the socket listening on `port` (ss: Send-Q)."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    (line,) = out.splitlines()
    return int(line.split()[2])


async def _noop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _listen(port: int = 0, **kwargs: object) -> asyncio.Server:
    return await asyncio.start_server(_noop, "127.0.0.1", port, **kwargs)  # type: ignore[arg-type]


def _reuse_port(server: asyncio.Server) -> bool:
    return bool(server.sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT))


@pytest.mark.integration  # runs ss to read the backlog the kernel keeps
@needs_ss
def test_servers_listen_with_the_deep_backlog() -> None:
    """After tuning, a server started the usual way gets hopmeter's backlog (capped by the
    kernel's somaxconn), not asyncio's 100; a backlog the caller gives still wins."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())

    async def main() -> tuple[int, int]:
        tune_listeners(reuse_port=False)
        deep, asked = await _listen(), await _listen(backlog=7)
        async with deep, asked:
            return (
                _backlog(deep.sockets[0].getsockname()[1]),
                _backlog(asked.sockets[0].getsockname()[1]),
            )

    assert asyncio.run(main()) == (min(LISTEN_BACKLOG, somaxconn), 7)


def test_a_single_process_does_not_share_its_ports() -> None:
    """Without reuse_port, a listener has no SO_REUSEPORT: a second one on its port fails."""

    async def main() -> None:
        tune_listeners(reuse_port=False)
        async with await _listen() as first:
            assert not _reuse_port(first)
            with pytest.raises(OSError, match="address already in use"):
                await _listen(first.sockets[0].getsockname()[1])

    asyncio.run(main())


def test_workers_share_a_port() -> None:
    """With reuse_port, two servers bind the same port (the kernel spreads connections)."""

    async def main() -> None:
        tune_listeners(reuse_port=True)
        async with await _listen() as first:
            port = first.sockets[0].getsockname()[1]
            async with await _listen(port) as second:
                assert _reuse_port(first) and _reuse_port(second)
                assert second.sockets[0].getsockname()[1] == port

    asyncio.run(main())
