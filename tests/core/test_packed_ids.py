"""Tests for hopmeter.core.packed_ids: packed token-ID bodies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopmeter.core.apis import make_parser
from hopmeter.core.packed_ids import FRAME_KIND, PackedIdDecoder, pack_ids, width_bits
from hopmeter.core.wire import detect_api, lower_headers
from hopmeter.errors import HopmeterError
from hopmeter.testing import feed_all, split_every_way

# "Hello, world!" in r50k_base, and ids past 16 bits for the 32-bit case.
R50K_IDS = [15496, 11, 995, 0]
WIDE_IDS = [0, 1, 65535, 65536, 199_999, 2**32 - 1]


def all_ids(decoder: PackedIdDecoder, chunks: list[bytes]) -> list[int]:
    parser = make_parser("token_ids")
    out: list[int] = []
    for frame in feed_all(decoder, chunks):
        assert frame.kind == FRAME_KIND
        out.extend(parser.parse(frame).token_ids or ())
    return out


@pytest.mark.parametrize(("width", "ids"), [(16, R50K_IDS), (32, WIDE_IDS)])
def test_ids_survive_every_chunking(width: int, ids: list[int]):
    """Ids split across chunk boundaries come out whole, however the body is cut."""
    body = pack_ids(ids, width)
    for chunks in split_every_way(body):
        assert all_ids(PackedIdDecoder(width), chunks) == ids


def test_one_event_per_feed_that_completes_ids():
    """Each feed that completes ids is one event, stamped with that feed's time."""
    body = pack_ids([1, 2, 3], 16)
    decoder = PackedIdDecoder(16)
    assert decoder.feed(body[:3], 0.5)[0].data == "[1]"  # one id and a half
    frames = decoder.feed(body[3:], 0.75)
    assert [(f.t_s, f.data, f.wire_bytes) for f in frames] == [(0.75, "[2,3]", 4)]
    assert decoder.feed(b"", 1.0) == []
    assert decoder.ids_total == 3


def test_partial_id_at_close_is_counted():
    """Bytes left when the body ends are a truncated id: counted, not dispatched."""
    decoder = PackedIdDecoder(32)
    frames = decoder.feed(pack_ids([7]) + b"\x01\x02", 0.0)
    assert decoder.close(1.0) == []
    assert decoder.trailing_bytes == 2
    assert sum(f.wire_bytes for f in frames) + decoder.trailing_bytes == 6


@given(
    st.lists(st.integers(min_value=0, max_value=2**16 - 1), max_size=50),
    st.lists(st.integers(min_value=1, max_value=7), max_size=20),
)
def test_random_chunkings_keep_ids(ids: list[int], cuts: list[int]):
    """Hypothesis-chosen chunk sizes give the same ids as the body fed whole."""
    body = pack_ids(ids, 16)
    chunks, pos = [], 0
    for size in cuts:
        chunks.append(body[pos : pos + size])
        pos += size
    chunks.append(body[pos:])
    assert all_ids(PackedIdDecoder(16), chunks) == ids


@pytest.mark.parametrize(
    ("headers", "content_type", "bits"),
    [
        ({"X-Token-Id-Width": "16"}, "application/octet-stream", 16),
        ({"x-token-id-width": "32", "X-Tokenizer": "r50k_base"}, "", 32),
        ({}, "application/x-token-ids; width=16", 16),
        ({"X-Tokenizer": "r50k_base"}, "application/octet-stream", 16),
        ({"X-Tokenizer": "o200k_base"}, "application/octet-stream", 32),
        ({}, "application/octet-stream", 32),
    ],
)
def test_width_from_headers(headers: dict[str, str], content_type: str, bits: int):
    """The width header wins, then the media type parameter, then the vocabulary's size."""
    assert width_bits(lower_headers(headers), content_type) == bits


def test_bad_width_is_refused():
    """Only 16 and 32 bits are widths."""
    with pytest.raises(HopmeterError):
        width_bits({"x-token-id-width": "24"})
    with pytest.raises(HopmeterError):
        PackedIdDecoder(8)


def test_packed_body_is_detected_as_token_ids():
    """An octet-stream with X-Tokenizer is a token-ID stream."""
    api = detect_api(
        "GET", "/answer?mode=packed", {}, {"X-Tokenizer": "r50k_base"}, "application/octet-stream"
    )
    assert api == "token_ids"
