"""The ledger on literal byte counts and times: which chunk is out, sent, or given up on, when."""

from __future__ import annotations

import math
from array import array
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hopmeter.core.ledger import (
    END,
    GONE,
    HELD,
    MAX_FOLLOWED,
    NO_WRITE,
    OUT,
    SENT,
    SHORT_WRITE,
    T_WRITE,
    WAITED,
    FlowChunks,
    Ledger,
    new_chunk,
)

FRAMING = 8  # an HTTP/1 chunk's size line and CRLF around 100 bytes


def written(led: Ledger, n: int, t_in: float, t_write: float, buffered: bool) -> list[Any]:
    """A chunk of `n` bytes read at `t_in`, armed and written (with framing) at `t_write`."""
    c = new_chunk(n, t_in)
    led.arm(c)
    assert led.wrote(n + FRAMING, t_write, buffered)
    return c


class TestWrites:
    def test_a_write_that_empties_the_buffer_is_out_at_once(self) -> None:
        """With nothing left in user space, a chunk left the process when its write returned."""
        led = Ledger()
        c = written(led, 100, 1.0, 1.00005, buffered=False)
        assert (c[END], c[T_WRITE], c[OUT], c[WAITED]) == (108, 1.00005, 1.00005, None)
        assert list(led.kernel) == [c] and not led.user

    def test_a_buffered_write_waits_in_user_space_and_was_seen_waiting(self) -> None:
        """A write that left bytes buffered is not out yet; it was seen waiting at the write."""
        led = Ledger()
        c = written(led, 100, 1.0, 1.0001, buffered=True)
        assert c[OUT] is None and c[WAITED] == 1.0001 and list(led.user) == [c]

    def test_an_empty_buffer_after_a_later_write_means_the_earlier_chunks_left(self) -> None:
        """FIFO: when a write leaves the buffer empty, every chunk before it has left too."""
        led = Ledger()
        a = written(led, 100, 1.0, 1.001, buffered=True)
        led.sample(1.002, 0.0, 50, 0)  # still 50 bytes in user space
        b = written(led, 100, 1.003, 1.004, buffered=False)
        assert a[OUT] == b[OUT] == 1.004
        assert a[WAITED] == 1.002  # the last sample saw it waiting
        assert list(led.kernel) == [a, b]

    def test_a_write_shorter_than_the_chunk_is_not_its_write(self) -> None:
        """Framing and encryption only add bytes: a shorter write is not the chunk's own."""
        led = Ledger()
        c = new_chunk(100, 1.0)
        led.arm(c)
        assert not led.wrote(40, 1.001, False)
        assert c[GONE] == SHORT_WRITE and led.written == 40 and not led.pending()

    def test_a_chunk_armed_twice_without_a_write_is_given_up(self) -> None:
        """A chunk whose step ended with no write is dropped, never matched to a later write."""
        led = Ledger()
        first, second = new_chunk(10, 1.0), new_chunk(10, 1.1)
        led.arm(first)
        led.arm(second)
        assert first[GONE] == NO_WRITE and led.armed is second
        led.disarm()
        assert second[GONE] == NO_WRITE and led.armed is None

    def test_writes_with_nothing_armed_are_only_counted(self) -> None:
        """Headers, the last chunk's terminator and other frames move the count, nothing else."""
        led = Ledger()
        assert not led.wrote(300, 1.0, False)
        c = written(led, 100, 1.1, 1.1001, buffered=False)
        assert c[END] == 300 + 100 + FRAMING

    def test_followed_chunks_are_bounded_per_connection(self) -> None:
        """Past MAX_FOLLOWED chunks queued on one connection, a chunk is not followed."""
        led = Ledger()
        for i in range(MAX_FOLLOWED):
            written(led, 1, float(i), float(i), buffered=True)
        c = new_chunk(1, 1e6)
        led.arm(c)
        assert not led.wrote(1 + FRAMING, 1e6, True)
        assert c[GONE] is not None and led.followed() == MAX_FOLLOWED


