"""A tiny streaming HTTP/1.1 client that stamps every chunk as it arrives (demo and probe)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson


@dataclass(slots=True)
class Received:
    """What a client saw: status, headers, and each body chunk with its arrival time."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    t_start: float = 0.0  # monotonic
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (seconds since start, data)
    complete: bool = False

    @property
    def body(self) -> bytes:
        """All body bytes, joined."""
        return b"".join(c for _, c in self.chunks)


async def post_stream(
    url: str, doc: dict[str, object], headers: dict[str, str] | None = None, timeout_s: float = 30.0
) -> Received:
    """POST a JSON body and read the (chunked or sized) response, stamping each chunk."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    body = orjson.dumps(doc)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    head = [
        f"POST {target} HTTP/1.1",
        f"host: {parts.netloc}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    out = Received(t_start=time.monotonic())
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        await asyncio.wait_for(_read(reader, out), timeout_s)
    finally:
        writer.close()
    return out


async def _read(reader: asyncio.StreamReader, out: Received) -> None:
    status_line = await reader.readuntil(b"\r\n")
    out.status = int(status_line.split()[1])
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        k, _, v = line.decode("latin-1").partition(":")
        out.headers[k.strip().lower()] = v.strip()
    if out.headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                out.complete = True
                return
            data = await reader.readexactly(size + 2)
            out.chunks.append((time.monotonic() - out.t_start, data[:-2]))
    elif "content-length" in out.headers:
        data = await reader.readexactly(int(out.headers["content-length"]))
        out.chunks.append((time.monotonic() - out.t_start, data))
        out.complete = True
    else:
        while data := await reader.read(65536):
            out.chunks.append((time.monotonic() - out.t_start, data))
        out.complete = True
