"""hopmeter.testing: the chunkings, the feed loop and the manual clock shared by tests and users."""

from __future__ import annotations

import pytest

from hopmeter.core.frames import Frame
from hopmeter.core.sse import SseDecoder
from hopmeter.testing import ManualClock, feed_all, split_at, split_every_way


def test_split_every_way_covers_whole_bytes_and_every_cut():
    """Short input yields itself whole, byte by byte, every single cut and some double cuts."""
    chunkings = list(split_every_way(b"abcd"))
    assert chunkings[0] == [b"abcd"]
    assert chunkings[1] == [b"a", b"b", b"c", b"d"]
    assert [b"ab", b"cd"] in chunkings
    assert [b"a", b"bcd"] in chunkings
    assert [b"abc", b"d"] in chunkings
    assert [b"a", b"b", b"cd"] in chunkings
    assert all(b"".join(chunks) == b"abcd" for chunks in chunkings)


def test_split_every_way_limits_single_cuts():
    """Long input gets at most max_splits single cuts, spread over its length."""
    data = bytes(range(256)) * 40
    singles = [c for c in split_every_way(data, max_splits=10) if len(c) == 2]
    assert len(singles) == 10
    assert singles[0][0] == data[:1]
    assert len(singles[-1][1]) < len(data) // 9
    assert all(b"".join(c) == data for c in split_every_way(data, max_splits=10))


def test_split_every_way_of_tiny_input():
    """Empty and one-byte input yield only themselves."""
    assert list(split_every_way(b"")) == [[b""]]
    assert list(split_every_way(b"x")) == [[b"x"]]


def test_feed_all_uses_times_and_closes():
    """Chunk i is fed at times[i], and close() gets the extra last time."""
    decoder = SseDecoder()
    frames = feed_all(decoder, [b"data: a\n", b"\n", b"data: b"], [1.0, 2.0, 3.0, 4.0])
    assert frames == [Frame(t_s=2.0, kind="message", data="a", wire_bytes=9, data_bytes=1)]
    assert decoder.unterminated_bytes == 7


def test_feed_all_default_times_and_wrong_count():
    """Without times chunk i is fed at float(i); a times list of the wrong length is refused."""
    assert feed_all(SseDecoder(), [b": x\n", b"data: a\n\n"])[0].t_s == 1.0
    with pytest.raises(ValueError, match="need 2 or 3 times"):
        feed_all(SseDecoder(), [b"a", b"b"], [1.0])


def test_split_at_cuts_at_valid_offsets():
    """split_at cuts at each offset inside the data once, in order, ignoring the rest."""
    assert split_at(b"abcdef", [4, 2, 2, 0, 6, 99]) == [b"ab", b"cd", b"ef"]
    assert split_at(b"", [1]) == [b""]


def test_a_manual_clock_moves_only_when_advanced():
    """The clock reads its start until advanced, then the sum of the advances."""
    now = ManualClock(start_s=5.0)
    assert now() == now() == 5.0
    now.advance(1.5)
    now.advance(0)
    assert now() == 6.5
    with pytest.raises(ValueError, match="forward"):
        now.advance(-1)


def test_timers_fire_in_due_order_with_the_clock_at_their_due_time():
    """Timers fire in order of due time, ties in order of scheduling, each seeing its own time."""
    now = ManualClock(start_s=0.0)
    fired: list[tuple[str, float]] = []
    now.call_later(2.0, lambda: fired.append(("b", now())))
    now.call_later(1.0, lambda name: fired.append((name, now())), "a")
    now.call_later(2.0, lambda: fired.append(("c", now())))
    now.call_later(-1.0, lambda: fired.append(("past", now())))  # as asyncio: due now
    now.advance(1.5)
    assert fired == [("past", 0.0), ("a", 1.0)]
    now.advance(10)
    assert fired[2:] == [("b", 2.0), ("c", 2.0)]
    assert now() == 11.5 and now.pending() == 0


def test_a_cancelled_timer_does_not_fire():
    """cancel() before the due time keeps the call from running; after it fired, it is a no-op."""
    now = ManualClock()
    fired: list[str] = []
    kept = now.call_later(1, fired.append, "kept")
    dropped = now.call_later(1, fired.append, "dropped")
    dropped.cancel()
    assert now.pending() == 1
    now.advance(1)
    kept.cancel()
    assert fired == ["kept"] and now.pending() == 0


def test_a_timer_scheduled_by_a_callback_fires_in_the_same_advance_only_if_due():
    """A callback's delay-0 timer fires in the same advance; one due past its end waits."""
    now = ManualClock(start_s=0.0)
    fired: list[tuple[str, float]] = []

    def first() -> None:
        fired.append(("first", now()))
        now.call_later(0, lambda: fired.append(("again", now())))
        now.call_later(5, lambda: fired.append(("later", now())))

    now.call_later(1, first)
    now.advance(2)
    assert fired == [("first", 1.0), ("again", 1.0)]
    now.advance(3.9)
    assert len(fired) == 2
    now.advance(0.1)
    assert fired[2] == ("later", 6.0)