class TestSamples:
    def test_chunks_leave_user_space_then_the_kernel_in_order(self) -> None:
        """Out once written - buffered passes the chunk's end; sent once unsent drains past it."""
        led = Ledger()
        a = written(led, 100, 1.0, 1.0, buffered=True)  # END 108
        b = written(led, 100, 1.01, 1.01, buffered=True)  # END 216
        assert not led.sample(1.02, 1.0, 150, 0)  # 66 bytes out: short of a's end (108)
        assert a[OUT] is None
        led.sample(1.03, 1.02, 100, 60)  # 116 out of the process, 56 sent
        assert a[OUT] == 1.03 and b[OUT] is None and a[SENT] is None
        led.sample(1.04, 1.03, 0, 100)  # all 216 out, 116 sent
        assert b[OUT] == 1.04 and a[SENT] == 1.04 and b[SENT] is None
        led.sample(1.05, 1.04, 0, 0)
        assert b[SENT] == 1.05 and not led.pending()

    def test_last_seen_waiting_is_the_sample_before_the_one_that_saw_it_move(self) -> None:
        """A chunk seen sent at one sample was still waiting at the one before: the lower bound."""
        led = Ledger()
        c = written(led, 100, 1.0, 1.0, buffered=False)  # out at once
        led.sample(1.001, 0.0, 0, 108)  # unsent in the kernel
        led.sample(1.002, 1.001, 0, 108)
        led.sample(1.010, 1.002, 0, 0)
        assert c[SENT] == 1.010 and c[WAITED] == 1.002

    def test_a_chunk_never_seen_waiting_keeps_no_wait(self) -> None:
        """Out at its write and sent by the next sample: nothing says it waited."""
        led = Ledger()
        c = written(led, 100, 1.0, 1.0, buffered=False)
        led.sample(1.064, 0.5, 0, 0)
        assert c[SENT] == 1.064 and c[WAITED] is None

    def test_bytes_queued_before_counting_began_cancel_out(self) -> None:
        """Older bytes are ahead in every queue: while they drain, no counted chunk moves."""
        led = Ledger()
        c = written(led, 100, 1.0, 1.0, buffered=True)  # END 108, behind 500 older bytes
        led.sample(1.01, 1.0, 608 - 300, 0)  # 300 of the older bytes left
        assert c[OUT] is None
        led.sample(1.02, 1.01, 0, 0)
        assert c[OUT] == 1.02 and c[SENT] == 1.02


class TestHttp2:
    def test_held_chunks_are_released_by_the_stream_bytes_handed_on(self) -> None:
        """A held chunk waits from its read; it is written once the stream has emitted its end."""
        led = Ledger()
        a, b = new_chunk(100, 1.0), new_chunk(100, 1.1)
        led.hold(a, 1, 100)
        led.hold(b, 1, 200)
        assert a[WAITED] == 1.0 and led.pending()
        led.written += 120
        assert led.release(1, 150, 1.5)  # a's bytes are out of the stream buffer, b's not all
        assert (a[END], a[T_WRITE], a[WAITED]) == (120, 1.5, 1.5) and list(led.user) == [a]
        led.release(1, 200, 1.6)
        assert b[T_WRITE] == 1.6 and 1 not in led.held

    def test_a_reset_stream_drops_its_held_chunks(self) -> None:
        """Bytes dropped by a reset were never sent: they are given up on, not called sent."""
        led = Ledger()
        c = new_chunk(100, 1.0)
        led.hold(c, 3, 100)
        led.drop_stream(3, "reset", 1.2)
        assert c[GONE] == "reset" and c[SENT] is None and not led.pending()


class TestGiveUp:
    def test_giving_up_keeps_what_was_seen(self) -> None:
        """A closed connection: out times stay, sent stays unknown, waits end at the last sample."""
        led = Ledger()
        a = written(led, 100, 1.0, 1.0, buffered=False)
        b = written(led, 100, 1.1, 1.1, buffered=True)
        led.give_up("closed", 1.5)
        assert a[OUT] == 1.0 and a[SENT] is None and a[GONE] == "closed" and a[WAITED] == 1.5
        assert b[OUT] is None and b[WAITED] == 1.5 and not led.pending()


class TestFlowChunks:
    def test_done_chunks_are_packed_and_the_rest_stay_lists(self) -> None:
        """Chunks at the head that were seen sent are packed; a moving one stops the packing."""
        led, flow = Ledger(), FlowChunks()
        chunks = [written(led, 100, float(i), float(i), buffered=False) for i in range(3)]
        for c in chunks:
            flow.add(c)
        led.sample(3.0, -math.inf, 0, 108)  # the last chunk's bytes are unsent
        assert not flow.done()
        assert len(flow.flags) == 2 and list(flow.live) == [chunks[2]] and len(flow) == 3
        led.sample(3.1, 3.0, 0, 0)
        assert flow.done() and len(flow.flags) == 3
        assert flow.waited[2] == 3.0 and math.isnan(flow.waited[0])

    def test_settle_packs_what_never_arrived_and_says_why(self) -> None:
        """A record written before the last bytes were seen sent packs them as not seen, once."""
        led, flow = Ledger(), FlowChunks()
        c = written(led, 100, 1.0, 1.0, buffered=True)
        flow.add(c)
        flow.settle("still queued")
        assert not flow.live and flow.why == "still queued" and flow.flags[0] == 0


