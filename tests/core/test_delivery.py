"""A flow's delivery from literal times: out and sent per chunk, client wait, the hop's hold."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core import delivery
from hopmeter.core.delivery import DeliverySeen, summarize, tokens_per_chunk, union_s
from hopmeter.core.ledger import (
    GONE,
    HELD,
    OUT,
    SENT,
    T_IN,
    T_WRITE,
    WAITED,
    FlowChunks,
    Ledger,
    new_chunk,
)

MONO0 = 100.0  # the request started at monotonic 100 s; record offsets are t - 100


def flow_of(*chunks: list[Any]) -> FlowChunks:
    """A FlowChunks following `chunks`, in order."""
    flow = FlowChunks()
    for c in chunks:
        flow.add(c)
    return flow


def seen(flow: FlowChunks | None, **kw: Any) -> DeliverySeen:
    """What a proxy saw of a measured HTTP/1.1 flow."""
    args: dict[str, Any] = dict(
        reason=None, measured=True, chunks=flow, mono0=MONO0, skew_s=0.0, http_version="HTTP/1.1"
    )
    args.update(kw)
    return DeliverySeen(**args)


def write(led: Ledger, t_in: float, t_write: float, buffered: bool = False) -> list[Any]:
    """A 100-byte chunk read at `t_in` and written at `t_write`."""
    c = new_chunk(100, t_in)
    led.arm(c)
    led.wrote(108, t_write, buffered)
    return c


def test_a_fast_client_waits_nothing_and_the_hop_holds_microseconds() -> None:
    """Chunks straight out and sent by the next look: no wait; holds are write - read per token."""
    led = Ledger()
    a = write(led, 100.1, 100.1002)
    b = write(led, 100.2, 100.2001)
    led.sample(100.26, 100.0, 0, 0)
    d = summarize(seen(flow_of(a, b)), [0.1, 0.2], [0.1, 0.2], [1, 3])
    assert d.measured and d.reason is None
    assert d.client_wait_s == 0.0 and not d.client_wait_is_lower_bound
    assert d.chunks_out == [[0.1002, 0.1002], [0.2001, 0.2001]]
    assert d.holds == (pytest.approx((0.0002, 1)), pytest.approx((0.0001, 3)))
    assert d.hold_p50_s == pytest.approx(0.0001)  # three of four tokens held 0.1 ms
    assert d.hold_max_s == pytest.approx(0.0002)


def test_a_slow_client_waits_from_each_write_to_the_last_look_that_saw_it_queued() -> None:
    """Client wait is the union of [written, last seen waiting] over chunks: lower bounds."""
    led = Ledger()
    a = write(led, 100.1, 100.1, buffered=True)
    b = write(led, 100.2, 100.2, buffered=True)
    led.sample(100.5, 100.45, 100, 0)  # a out and sent (108 <= 216 - 100), b in user space
    led.sample(101.0, 100.9, 0, 50)  # b out, 50 unsent: b waits in the kernel
    led.sample(101.2, 101.0, 0, 0)  # b sent
    d = summarize(seen(flow_of(a, b)), [0.1, 0.2], [0.1, 0.2], [1, 1])
    # a waited 100.1 .. 100.45 (seen in user space by the look before it moved);
    # b waited 100.2 .. 101.0 (seen unsent at 101.0)
    assert d.client_wait_s == pytest.approx(0.9)
    assert d.chunks_out == [[0.5, 0.5], [1.0, 1.0]]
    assert d.hold_max_s == 0.0  # written in the same step they were read


def test_held_http2_chunks_wait_from_their_read_and_are_not_the_hops_hold() -> None:
    """A chunk in mitmproxy's stream buffer waited on the client's window from the moment read."""
    led = Ledger()
    c = new_chunk(100, 100.1)
    led.hold(c, 1, 100)
    led.written += 109
    led.release(1, 100, 100.6)
    led.sample(100.601, 100.6, 0, 0)
    d = summarize(seen(flow_of(c), http_version="HTTP/2.0"), [0.1], [0.1], [1])
    assert d.client_wait_s == pytest.approx(0.5)
    assert d.holds == () and d.hold_max_s is None
    assert d.chunks_out == [[0.601, 0.601]]


def test_bytes_not_seen_sent_make_the_wait_a_lower_bound() -> None:
    """A record written with a chunk still queued: its sent time is unknown and the wait a floor."""
    led = Ledger()
    c = write(led, 100.1, 100.1, buffered=True)
    led.sample(100.3, 100.2, 50, 0)
    d = summarize(seen(flow_of(c)), [0.1], [0.1], [1])
    assert d.client_wait_is_lower_bound
    assert d.chunks_out == [[None, None]]
    assert d.reason == "still queued when the record was written"


def test_lists_that_do_not_line_up_are_not_measured() -> None:
    """Never a wrong number: followed chunks that do not match the record's list are dropped."""
    led = Ledger()
    c = write(led, 100.1, 100.1)
    d = summarize(seen(flow_of(c)), [0.1, 0.2], [], [])
    assert not d.measured and d.chunks_out == [] and d.client_wait_s is None
    assert d.reason == "followed 1 chunks, the record lists 2"


