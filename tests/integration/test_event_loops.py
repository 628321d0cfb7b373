"""`hopmeter run --loop asyncio` and `--loop uvloop` pass the same behaviour test on real processes.

The same OpenAI-style stream, over HTTP/1.1 and over HTTP/2 with TLS from the client, through
each loop: the client gets the upstream's bytes, the records say the same, and both follow every
chunk to the client (the delivery lane: out of the process, sent by the kernel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.h2client import stream_post
from tests.harness.procs import measuring, read_records
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

WORDS = ["Hel", "lo", " wörld", " 🦙", " again"]
EVENTS = [
    b"data: "
    + json.dumps(
        {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [c]}
    ).encode()
    + b"\n\n"
    for c in [{"index": 0, "delta": {"content": w}} for w in WORDS]
] + [b"data: [DONE]\n\n"]
BODY = b'{"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


async def stream(ex: Exchange) -> None:
    """The same events, one HTTP/1.1 chunk each."""
    await ex.head({"content-type": "text/event-stream"})
    for event in EVENTS:
        await ex.chunk(event)
    await ex.end()


def through(tmp: Path, loop: str) -> tuple[list[bytes], list[dict[str, Any]]]:
    """One HTTP/1.1 and one HTTP/2 (TLS) request through `hopmeter run --loop LOOP`."""
    with (
        ScriptedUpstream(stream) as up,
        measuring(
            tmp, f"http://127.0.0.1:{up.port}", "--loop", loop, "--set", f"confdir={tmp / 'm'}"
        ) as proxy,
    ):
        h1 = httpx.post(f"{proxy.url}/v1/chat/completions", content=BODY, timeout=30)
        read_records(proxy.records, 1)
        h2 = b"".join(
            data
            for kind, data in stream_post("127.0.0.1", proxy.port, "/v1/chat/completions", BODY)
            if kind == "data"
        )
        records = read_records(proxy.records, 2)
    return [h1.content, h2], records


def said(record: dict[str, Any]) -> dict[str, Any]:
    """What a record says about the stream, without times and ids."""
    return {
        "response": {k: record["response"][k] for k in ("status", "bytes_wire", "bytes_out")},
        "figures": {k: record["figures"][k] for k in ("tokens", "tokens_source", "events")},
        "stream": record["stream"],
        "ended": record["ended"],
        "api": record["api"],
        "model": record["model"],
        "findings": sorted(f["kind"] for f in record["findings"]),
    }


def test_both_loops_forward_and_measure_the_same(tmp_path: Path) -> None:
    """Over HTTP/1.1 and HTTP/2, both loops give the client exactly the upstream's bytes and
    write the same records, with every chunk followed until the kernel sent it."""
    (tmp_path / "asyncio").mkdir()
    (tmp_path / "uvloop").mkdir()
    bodies_a, records_a = through(tmp_path / "asyncio", "asyncio")
    bodies_u, records_u = through(tmp_path / "uvloop", "uvloop")
    assert bodies_a == bodies_u == [b"".join(EVENTS)] * 2
    assert [said(r) for r in records_u] == [said(r) for r in records_a]
    assert records_a[0]["figures"]["tokens"] > 0 and records_a[0]["model"] == "gpt-4o"
    for record in records_a + records_u:
        assert record["delivery"]["measured"], record["delivery"]
        assert len(record["chunks_out"]) == len(record["chunks"])
        assert all(out is not None and sent is not None for out, sent in record["chunks_out"])
