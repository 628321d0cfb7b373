"""`hopmeter probe URL`: the canary, a streaming request through the real path judged at the client.

URL is the front of the path (nginx, a CDN, a gateway) with a `hopmeter upstream` at its origin.
The probe asks the upstream, per request, for emoji and CJK tokens with LF, CRLF or CR line endings,
each event written in pieces cut at random byte offsets; it checks that the bytes and events arrive
intact, times the first visible word at the client, and judges holds: from the upstream's own send
log when `--upstream-admin` reaches it, else from the arrival pattern against the known token clock
(hopmeter.probe.judge). Exit status 0 when every stream passed, 1 with the reason on one line
when one did not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import ssl
import sys
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import orjson

from hopmeter.errors import HopmeterError
from hopmeter.probe.judge import DEFAULT_RATE, DEFAULT_TOKENS, RANDOM_CUTS_KEY, Spec, Verdict, judge

# A probe reply is ~10 KB; anything past this is not the upstream's reply and is not read.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024  # status line and headers
CLOSE_TIMEOUT_S = 2.0  # a peer that never answers our TLS close_notify is not waited for longer
# What a browser says it accepts: a path that compresses for browsers compresses for the probe.
ACCEPT_ENCODING = "gzip, deflate, br, zstd"
LINE_ENDINGS = ("lf", "crlf", "cr")


def add_parser(sub: Any) -> None:
    """The `probe` subcommand, added to an argparse subparsers object."""
    p = sub.add_parser("probe", help="canary: a streaming request through the real path")
    p.add_argument("url", metavar="URL", help="the front of the path, e.g. https://chat.example")
    p.add_argument("--api", choices=("openai", "anthropic"), default="openai")
    p.add_argument(
        "--path", default="", help="request path (default: the API's own, when URL has none)"
    )
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, metavar="N")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, metavar="TOKENS_PER_S")
    p.add_argument(
        "--line-endings",
        default=",".join(LINE_ENDINGS),
        metavar="LIST",
        help="one stream per line ending, comma-separated (default lf,crlf,cr)",
    )
    p.add_argument("--seed", type=int, default=None, help="the cut offsets' seed (default random)")
    p.add_argument(
        "--upstream-admin",
        default="",
        metavar="URL",
        help="the upstream's own address, for its send log (/_hopmeter/sends/ID)",
    )
    p.add_argument("--max-first-word", type=float, default=None, metavar="SECONDS")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
    p.add_argument(
        "--header", action="append", default=[], metavar="NAME:VALUE", help="extra header"
    )
    p.add_argument("--insecure", action="store_true", help="do not verify the TLS certificate")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=run)


def _ssl_context(insecure: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def _request(
    url: str, method: str, body: bytes, headers: dict[str, str], insecure: bool
) -> tuple[int, dict[str, str], list[tuple[float, bytes]], float]:
    """(status, headers, body reads stamped in seconds since the request, wall-clock start)."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if tls else 80)
    ctx = _ssl_context(insecure) if tls else None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc}", "connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    if body:
        head += ["content-type: application/json", f"content-length: {len(body)}"]
    wall, start = time.time(), time.monotonic()
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx, limit=MAX_HEAD_BYTES)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status, resp = await _head(reader)
        reads: list[tuple[float, bytes]] = []
        await _body(reader, resp, lambda data: reads.append((time.monotonic() - start, data)))
    finally:
        writer.close()
        # a TLS close is a handshake too: wait for it, so the socket is closed before the loop
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
    return status, resp, reads, wall


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = (await reader.readuntil(b"\r\n")).decode("latin-1").split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise HopmeterError(f"not an HTTP/1.1 response: {' '.join(status_line)[:80]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(status_line[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str], take: Any) -> None:
    """Read a chunked, sized or close-delimited body, handing each piece to `take` on arrival."""
    total = 0
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16):
            total += size
            if total > MAX_BODY_BYTES:
                raise HopmeterError(f"the reply is over {MAX_BODY_BYTES} bytes: not a probe reply")
            take((await reader.readexactly(size + 2))[:-2])
        return
    # sized: read up to the length; close-delimited: read to the end, within the bound
    length = int(headers.get("content-length", str(MAX_BODY_BYTES + 1)))
    while total < length and (data := await reader.read(min(65536, length - total))):
        total += len(data)
        if total > MAX_BODY_BYTES:
            raise HopmeterError(f"the reply is over {MAX_BODY_BYTES} bytes: not a probe reply")
        take(data)


async def _sends(admin: str, request_id: str, insecure: bool) -> list[float] | None:
    """The upstream's send time of each token-carrying event, or None when it cannot tell."""
    url = admin.rstrip("/") + f"/_hopmeter/sends/{request_id}"
    status, _, reads, _ = await _request(url, "GET", b"", {}, insecure)
    if status != 200:
        return None
    doc = orjson.loads(b"".join(d for _, d in reads))
    return [float(t) for t, tokens, *_ in doc.get("events", []) if tokens > 0]