def test_a_flow_not_followed_says_why() -> None:
    """No transport found: not measured, with the reason the proxy gave."""
    d = summarize(seen(None, measured=False, reason="no socket"), [0.1], [0.1], [1])
    assert not d.measured and d.as_dict()["reason"] == "no socket"


def test_hopmeters_own_steps_and_loop_lag_are_reported() -> None:
    """The slowest own step (wall and CPU), their count and the worst loop lag reach the record."""
    d = summarize(
        seen(
            FlowChunks(),
            steps=[(100.1, 0.003, 0.001), (100.5, 0.06, 0.058)],
            loop_lags_s=[(100.56, 0.055)],
            involuntary_switches=4,
        ),
        [],
        [],
        [],
    )
    out = d.as_dict()
    assert (out["own_steps"], out["own_step_max_s"], out["own_step_max_cpu_s"]) == (2, 0.06, 0.058)
    assert (out["loop_lag_max_s"], out["involuntary_switches"]) == (0.055, 4)


def test_union_counts_overlaps_once() -> None:
    """Overlapping and touching waits add up once; empty ones count nothing."""
    assert union_s([(1.0, 2.0), (1.5, 3.0), (5.0, 5.0), (4.0, 4.5), (6.0, 5.0)]) == 2.5
    assert union_s([]) == 0.0


def test_tokens_belong_to_the_chunk_that_ended_their_event() -> None:
    """An event's time is its last chunk's read time; events without tokens add none."""
    assert tokens_per_chunk([0.1, 0.2, 0.3], [0.1, 0.3, 0.3, 0.3], [2, 1, 0, 4]) == [2, 0, 5]


def searched(chunk_t: list[float], event_t: list[float], tokens: list[int]) -> list[int]:
    """tokens_per_chunk's definition: each event's chunk searched by its time."""
    out = [0] * len(chunk_t)
    for t, k in zip(event_t, tokens, strict=False):
        i = bisect_right(chunk_t, t) - 1
        if 0 <= i < len(out) and k > 0:
            out[i] += k
    return out


@given(
    st.lists(st.integers(0, 40), max_size=30),
    st.lists(st.integers(-1, 5), max_size=40),
    st.integers(0, 35),
    st.booleans(),
)
def test_tokens_per_chunk_without_search_is_the_search(
    steps: list[int], tokens: list[int], chunks: int, arrays: bool
) -> None:
    """When the chunk times are the events' first times (the meter's usual stream) the tokens
    are taken without searching: the same as searching, equal times and extra events included."""
    times = [sum(steps[: i + 1]) / 1000 for i in range(len(steps))]  # non-decreasing
    chunk_t = times[:chunks]
    want = searched(chunk_t, times, tokens)
    if arrays:
        assert tokens_per_chunk(array("d", chunk_t), array("d", times), tokens) == want
    assert tokens_per_chunk(chunk_t, times, tokens) == want
    assert tokens_per_chunk(chunk_t, times[::-1], tokens) == searched(chunk_t, times[::-1], tokens)


