"""The test router's split: by trace id, every span once, a leaving backend moves only its own."""

from __future__ import annotations

from tests.harness.otlp import hop_span, pick, request_of, split


def test_split_keeps_every_span_once_and_traces_whole() -> None:
    """Each span lands in exactly one part, both spans of a trace in the same one."""
    spans = []
    for i in range(50):
        trace = i.to_bytes(16, "big")
        spans += [hop_span(trace, b"\x01" * 8), hop_span(trace, b"\x02" * 8, parent=b"\x01" * 8)]
    parts = split(request_of(spans), ["a", "b"])
    landed = {
        (s.trace_id, s.span_id): i
        for i, part in parts.items()
        for rs in part.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    assert len(landed) == 100 and set(parts) == {0, 1}
    for i in range(50):
        trace = i.to_bytes(16, "big")
        assert landed[trace, b"\x01" * 8] == landed[trace, b"\x02" * 8]
    assert parts[0].resource_spans[0].resource == request_of([]).resource_spans[0].resource


def test_a_backend_leaving_moves_only_its_traces() -> None:
    """Rendezvous hashing: removing backend c reassigns c's traces and no other."""
    before, after = ["a", "b", "c"], ["a", "b"]
    for i in range(300):
        trace = i.to_bytes(16, "big")
        if before[pick(trace, before)] != "c":
            assert after[pick(trace, after)] == before[pick(trace, before)]