async def probe_one(
    spec: Spec, url: str, extra: dict[str, str], args: argparse.Namespace
) -> Verdict:
    """One stream through the path, judged."""
    headers = {
        "accept": "text/event-stream",
        "accept-encoding": ACCEPT_ENCODING,
        "x-hopmeter-scenario": spec.header(),
        **extra,
    }
    body = orjson.dumps(spec.request())
    status, resp, reads, wall = await _request(url, "POST", body, headers, args.insecure)
    note = ""
    text = b"".join(d for _, d in reads)
    if status == 400 and spec.random_cuts and RANDOM_CUTS_KEY.encode() in text:
        # an upstream without random cuts: cut once per event at its fixed place instead
        spec = replace(spec, random_cuts=False)
        headers["x-hopmeter-scenario"] = spec.header()
        status, resp, reads, wall = await _request(url, "POST", body, headers, args.insecure)
        note = f"the upstream does not know {RANDOM_CUTS_KEY}: each event was cut at a fixed place"
        text = b"".join(d for _, d in reads)
    sends = None
    rid = resp.get("x-hopmeter-request-id")
    if args.upstream_admin and rid and status == 200:
        sends = await _sends(args.upstream_admin, rid, args.insecure)
    verdict = judge(spec, status, resp, reads, sends=sends, t_wall_start=wall)
    if status != 200:
        verdict.problems[-1] += f": {text[:160].decode('utf-8', 'replace').strip()}"
    first = verdict.figures.get("first_word_s")
    limit = args.max_first_word
    if limit is not None and first is not None and first > limit:
        verdict.problems.append(f"first word after {first:.3f}s, above --max-first-word {limit}s")
    verdict.figures["random_cuts"] = spec.random_cuts
    if note:
        verdict.figures["note"] = note
    return verdict


def _extra_headers(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or not name.strip():
            raise HopmeterError(f"--header {pair!r}: expected NAME:VALUE")
        out[name.strip().lower()] = value.strip()
    return out


def _specs(args: argparse.Namespace) -> list[Spec]:
    endings = [e.strip().lower() for e in args.line_endings.split(",") if e.strip()]
    bad = [e for e in endings if e not in LINE_ENDINGS]
    if bad or not endings:
        raise HopmeterError(f"--line-endings {args.line_endings!r}: use lf, crlf and/or cr")
    if args.tokens < 2 or args.rate <= 0:
        raise HopmeterError("--tokens must be 2 or more and --rate above 0")
    seed = args.seed if args.seed is not None else secrets.randbelow(1_000_000)
    return [
        Spec(api=args.api, tokens=args.tokens, rate=args.rate, line_ending=e, seed=seed)
        for e in endings
    ]


def _target(url: str, spec: Spec, path: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HopmeterError(f"URL {url!r}: expected http://HOST[:PORT][/PATH] or https://...")
    if path:
        return url.rstrip("/") + "/" + path.lstrip("/")
    return url if parts.path not in ("", "/") else url.rstrip("/") + spec.path


def _ms(x: object) -> str:
    return "-" if not isinstance(x, int | float) else f"{x * 1000:.0f}ms"


def _line(v: Verdict) -> str:
    f = v.figures
    holds = f.get("holds") or {}
    intact = "bytes intact" if f.get("bytes_intact") else "bytes CHANGED"
    return (
        f"  {v.line_ending:<4} {v.status} {f.get('content_encoding') or 'identity'} "
        f"first byte {_ms(f.get('first_byte_s'))}, first word {_ms(f.get('first_word_s'))}, "
        f"{f.get('events', 0)}/{f.get('events_expected', '?')} events in {f.get('reads', 0)} "
        f"reads, tokens in {f.get('bursts', 0)} bursts, last at {_ms(f.get('last_event_s'))}; "
        f"{intact}; hold first word "
        f"{_ms(holds.get('first_word_s'))} p50 {_ms(holds.get('p50_s'))} max "
        f"{_ms(holds.get('max_s'))} ({holds.get('source', 'not judged')})"
        + (f"\n       {f['note']}" if f.get("note") else "")
    )


async def _probe_all(
    specs: list[Spec], url: str, extra: dict[str, str], args: argparse.Namespace
) -> list[Verdict]:
    runs = [asyncio.wait_for(probe_one(s, url, extra, args), args.timeout) for s in specs]
    return list(await asyncio.gather(*runs))


# What can go wrong on the way, as opposed to a flag the user gave wrong (exit status 2).
_PATH_ERRORS = (
    OSError,
    TimeoutError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ValueError,
    HopmeterError,
)


def run(args: argparse.Namespace) -> int:
    """Probe, print, and exit 0 (pass) or 1 (fail, the reason on one line)."""
    specs = _specs(args)  # usage errors first, before any request
    url = _target(args.url, specs[0], args.path)
    extra = _extra_headers(args.header)
    try:
        verdicts = asyncio.run(_probe_all(specs, url, extra, args))
    except _PATH_ERRORS as exc:
        detail = str(exc) or f"no reply within {args.timeout}s"
        _emit(args, url, specs[0].seed, [], f"no stream from {url}: {detail}")
        return 1
    failed = [v for v in verdicts if not v.ok]
    reason = f"{failed[0].line_ending}: {failed[0].problems[0]}" if failed else ""
    _emit(args, url, specs[0].seed, verdicts, reason)
    return 1 if failed else 0


def _emit(
    args: argparse.Namespace, url: str, seed: int, verdicts: list[Verdict], reason: str
) -> None:
    if args.json:
        doc = {
            "schema": "hopmeter.probe/1",
            "url": url,
            "seed": seed,
            "ok": not reason,
            "reason": reason or None,
            "streams": [v.as_json() for v in verdicts],
        }
        sys.stdout.buffer.write(orjson.dumps(doc) + b"\n")
        if reason:
            print(f"hopmeter probe: FAIL {reason}", file=sys.stderr)
        return
    print(f"hopmeter probe {url} (seed {seed})")
    for v in verdicts:
        print(_line(v))
    if reason:
        print(f"FAIL {reason}")
    else:
        words = [v.figures.get("first_word_s") for v in verdicts]
        worst = max((w for w in words if w is not None), default=None)
        n = len(verdicts)
        print(f"PASS {n} stream{'s' * (n != 1)} intact, first word by {_ms(worst)}, no holds")