def test_a_write_stamped_before_its_read_is_counted_not_observed() -> None:
    """A hold below zero by more than the record's microsecond rounding is left out of the holds
    and counted (token-weighted, as the holds are); within the rounding it is a hold of 0."""
    led = Ledger()
    a = write(led, 100.1, 100.1000004)  # its read time comes back rounded: 0.4 µs early
    b = write(led, 100.2, 100.19)  # written 10 ms before it was read: no hold
    led.sample(100.26, 100.0, 0, 0)
    d = summarize(seen(flow_of(a, b)), [0.1, 0.2], [0.1, 0.2], [1, 3])
    assert d.holds == (pytest.approx((0.0000004, 1), abs=1e-6),)
    assert d.negative_holds == 3 and d.as_dict()["negative_holds"] == 3


def _both_ways(chunks: list[tuple[list[Any], int]], skew: float) -> tuple[Any, Any]:
    """`chunks` (each with the tokens its events carried) as one ended flow, followed the short
    way (None where it does not apply) and chunk by chunk."""
    flow = FlowChunks()
    chunk_t, tokens = [], []
    for c, k in chunks:
        flow.add(c)
        chunk_t.append(round((c[T_IN] - MONO0 + skew) * 1e6) / 1e6)
        tokens.append(k)
    flow.settle("end")
    how = {"by_tokens": any(tokens), "mono0": MONO0, "skew": skew}
    plain = delivery._follow_plain(flow, chunk_t, tokens, **how)
    return plain, delivery._follow_each(flow, chunk_t, tokens, **how)


chunk_shapes = st.lists(
    st.tuples(
        st.floats(0.0, 0.05),  # read this long after the chunk before
        st.floats(-3e-6, 0.002),  # written this long after its read (a little before: rounding)
        st.sampled_from(["kept up", "kept up", "kept up", "out later", "waited", "held", "lost"]),
        st.integers(0, 3),  # tokens its events carried
    ),
    max_size=30,
)


@given(chunk_shapes, st.floats(-0.01, 0.01), st.booleans())
def test_a_client_that_kept_up_is_followed_by_columns_as_chunk_by_chunk(
    shapes: list[tuple[float, float, str, int]], skew: float, by_tokens: bool
) -> None:
    """For a flow whose every chunk was written, seen out and sent (never held nor seen
    waiting), the columns give the same rows, holds and counts as the loop over each chunk; any
    other flow is left to the loop."""
    chunks, t = [], MONO0
    for step, hold, shape, k in shapes:
        t += step
        c = new_chunk(100, t)
        c[T_WRITE] = None if shape == "lost" else t + hold
        c[OUT] = c[T_WRITE] if shape != "out later" else t + hold + 0.001
        c[SENT] = None if shape == "lost" else t + hold + 0.0005
        c[WAITED] = t + hold + 0.0004 if shape == "waited" else None
        c[HELD] = shape == "held"
        c[GONE] = "gone" if shape == "lost" else None
        chunks.append((c, k if by_tokens else 0))
    plain, each = _both_ways(chunks, skew)
    if all(s in ("kept up", "out later") for _, _, s, _ in shapes):
        assert plain == each
    else:
        assert plain is None


@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.05), st.floats(-1e-6, 0.002), st.integers(0, 3)), max_size=30
    ),
    st.floats(-0.01, 0.01),
    st.booleans(),
)
def test_a_client_that_kept_up_with_no_write_before_its_read_takes_the_short_way(
    shapes: list[tuple[float, float, int]], skew: float, by_tokens: bool
) -> None:
    """A flow whose every chunk kept up and whose holds are all at or above the rounding (the
    usual flow, where the columns skip each chunk's test) gives the same rows, holds and counts
    as the loop over each chunk: chunks without tokens left out when weighted by tokens."""
    chunks, t = [], MONO0
    for step, hold, k in shapes:
        t += step
        c = new_chunk(100, t)
        c[T_WRITE] = c[OUT] = t + hold
        c[SENT] = t + hold + 0.0005
        chunks.append((c, k if by_tokens else 0))
    plain, each = _both_ways(chunks, skew)
    assert plain is not None
    assert plain == each
