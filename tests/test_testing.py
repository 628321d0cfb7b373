"""hopmeter.testing: the chunkings and the feed loop shared by tests and users."""

from __future__ import annotations

import pytest

from hopmeter.core.frames import Frame
from hopmeter.core.sse import SseDecoder
from hopmeter.testing import feed_all, split_at, split_every_way


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
