"""W3C traceparent parsing per the Trace Context spec."""

from __future__ import annotations

from hopmeter.core.trace import TraceContext, parse_traceparent

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_valid_header_parses() -> None:
    """A version-00 header yields its trace id, parent id and flags."""
    ctx = parse_traceparent(VALID)
    assert ctx == TraceContext(
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7", flags="01"
    )
    assert ctx is not None and ctx.header() == VALID


def test_invalid_headers_are_ignored() -> None:
    """Upper case, all-zero ids, version ff and extra fields on version 00 are not valid."""
    for bad in (
        VALID.upper(),
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
        "ff" + VALID[2:],
        VALID + "-extra",
        "garbage",
        "",
    ):
        assert parse_traceparent(bad) is None, bad


def test_future_version_may_carry_more_fields() -> None:
    """A higher version's extra fields are ignored, its ids kept."""
    ctx = parse_traceparent("01" + VALID[2:] + "-whatever")
    assert ctx is not None and ctx.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_hop_forwards_the_trace_with_its_own_span_as_the_parent() -> None:
    """child() keeps the trace id and flags and names the hop's span; a higher version that came
    in goes on as version 00, the one this hop speaks."""
    ctx = parse_traceparent("01" + VALID[2:-2] + "00-whatever")
    assert ctx is not None
    assert ctx.child("b7ad6b7169203331").header() == (
        "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-00"
    )
