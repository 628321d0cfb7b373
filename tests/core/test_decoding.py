"""Content decoders, the decoder chain, and UTF-8 accounting, on literal bytes."""

from __future__ import annotations

import gzip
import sys
import tracemalloc
import types
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from hopmeter.core.decoding import (
    DECODE_STEP_BYTES,
    BrotliDecoder,
    Decoder,
    DeflateDecoder,
    GzipDecoder,
    IdentityDecoder,
    MultiDecoder,
    Utf8Decoder,
    ZstdDecoder,
    decode_payload,
    make_decoder,
)
from hopmeter.errors import DecodedSizeError, DecodingError, HopmeterError, StreamLimitError
from hopmeter.testing import split_at, split_every_way

BODY = b'data: {"choices":[{"delta":{"content":"Hello"}}]}\n\n' * 20 + "data: 😀\n\n".encode()


def decode_chunks(decoder: Decoder, chunks: list[bytes]) -> bytes:
    return b"".join(decoder.decode(c) for c in chunks) + decoder.flush()


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


ENCODED = {
    "gzip": gzip.compress(BODY),
    "x-gzip": gzip.compress(BODY),
    "deflate": zlib.compress(BODY),
    "br": brotli.compress(BODY),
    "zstd": zstd(BODY),
}


@pytest.mark.parametrize("encoding", sorted(ENCODED))
def test_round_trip_split_every_way(encoding: str):
    """Each encoding decodes to the original body however its bytes are chunked."""
    encoded = ENCODED[encoding]
    for chunks in split_every_way(encoded, max_splits=32):
        assert decode_chunks(make_decoder(encoding), chunks) == BODY


def test_identity_passes_bytes_through():
    """No Content-Encoding, empty, or "identity" gives the identity decoder."""
    for value in (None, "", "identity", " Identity "):
        decoder = make_decoder(value)
        assert isinstance(decoder, IdentityDecoder)
        assert decoder.decode(b"abc") == b"abc"
        assert decoder.flush() == b""


def test_encoding_names_are_case_and_space_insensitive():
    """Content-Encoding tokens are compared case-insensitively, ignoring spaces."""
    assert isinstance(make_decoder(" GZip "), GzipDecoder)


def test_raw_deflate_is_detected():
    """deflate without the zlib wrapper (as some servers send) decodes too."""
    for chunks in split_every_way(raw_deflate(BODY), max_splits=16):
        assert decode_chunks(DeflateDecoder(), chunks) == BODY


def test_deflate_of_one_byte_then_end_is_an_error():
    """A deflate body cut after its first byte cannot be decoded."""
    decoder = DeflateDecoder()
    assert decoder.decode(b"\x78") == b""
    with pytest.raises(DecodingError, match="deflate"):
        decoder.flush()


def test_gzip_members_are_concatenated():
    """A gzip body of several members decodes to all of them."""
    encoded = gzip.compress(b"one ") + gzip.compress(b"two")
    for chunks in split_every_way(encoded):
        assert decode_chunks(GzipDecoder(), chunks) == b"one two"


def test_chain_decodes_in_reverse_order():
    """ "gzip, br" means gzip was applied first, so br is undone first."""
    decoder = make_decoder("gzip, br")
    assert isinstance(decoder, MultiDecoder)
    encoded = brotli.compress(gzip.compress(BODY))
    for chunks in split_every_way(encoded, max_splits=16):
        assert decode_chunks(make_decoder("gzip, br"), chunks) == BODY


def test_chain_flushes_through_later_stages():
    """Bytes an inner stage releases only at flush still pass through the stages after it."""
    decoder = MultiDecoder([DeflateDecoder(), IdentityDecoder()])
    assert decoder.decode(b"\x78") == b""
    with pytest.raises(DecodingError):
        decoder.flush()


def test_unknown_encoding_is_named():
    """An unknown Content-Encoding raises DecodingError naming it."""
    with pytest.raises(DecodingError, match="'compress'"):
        make_decoder("gzip, compress")


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_corrupt_body_is_translated(encoding: str):
    """A library's error on a corrupt body becomes DecodingError, chained to the original."""
    decoder = make_decoder(encoding)
    with pytest.raises(DecodingError, match=encoding) as caught:
        decode_chunks(decoder, [b"\x1f\x8b\x08\x00 this is not compressed at all" * 4])
    assert caught.value.__cause__ is not None
    assert isinstance(caught.value, HopmeterError)


BOMB = b"\0" * (16 * 1024 * 1024)
BOMBS = {
    "gzip": lambda: gzip.compress(BOMB, compresslevel=9),
    "deflate": lambda: zlib.compress(BOMB, 9),
    "br": lambda: brotli.compress(BOMB),
    "zstd": lambda: zstd(BOMB),
}
DECODERS = {
    "gzip": GzipDecoder,
    "deflate": DeflateDecoder,
    "br": BrotliDecoder,
    "zstd": ZstdDecoder,
}


