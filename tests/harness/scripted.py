"""An in-test HTTP/1.1 upstream whose replies are scripted per test, run on its own thread.

Real sockets on loopback; the test decides chunk by chunk what goes on the wire and when, which
the demo upstream cannot (e.g. waiting for the client to acknowledge each event).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Handler = Callable[["Exchange"], Awaitable[None]]


@dataclass
class Exchange:
    """One request and the means to answer it in chunks."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    writer: asyncio.StreamWriter

    async def head(self, headers: dict[str, str], status: int = 200) -> None:
        """Send a chunked response head."""
        lines = [f"HTTP/1.1 {status} OK", "transfer-encoding: chunked"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await self.writer.drain()

    async def chunk(self, data: bytes) -> None:
        """Send one HTTP/1.1 chunk and flush it."""
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def end(self) -> None:
        """Send the last chunk."""
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()


class ScriptedUpstream:
    """Serve `handler` on 127.0.0.1 from a background thread (in TLS with `tls`, a server
    context); use as a context manager."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.requests: list[Exchange] = []
        self.open_connections = 0  # accepted and not yet closed, by either side
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("scripted upstream did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=self.tls)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._close(self._server))
        self.loop.close()

    @staticmethod
    async def _close(server: asyncio.Server) -> None:
        """Stop listening and close every connection, so that no socket is left to the collector
        (it would warn in whichever test runs then)."""
        server.close()
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        # a connection accepted just before the stop is still a task that has not begun: cancelled
        # then, it would never own (and close) its socket
        while any(inspect.getcoroutinestate(t.get_coro()) == inspect.CORO_CREATED for t in tasks):  # type: ignore[arg-type]
            await asyncio.sleep(0)
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the transports' closes run

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: `_serve`, then its socket closed however that ended (the stop too)."""
        self.open_connections += 1
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # the upstream is stopping; its loop waits for this task
        finally:
            self.open_connections -= 1
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding") == "chunked":
                    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                        body += await reader.readexactly(size)
                        await reader.readexactly(2)
                    await reader.readuntil(b"\r\n")
                ex = Exchange(method, path, headers, body, writer)
                self.requests.append(ex)
                await self.handler(ex)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
