"""Beacons as hopmeter's browser snippet sends them, for tests that stand in for a page.

A page announces its beacon on the streaming request (`tracestate: hopmeter=beacon`, with its
`Origin`), reads the reply, then posts one beacon (hopmeter.beacon/1, times in 0.1 ms ticks
since its fetch(), delta-coded) to `/_hopmeter/beacon` at the same proxy.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

PAGE_ORIGIN = "http://page.example"  # the page's origin as its requests name it
ANNOUNCE = "vendor=1,hopmeter=beacon"  # the tracestate of a request whose page will send a beacon


def traceparent() -> str:
    """A new W3C traceparent."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def beacon(traceparent: str, **changes: Any) -> dict[str, Any]:
    """A well-formed beacon (three reads of three characters each, no element watched)."""
    doc: dict[str, Any] = {
        "schema": "hopmeter.beacon/1",
        "traceparent": traceparent,
        "url": "/v1/chat/completions",
        "t0": time.time() * 1000 - 3000,
        "status": 200,
        "headers": 500,
        "end": 15000,
        "how": "done",
        "sent": 16000,
        "rt": None,
        "reads": {
            "t": [600, 100, 100],
            "bytes": [90, 90, 90],
            "chars": [3, 3, 3],
            "lost": 0,
            "step": 1,
        },
        "stream": {"bytes": 270, "chars": 9, "shown": 9, "fffd": 0},
        "screen": None,
    }
    doc.update(changes)
    return doc


def reads_of(body: bytes) -> dict[str, Any]:
    """A beacon's reads of an SSE chat reply, one per event, as the snippet counts them."""
    chars = []
    for block in body.split(b"\n\n"):
        data = block.removeprefix(b"data: ")
        if data.startswith(b"{"):
            choices = orjson.loads(data)["choices"]
            chars.append(len(choices[0]["delta"].get("content") or "") if choices else 0)
    n = len(chars)
    return {"t": [600] + [200] * (n - 1), "bytes": [90] * n, "chars": chars}


def painted(reads: dict[str, Any], lag_ticks: int = 80) -> dict[str, Any]:
    """The screen of a good page for `reads`: each read painted `lag_ticks` later, one write per
    frame, nothing removed."""
    n = len(reads["t"])
    first = reads["t"][0] + lag_ticks
    return {
        "t": [first, *reads["t"][1:]],
        "raf": [30] * n,
        "write": [20] * n,
        "chars": list(reads["chars"]),
        "tasks": [1] * n,
        "removed": [0] * n,
        "lost": 0,
        "step": 1,
        "slow": 0,
        "paint": first,
        "present": first + 30,
        "plain": True,
    }
