"""A small strict HTTP/1.1 client that stamps every body read as it arrives (probe and demo).

It reads exactly what the server sent: the status line and headers, then a chunked, sized or
close-delimited body, each read kept with the time it arrived, still content-encoded (the probe
decodes and frames it with the core's decoders, as the proxy does). Every buffer is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import orjson

from hopmeter.errors import HopmeterError

# A probe or demo reply is tens of KB; anything past this is not what was asked for.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024  # status line and headers
CLOSE_TIMEOUT_S = 2.0  # a peer that never answers our TLS close_notify is not waited for longer


@dataclass(slots=True)
class Received:
    """What a client saw: status, headers, and each body read with its arrival time."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased; first value wins
    t_start: float = 0.0  # monotonic, when the connection was opened
    wall_start: float = 0.0  # the same moment on the wall clock (epoch seconds)
    t_headers_s: float | None = None  # seconds after t_start
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (seconds since start, data)
    complete: bool = False

    @property
    def body(self) -> bytes:
        """All body bytes, joined."""
        return b"".join(c for _, c in self.chunks)


def ssl_context(insecure: bool) -> ssl.SSLContext:
    """HTTP/1.1 over TLS, verifying the certificate unless told not to."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def request(
    url: str,
    method: str = "GET",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    insecure: bool = False,
) -> Received:
    """One request on its own connection; the response with every body read stamped."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # the Host header names the host alone: a user and password in the URL are credentials,
    # sent as Basic auth (unless an Authorization header is given), never in the clear as a name
    head = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc.rpartition('@')[2]}"]
    head.append("connection: close")
    given = {k.lower(): v for k, v in (headers or {}).items()}
    if parts.username is not None and "authorization" not in given:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        given["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    head += [f"{k}: {v}" for k, v in given.items()]
    if body:
        head += ["content-type: application/json", f"content-length: {len(body)}"]
    out = Received(t_start=time.monotonic(), wall_start=time.time())
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ssl_context(insecure) if tls else None, limit=MAX_HEAD_BYTES
    )
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        await _head(reader, out)
        await _body(reader, out)
    finally:
        writer.close()
        # a TLS close is a handshake too: wait for it, so the socket is closed before the loop
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
    return out


async def post_stream(
    url: str, doc: dict[str, object], headers: dict[str, str] | None = None, timeout_s: float = 30.0
) -> Received:
    """POST a JSON body and read the streamed response, stamping each read."""
    return await asyncio.wait_for(request(url, "POST", orjson.dumps(doc), headers), timeout_s)


async def _head(reader: asyncio.StreamReader, out: Received) -> None:
    status_line = (await reader.readuntil(b"\r\n")).decode("latin-1").split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise HopmeterError(f"not an HTTP/1.1 response: {' '.join(status_line)[:80]!r}")
    out.status = int(status_line[1])
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        out.headers.setdefault(name.strip().lower(), value.strip())
    out.t_headers_s = time.monotonic() - out.t_start


async def _body(reader: asyncio.StreamReader, out: Received) -> None:
    """A chunked, sized or close-delimited body, each read stamped as it arrives."""
    total = 0

    def take(data: bytes) -> None:
        nonlocal total
        total += len(data)
        if total > MAX_BODY_BYTES:
            raise HopmeterError(f"the reply is over {MAX_BODY_BYTES} bytes: not what was asked")
        out.chunks.append((time.monotonic() - out.t_start, data))

    if out.headers.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16):
            take((await reader.readexactly(size + 2))[:-2])
        out.complete = True
        return
    # sized: read up to the length; close-delimited: read to the end, within the bound
    length = int(out.headers.get("content-length", str(MAX_BODY_BYTES + 1)))
    while total < length and (data := await reader.read(min(65536, length - total))):
        take(data)
    out.complete = total >= length or "content-length" not in out.headers
