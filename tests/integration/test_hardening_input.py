"""Bad input through a running `hopmeter run`: every byte forwarded unchanged, measured as far as
it can be, flagged, and the proxy's memory bounded by the documented limits."""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopmeter.core.decoding import MAX_DECODED_BYTES
from hopmeter.core.sse import MAX_LINE_BYTES
from tests.harness.procs import Proc, measuring, rss_kib, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}
DONE = b"data: [DONE]\n\n"


def event(text: str) -> bytes:
    """An OpenAI chat chunk carrying `text`."""
    return b"data: " + orjson.dumps({"choices": [{"delta": {"content": text}}]}) + b"\n\n"


class Upstream:
    """Serves each registered path as: response headers, then the body in the given pieces."""

    def __init__(self) -> None:
        self.bodies: dict[str, tuple[dict[str, str], list[bytes]]] = {}

    async def __call__(self, ex: Exchange) -> None:
        headers, pieces = self.bodies[ex.path]
        await ex.head(headers)
        for piece in pieces:
            await ex.chunk(piece)
        await ex.end()


class Proxy:
    """The shared proxy and what a test needs of it."""

    def __init__(self, proc: Proc, records: Path, port: int, upstream: Upstream) -> None:
        self.proc = proc
        self.records = records
        self.url = f"http://127.0.0.1:{port}"
        self.upstream = upstream

    def through(
        self, path: str, headers: dict[str, str], pieces: list[bytes]
    ) -> tuple[bytes, dict[str, Any], int]:
        """Send `pieces` through the proxy: (bytes the client got, the record, peak RSS growth)."""
        self.upstream.bodies[path] = (headers, pieces)
        pid = self.proc.popen.pid
        before = rss_kib(pid)
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts afresh from here
        with httpx.stream("POST", self.url + path, json={"stream": True}, timeout=60) as r:
            got = b"".join(r.iter_raw())  # raw: a gzip body stays as it was sent
        rec = self.record(path)
        return got, rec, rss_kib(pid, "VmHWM") - before

    def record(self, path: str) -> dict[str, Any]:
        """The record of the one request to `path`."""

        def found() -> dict[str, Any] | None:
            lines = self.records.read_bytes().split(b"\n")[:-1] if self.records.exists() else []
            recs = [orjson.loads(ln) for ln in lines if ln.strip()]
            return next((r for r in recs if r["request"]["path"] == path), None)

        return wait_for(found, 15, f"the record of {path}")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """One `hopmeter run` in front of a scripted upstream, warmed up (tokenizer loaded)."""
    tmp = tmp_path_factory.mktemp("input")
    upstream = Upstream()
    with (
        ScriptedUpstream(upstream) as up,
        measuring(tmp, f"http://127.0.0.1:{up.port}") as running,
    ):
        p = Proxy(running.proc, running.records, running.port, upstream)
        p.through("/v1/chat/completions/warm", SSE, [event("warm up"), DONE])
        yield p
        assert "Traceback" not in running.proc.output()


def kinds(rec: dict[str, Any]) -> list[str]:
    """The kinds of a record's findings."""
    return [f["kind"] for f in rec["findings"]]


def test_garbage_bytes(proxy: Proxy) -> None:
    """256 KiB of random bytes declared as an event stream: forwarded whole, U+FFFD flagged."""
    garbage = os.urandom(256 * 1024)
    pieces = [garbage[i : i + 4096] for i in range(0, len(garbage), 4096)]
    got, rec, growth_kb = proxy.through("/v1/chat/completions/garbage", SSE, pieces)
    assert got == garbage
    assert rec["response"]["bytes_wire"] == len(garbage)
    assert rec["stream"]["replacement_chars"] > 0
    assert "replacement_char" in kinds(rec) and "truncated" in kinds(rec)
    assert "measuring_error" not in rec
    assert growth_kb < 8 * 1024, growth_kb


def test_nul_bytes(proxy: Proxy) -> None:
    """NUL bytes in data lines, in an id and JSON-escaped in text are forwarded and measured."""
    body = [
        b"id: a\x00b\ndata: \x00\x00\x00\n\n",  # the spec ignores an id with NUL
        event("nul\u0000inside"),
        b"data: {\x00}\n\n",
        event("after"),
        DONE,
    ]
    got, rec, _ = proxy.through("/v1/chat/completions/nul", SSE, body)
    assert got == b"".join(body)
    assert rec["figures"]["events"] == 5
    assert rec["stream"]["terminal_seen"] is True
    assert "truncated" not in kinds(rec) and "measuring_error" not in rec