def _column(chunks: list[list[Any]], slot: int) -> list[float | None]:
    return [c[slot] for c in chunks]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["at write", "later", "never", "unwritten"]),
            st.booleans(),  # seen waiting
            st.sampled_from(["sent", "gone", "moving"]),
            st.booleans(),  # held (HTTP/2)
        ),
        max_size=40,
    ),
    st.lists(st.integers(0, 40), max_size=6),
)
def test_packed_columns_read_back_what_every_chunk_carried(
    shapes: list[tuple[str, bool, str, bool]], packs: list[int]
) -> None:
    """Packed, each chunk reads back its write, out and waited times and flags exactly as it
    carried them (nan for none), whether the out and waited columns were kept from the start
    or only from the first chunk that needed them; a flow whose every chunk left at its write and
    was never seen waiting keeps neither."""
    flow, chunks = FlowChunks(), []
    for i, (out, waited, end, held) in enumerate(shapes):
        c = new_chunk(100, float(i))
        if out != "unwritten":
            c[T_WRITE] = i + 0.5
        c[OUT] = {"at write": c[T_WRITE], "later": i + 0.75, "never": None, "unwritten": None}[out]
        c[WAITED] = i + 0.625 if waited else None
        c[SENT] = i + 0.875 if end == "sent" else None
        c[GONE] = "closed" if end == "gone" else None
        c[HELD] = held
        flow.add(c)
        chunks.append(c)
    for k in packs:  # pack whatever is done at the head now and then, as the proxy does
        flow.pack()
        if len(flow.flags) <= k < len(chunks):  # one not packed yet is given up on
            chunks[k][GONE] = chunks[k][GONE] or "late"
    flow.settle("still queued")
    nan = math.nan

    def expect(slot: int) -> bytes:
        return array("d", [nan if v is None else v for v in _column(chunks, slot)]).tobytes()

    assert flow.t_write.tobytes() == expect(T_WRITE)
    assert flow.waited.tobytes() == expect(WAITED)
    assert flow.out.tobytes() == expect(OUT)
    assert list(flow.flags) == [
        (1 if c[HELD] else 0) | (2 if c[SENT] is not None else 0) | (4 if c[OUT] is not None else 0)
        for c in chunks
    ]
    assert len(flow) == len(chunks) and not flow.live
    # the first chunk not followed to the end says why: given up on, or never seen sent
    ended = [c[GONE] or "still queued" for c in chunks if c[GONE] or c[SENT] is None]
    assert flow.why == (ended[0] if ended else None)
    assert (flow._out is None) == all(c[OUT] in (None, c[T_WRITE]) for c in chunks)
    assert (flow._waited is None) == all(c[WAITED] is None for c in chunks)


class _EachPut(FlowChunks):
    """FlowChunks packing every done chunk through `_put`: the general path."""

    __slots__ = ()

    def pack(self) -> None:
        k = 0
        for c in self.live:
            if c[SENT] is None and c[GONE] is None:
                break
            self._put(c)
            k += 1
        del self.live[:k]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["at write", "later", "never", "unwritten", "-0.0", "nan"]),
            st.booleans(),  # seen waiting
            st.sampled_from(["sent", "gone", "sent and gone", "moving"]),
            st.sampled_from([False, True, 0, 1, None]),  # held (HTTP/2)
        ),
        max_size=30,
    ),
    st.lists(st.integers(1, 30), max_size=6),
)
def test_packing_the_usual_chunk_inline_packs_what_put_packs(
    shapes: list[tuple[str, bool, str, Any]], batches: list[int]
) -> None:
    """`pack`'s inline packing of the usual chunk leaves every column, flag, reason and list
    byte for byte as `_put` on each done chunk does, packed in any batches."""
    flows = (FlowChunks(), _EachPut())
    pending = []
    for i, (out, waited, end, held) in enumerate(shapes):
        c = new_chunk(100, float(i))
        if out != "unwritten":
            c[T_WRITE] = {"-0.0": 0.0, "nan": math.nan}.get(out, i + 0.5)
        c[OUT] = {
            "at write": c[T_WRITE],
            "later": i + 0.75,
            "-0.0": -0.0,
            "nan": math.nan,
        }.get(out)
        c[WAITED] = i + 0.625 if waited else None
        c[SENT] = i + 0.875 if "sent" in end else None
        c[GONE] = "closed" if "gone" in end else None
        c[HELD] = held
        pending.append(c)
    for size in [*batches, len(pending)]:
        batch, pending = pending[:size], pending[size:]
        for flow in flows:
            for c in batch:
                flow.add(list(c))
            flow.pack()
    fast, general = flows
    assert fast.t_write.tobytes() == general.t_write.tobytes()
    assert fast.flags == general.flags and fast.why == general.why
    assert repr(fast.live) == repr(general.live)  # (nan compares unequal to itself)
    assert (fast._out is None) == (general._out is None)
    assert fast.out.tobytes() == general.out.tobytes()
    assert (fast._waited is None) == (general._waited is None)
    assert fast.waited.tobytes() == general.waited.tobytes()