@pytest.mark.parametrize("encoding", sorted(BOMBS))
def test_bomb_stops_at_the_cap_with_bounded_memory(encoding: str):
    """A compression bomb raises DecodedSizeError before memory grows far past the cap."""
    bomb = BOMBS[encoding]()
    assert len(bomb) < 100_000
    decoder = DECODERS[encoding](max_bytes=1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(DecodedSizeError, match=encoding):
            decoder.decode(bomb)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024
    assert isinstance(DecodedSizeError("x"), StreamLimitError)


@pytest.mark.parametrize("encoding", sorted(BOMBS))
def test_a_bombs_steps_are_each_a_bounded_piece(encoding: str):
    """However much one chunk decodes to, each step handed on is about DECODE_STEP_BYTES (a
    zstd slice of a bomb was one piece of megabytes, copied and split by the framer; brotli's
    output limit has a grain of its own, ~1.5 times the step)."""
    decoder = DECODERS[encoding](max_bytes=32 * 1024 * 1024)
    sizes = [len(piece) for piece in decoder.steps(BOMBS[encoding]())]
    assert sum(sizes) == len(BOMB) and max(sizes) <= 2 * DECODE_STEP_BYTES


def test_body_at_the_cap_is_decoded():
    """A body exactly as large as the cap decodes in full."""
    body = b"x" * 300_000
    assert decode_chunks(GzipDecoder(max_bytes=len(body)), [gzip.compress(body)]) == body


def test_zstd_window_above_rfc9659_limit_is_refused():
    """A zstd frame needing more than the 8 MB window RFC 9659 allows is a DecodingError."""
    params = zstandard.ZstdCompressionParameters(window_log=24)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    encoded = compressor.compress(b"a" * 1000) + compressor.flush()
    with pytest.raises(DecodingError, match="zstd"):
        decode_chunks(ZstdDecoder(), [encoded])


@pytest.mark.parametrize(("module", "encoding"), [("brotli", "br"), ("zstandard", "zstd")])
def test_missing_optional_package_is_named(module: str, encoding: str, monkeypatch):
    """Without brotli or zstandard installed, the error says which package to install."""
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(DecodingError, match=f"pip install.*{module}"):
        make_decoder(encoding)


def test_brotli_without_bounded_output_is_refused(monkeypatch):
    """A brotli release that cannot limit output per call is refused, naming the upgrade."""
    old = types.SimpleNamespace(Decompressor=types.SimpleNamespace, error=Exception)
    monkeypatch.setitem(sys.modules, "brotli", old)
    with pytest.raises(DecodingError, match=r"brotli>=1\.2"):
        BrotliDecoder()


def test_utf8_decoder_counts_split_sequences():
    """An emoji cut across chunks decodes whole and counts as one split sequence."""
    decoder = Utf8Decoder()
    assert decoder.decode(b"a\xf0\x9f") == "a"
    assert decoder.decode(b"\x98\x80b") == "😀b"
    assert decoder.flush() == ""
    assert (decoder.chars, decoder.split_sequences, decoder.replacement_chars) == (3, 1, 0)


def test_utf8_decoder_separates_produced_from_literal_replacement_chars():
    """U+FFFD from invalid bytes and U+FFFD sent validly are counted apart, even when split."""
    decoder = Utf8Decoder()
    text = decoder.decode(b"\xff\xef") + decoder.decode(b"\xbf") + decoder.decode(b"\xbdz\xe4")
    text += decoder.flush()
    assert text == "\ufffd\ufffdz\ufffd"
    assert decoder.replacement_chars == 2
    assert decoder.literal_replacement_chars == 1
    assert decoder.split_sequences == 3


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(
        st.one_of(
            st.binary(max_size=6),
            st.sampled_from(["😀", "你好", "\ufffd", "é"]).map(str.encode),
        ),
        max_size=12,
    ).map(b"".join),
    cuts=st.lists(st.integers(0, 80), max_size=6),
)
def test_utf8_decoder_matches_one_shot_decoding(data: bytes, cuts: list[int]):
    """However the bytes are chunked, text and counts equal decoding them in one go."""
    decoder = Utf8Decoder()
    text = "".join(decoder.decode(chunk) for chunk in split_at(data, cuts))
    text += decoder.flush()
    expected = data.decode("utf-8", "replace")
    assert text == expected
    assert decoder.chars == len(expected)
    assert decoder.literal_replacement_chars == data.count(b"\xef\xbf\xbd")
    assert decoder.replacement_chars == expected.count("\ufffd") - data.count(b"\xef\xbf\xbd")


def test_decode_payload():
    """decode_payload reports produced U+FFFD and a trailing incomplete sequence."""
    assert decode_payload(b"ok") == ("ok", 0, False)
    assert decode_payload("é€😀".encode()) == ("é€😀", 0, False)
    assert decode_payload(b"\xef\xbf\xbd") == ("\ufffd", 0, False)
    assert decode_payload(b"a\xf0\x9f\x98") == ("a\ufffd", 1, True)
    assert decode_payload(b"\xe2\x82") == ("\ufffd", 1, True)
    assert decode_payload(b"\x80\xff") == ("\ufffd\ufffd", 2, False)


def test_steps_hand_out_a_bomb_one_bounded_piece_at_a_time() -> None:
    """steps() yields at most one 64 KiB step per item and joins to what decode() gives."""
    import gzip as gz

    from hopmeter.core.decoding import make_decoder

    body = gz.compress(b"\0" * (1024 * 1024))
    pieces = list(make_decoder("gzip").steps(body))
    assert len(pieces) >= 16
    assert max(map(len, pieces)) <= 64 * 1024
    assert b"".join(pieces) == make_decoder("gzip").decode(body) == b"\0" * (1024 * 1024)