def test_invalid_utf8_in_an_event_stream(proxy: Proxy) -> None:
    """Invalid UTF-8 inside event payloads: bytes unchanged, replacement_char with its count."""
    bad = b'data: {"choices":[{"delta":{"content":"caf\xc3 \xff\xfe ok"}}]}\n\n'
    body = [event("fine"), bad, event("also fine"), DONE]
    got, rec, _ = proxy.through("/v1/chat/completions/badutf8", SSE, body)
    assert got == b"".join(body)
    found = next(f for f in rec["findings"] if f["kind"] == "replacement_char")
    assert found["evidence"]["from_invalid_bytes"] == 3
    assert rec["figures"]["events"] == 4


LONG_LINE_BYTES = 10 * 1024 * 1024


def test_ten_megabyte_line(proxy: Proxy) -> None:
    """A 10 MiB line without a newline is skipped (1 MiB bound), flagged; memory stays flat."""
    line = b"data: " + b"a" * LONG_LINE_BYTES
    pieces = [line[i : i + 65536] for i in range(0, len(line), 65536)]
    after = [b"\n\n", event("after the long line"), DONE]
    got, rec, growth_kb = proxy.through("/v1/chat/completions/longline", SSE, pieces + after)
    assert hashlib.sha256(got).digest() == hashlib.sha256(b"".join(pieces + after)).digest()
    assert rec["stream"]["overflows"] == 1
    assert rec["figures"]["events"] == 2  # the events after the long line are still measured
    assert rec["stream"]["terminal_seen"] is True
    print(f"\n10 MiB line: peak RSS growth {growth_kb} KiB (line bound {MAX_LINE_BYTES} B)")
    # the line buffer is bounded by MAX_LINE_BYTES; a few copies of it at most, never 10 MiB
    assert growth_kb * 1024 < 4 * MAX_LINE_BYTES, growth_kb


BOMB_MEMBER_BYTES = 64 * 1024 * 1024
BOMB_MEMBERS = 16  # 16 gzip members of 64 MiB of zeros: 1 GiB declared, ~1 MiB on the wire


def _gzip_bomb() -> bytes:
    """1 GiB of zeros as gzip (RFC 1952 allows several members; clients decode them all)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1024 * 1024)
    member = b"".join(c.compress(zeros) for _ in range(BOMB_MEMBER_BYTES // len(zeros)))
    member += c.flush()
    return member * BOMB_MEMBERS


def test_gzip_bomb(proxy: Proxy) -> None:
    """1 GiB of zeros as gzip on an event stream: passed on compressed, decoding stops, RSS flat."""
    bomb = _gzip_bomb()
    pieces = [bomb[i : i + 65536] for i in range(0, len(bomb), 65536)]
    headers = {**SSE, "content-encoding": "gzip"}
    got, rec, growth_kb = proxy.through("/v1/chat/completions/bomb", headers, pieces)
    assert hashlib.sha256(got).digest() == hashlib.sha256(bomb).digest()
    assert rec["response"]["bytes_wire"] == len(bomb)
    assert rec["stream"]["decode_error"].startswith("gzip body decodes to more than")
    assert rec["response"]["bytes_decoded"] <= MAX_DECODED_BYTES
    assert "compression_on_stream" in kinds(rec)
    print(f"\ngzip bomb ({len(bomb)} B -> 1 GiB): peak RSS growth {growth_kb} KiB")
    assert growth_kb < 16 * 1024, growth_kb


def test_event_stream_that_is_one_json_document(proxy: Proxy) -> None:
    """A whole chat.completion sent as text/event-stream: read as the document it is."""
    words = " ".join(f"word{i}" for i in range(60))
    document = orjson.dumps(
        {
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": words}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 61, "total_tokens": 66},
        }
    )
    got, rec, _ = proxy.through("/v1/chat/completions/doc", SSE, [document])
    assert got == document
    assert rec["model"] == "gpt-4o-mini"
    assert rec["figures"]["tokens"] == 61 and rec["figures"]["tokens_source"] == "usage"
    found = next(f for f in rec["findings"] if f["kind"] == "not_streamed")
    assert found["severity"] == "error"  # the client asked for a stream
    assert "truncated" not in kinds(rec)
