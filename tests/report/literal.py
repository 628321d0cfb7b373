"""Flow records written out by hand, for report tests that need exact numbers (no processes).

rec = flow("edge", T0, [[0.5, 1, 5], ...])   # events: [t_offset_s, tokens, content_offset]
EDGE, ORIGIN                                  # one trace seen at two hops, the edge holding it

Each record's span id is `span(trace, hop)`; `parent=HOP` names the outer hop's span as its parent,
as hopmeter's traceparent does.
"""

from __future__ import annotations

from typing import Any

T0 = 1796000000.0  # epoch seconds of the outermost request start


def flow(
    hop: str,
    t_start: float,
    events: list[list[float]],
    *,
    trace: str | None = "t1",
    api: str = "openai.chat",
    model: str | None = "gpt-4o",
    figures: dict[str, Any] | None = None,
    findings: list[dict[str, Any]] | None = None,
    hops: list[dict[str, Any]] | None = None,
    parent: str | None = None,
) -> dict[str, Any]:
    """A hopmeter.flow/1 record with the fields the report reads (`parent`: the outer hop)."""
    rec: dict[str, Any] = {
        "schema": "hopmeter.flow/1",
        "trace_id": trace,
        "span_id": span(trace, hop),
        "parent_span_id": None if parent is None else span(trace, parent),
        "flow_id": f"{trace}-{hop}",
        "hop": hop,
        "api": api,
        "model": model,
        "request": {"method": "POST", "path": "/v1/chat/completions", "t_start": t_start},
        "response": {
            "status": 200,
            "t_first_byte": t_start + (events[0][0] if events else 0.0),
            "ended": "complete",
        },
        "events": events,
        "figures": figures or {},
        "findings": findings or [],
    }
    if hops is not None:
        rec["hops"] = hops
    return rec


def span(trace: str | None, hop: str) -> str:
    """The span id of `hop`'s flow of `trace` in these records."""
    return f"{trace}-{hop}-span"


# The origin sees three tokens 0.1 s apart; the edge (started 1 ms earlier) sees them all at 0.5 s:
# the segment between them holds the first token 0.399 s, the last 0.2 s.
ORIGIN = flow(
    "origin", T0 + 0.001, [[0.05, 0, 0], [0.1, 1, 5], [0.2, 1, 9], [0.3, 1, 14]], parent="edge"
)
EDGE = flow("edge", T0, [[0.5, 0, 0], [0.5, 1, 5], [0.5, 1, 9], [0.501, 1, 14]])


def _segment(name: str, inner: str, holds: list[float]) -> dict[str, Any]:
    return {
        "segment": name,
        "inner_hop": inner,
        "first_token_hold_s": holds[0],
        "hold_p50_s": sorted(holds)[1],
        "hold_p99_s": max(holds),
        "hold_max_s": max(holds),
        "whole_body": False,
        "tokens_aligned": len(holds),
        "skew_s": 0.0,
        "skew_bounds_s": [-0.0004, 0.002],
        "findings": [],
    }


# A page read the edge's three tokens 0.5 ms after the edge did and painted them 9.5, 6.5 and
# 2.5 ms after it read them; it called fetch() 5 ms before the edge saw the request, and its
# client is a smoothing buffer (the finding its beacon gave).
SMOOTHING = {
    "kind": "client_smoothing_buffer",
    "severity": "info",
    "evidence": {"delay_ms": 21.0},
    "fix": "A deliberate jitter buffer adds this delay to every token.",
}
PAGE_EDGE = flow(
    "edge",
    T0,
    [[0.05, 0, 0], [0.1, 1, 5], [0.12, 1, 10], [0.14, 1, 15]],
    trace="page",
    hops=[
        _segment("screen>browser", "browser", [0.0095, 0.0065, 0.0025]),
        _segment("browser>edge", "edge", [0.0005, 0.0005, 0.0005]),
    ],
)
PAGE_EDGE["browser"] = {
    "joined": True,
    "t_start": T0 - 0.005,
    "path": "/v1/chat/completions",
    "t_first_byte": T0 + 0.0505,
    "events": [[0.1055, 1, 5], [0.1255, 1, 10], [0.1455, 1, 15]],
    "ttft_s": 0.1055,
    "findings": [SMOOTHING],
}
PAGE_EDGE["screen"] = {
    "events": [[0.115, 1, 5], [0.132, 1, 10], [0.148, 1, 15]],
    "ttft_s": 0.115,
}
