"""SseDecoder: WHATWG HTML §9.2.6 event-stream parsing, on literal bytes and times."""

from __future__ import annotations

import functools
import re
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopmeter.core.frames import Frame
from hopmeter.core.sse import DATA_LINE_COST, MAX_EVENT_BYTES, MAX_LINE_BYTES, SseDecoder
from hopmeter.errors import HopmeterError
from hopmeter.testing import feed_all, split_at, split_every_way
from tests.harness.corpus import CORPUS


def parse(data: bytes) -> tuple[list[Frame], SseDecoder]:
    decoder = SseDecoder()
    return feed_all(decoder, [data], [1.0, 2.0]), decoder


def frame(data: str, wire_bytes: int, **fields: object) -> Frame:
    values: dict[str, object] = {
        "t_s": 1.0,
        "kind": "message",
        "data": data,
        "wire_bytes": wire_bytes,
        "data_bytes": len(data.encode()),
    }
    values.update(fields)
    return Frame(**values)  # type: ignore[arg-type]


def test_lf_event():
    """A data line and a blank line, LF-terminated, dispatch one "message" event."""
    frames, decoder = parse(b"data: hello\n\n")
    assert frames == [frame("hello", 13)]
    assert decoder.line_endings == {"lf": 2, "crlf": 0, "cr": 0}
    assert decoder.unterminated_bytes == 0


def test_crlf_and_cr_endings():
    """CRLF and bare CR end lines like LF does, and each kind is counted."""
    frames, decoder = parse(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n")
    assert [f.data for f in frames] == ["a", "b", "c"]
    assert [f.wire_bytes for f in frames] == [11, 9, 9]
    assert decoder.line_endings == {"lf": 2, "crlf": 2, "cr": 2}


def test_cr_at_chunk_end_then_lf_is_one_line_end():
    """A CR ending one chunk and an LF starting the next are one CRLF, not an extra blank line."""
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r", 1.0) == []
    assert decoder.feed(b"\ndata: b\r\n\r\n", 2.0) == [frame("a\nb", 20, t_s=2.0)]
    assert decoder.line_endings == {"lf": 0, "crlf": 3, "cr": 0}


def test_cr_at_chunk_end_then_other_byte_is_a_cr():
    """A CR ending a chunk counts as "cr" once the next chunk starts with something else."""
    decoder = SseDecoder()
    decoder.feed(b"data: a\r", 1.0)
    assert decoder.line_endings["cr"] == 0
    assert decoder.feed(b"\rx", 2.0) == [frame("a", 9, t_s=2.0)]
    assert decoder.line_endings == {"lf": 0, "crlf": 0, "cr": 2}


def test_blank_line_ending_in_cr_dispatches_without_waiting():
    """An event ended by a CR at the end of a chunk is dispatched with that chunk's time."""
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r\n\r", 1.0) == [frame("a", 10)]
    assert decoder.feed(b"\n", 2.0) == []
    decoder.close(3.0)
    assert decoder.line_endings == {"lf": 0, "crlf": 2, "cr": 0}
    assert decoder.trailing_bytes == 1  # the LF came after the frame was dispatched
    assert decoder.unterminated_bytes == 0


def test_cr_then_close_ends_the_line():
    """A CR followed by close() is a complete "cr" line ending."""
    decoder = SseDecoder()
    assert feed_all(decoder, [b"data: a\r\r"]) == [frame("a", 9, t_s=0.0)]
    assert decoder.line_endings == {"lf": 0, "crlf": 0, "cr": 2}


def test_time_is_that_of_the_completing_feed():
    """An event carries the `now` of the feed whose bytes completed it."""
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\n", 1.0) == []
    assert decoder.feed(b"\n", 2.5) == [frame("a", 9, t_s=2.5)]


def test_leading_bom_is_stripped_and_counted_in_wire_bytes():
    """One UTF-8 BOM at the stream's start is ignored; its bytes belong to the first frame."""
    frames, decoder = parse(b"\xef\xbb\xbfdata: a\n\n")
    assert frames == [frame("a", 12)]
    assert decoder.bom is True


def test_bom_split_across_chunks_is_stripped():
    """A BOM fed one byte per chunk is still recognised and stripped."""
    decoder = SseDecoder()
    frames = feed_all(decoder, [b"\xef", b"\xbb", b"\xbf", b"data: a\n\n"], [1.0] * 5)
    assert frames == [frame("a", 12)]
    assert decoder.bom is True


def test_only_one_bom_is_stripped():
    """A second BOM stays, so "\\ufeffdata" is an unknown field and nothing is dispatched."""
    frames, decoder = parse(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n")
    assert frames == []
    assert decoder.bom is True


def test_bom_after_stream_start_is_not_stripped():
    """A BOM later in the stream is part of a field name, not skipped."""
    frames, decoder = parse(b"data: a\n\n\xef\xbb\xbfdata: b\n\n")
    assert [f.data for f in frames] == ["a"]
    assert decoder.bom is False


def test_bom_prefix_that_is_not_a_bom_is_kept():
    """Bytes that start like a BOM but are not one stay in the first line."""
    decoder = SseDecoder()
    frames = feed_all(decoder, [b"\xef\xbb", b":\n", b"data: a\n\n"], [1.0] * 4)
    assert frames == [frame("a", 13)]
    assert decoder.bom is False
    assert decoder.comments == 0


def test_comments_are_counted_and_ignored():
    """Lines starting with ":" are comments: counted, not dispatched, wire bytes of the next."""
    frames, decoder = parse(b": keep-alive\n\ndata: a\n:x\n\n")
    assert frames == [frame("a", 26)]
    assert decoder.comments == 2


def test_field_without_colon_has_empty_value():
    """A line "data" is the data field with an empty value, so an empty event is dispatched."""
    assert parse(b"data\n\n")[0] == [frame("", 6)]


def test_only_one_leading_space_is_removed():
    """One space after the colon is removed; a second one stays, and none is required."""
    frames, _ = parse(b"data:  two\n\ndata:none\n\n")
    assert [f.data for f in frames] == [" two", "none"]


def test_colon_in_value_is_kept():
    """Only the first colon separates name and value."""
    assert parse(b"data: a:b\n\n")[0][0].data == "a:b"


def test_data_lines_are_joined_with_lf():
    """Several data lines make one event whose data joins them with LF."""
    assert parse(b"data: a\ndata:\ndata: b\n\n")[0] == [frame("a\n\nb", 23)]


def test_event_type_names_the_frame_and_is_reset():
    """The event field sets the kind of the next event only."""
    frames, _ = parse(b"event: ping\ndata: x\n\ndata: y\n\n")
    assert [(f.kind, f.data) for f in frames] == [("ping", "x"), ("message", "y")]


def test_event_without_data_is_not_dispatched():
    """A block with no data field dispatches nothing and its event type does not leak."""
    frames, decoder = parse(b"event: ping\n\ndata: x\n\n")
    assert frames == [frame("x", 22)]
    assert decoder.unterminated_bytes == 0


def test_last_event_id_persists_and_nul_ids_are_ignored():
    """The id field sets the last event ID for this and later events; an id with NUL is ignored."""
    stream = b"id: 7\ndata: a\n\ndata: b\n\nid: 8\x00\ndata: c\n\nid\ndata: d\n\n"
    frames, decoder = parse(stream)
    assert [f.last_event_id for f in frames] == ["7", "7", "7", ""]
    assert decoder.last_event_id == ""


def test_retry_accepts_ascii_digits_only():
    """retry sets the reconnection time only when its value is ASCII digits."""
    stream = b"retry: 1500\ndata: a\n\n" + b"".join(
        b"retry: " + bad + b"\ndata: b\n\n"
        for bad in (b"15a", b"-1", b"", b" 2", b"1.5", "١٢".encode())
    )
    frames, decoder = parse(stream)
    assert [f.retry_ms for f in frames] == [1500] * 7
    assert decoder.retry_ms == 1500


def test_unknown_and_miscased_fields_are_ignored():
    """Fields other than event, data, id and retry (names are case-sensitive) are ignored."""
    frames, _ = parse(b"foo: bar\nData: x\ndata: y\n\n")
    assert frames == [frame("y", 26)]


def test_unterminated_event_is_not_dispatched_but_measured():
    """An event with no blank line before close() is dropped and its bytes reported."""
    frames, decoder = parse(b"data: a\n\ndata: b\n")
    assert frames == [frame("a", 9)]
    assert decoder.unterminated_bytes == 8
    assert decoder.trailing_bytes == 8


def test_unterminated_partial_line_is_measured():
    """A final line without a line end counts in unterminated_bytes too."""
    _, decoder = parse(b"data: a\n\ndata: b")
    assert decoder.unterminated_bytes == 7


def test_trailing_block_without_data_is_trailing_not_unterminated():
    """A terminated block with no data is not unterminated, yet no frame accounts for it."""
    _, decoder = parse(b"data: a\n\nevent: x\n\n")
    assert (decoder.unterminated_bytes, decoder.trailing_bytes) == (0, 10)


def test_half_an_emoji_per_event_is_flagged():
    """Data ending inside a UTF-8 sequence is flagged, and its U+FFFD counted as produced."""
    frames, _ = parse(b"data: \xf0\x9f\n\ndata: \x98\x80\n\n")
    assert frames == [
        frame("\ufffd", 10, data_bytes=2, incomplete_utf8=True, replacement_chars=1),
        frame("\ufffd\ufffd", 10, data_bytes=2, replacement_chars=2),
    ]


def test_literal_replacement_char_is_not_counted():
    """A validly encoded U+FFFD is data, not a decoding error."""
    assert parse(b"data: \xef\xbf\xbd\xff\n\n")[0] == [
        frame("\ufffd\ufffd", 12, data_bytes=4, replacement_chars=1)
    ]


def test_whole_emoji_is_not_flagged():
    """Complete multi-byte characters decode cleanly."""
    assert parse("data: 你好😀\n\n".encode())[0] == [frame("你好😀", 18)]


def test_overlong_line_is_dropped_and_counted():
    """A line longer than MAX_LINE_BYTES is discarded, counted, and the stream goes on."""
    long_line = b"data: " + b"x" * MAX_LINE_BYTES
    chunks = [long_line[i : i + 65536] for i in range(0, len(long_line), 65536)]
    decoder = SseDecoder()
    frames = feed_all(decoder, [*chunks, b"\ndata: ok\n\n"], None)
    assert [f.data for f in frames] == ["ok"]
    assert frames[0].wire_bytes == len(long_line) + 11
    assert decoder.overflows == 1


def test_overlong_line_in_one_chunk_is_dropped_too():
    """A line over the limit is dropped even when it arrives whole, so chunking does not matter."""
    frames, decoder = parse(b"data: " + b"x" * MAX_LINE_BYTES + b"\ndata: ok\n\n")
    assert [f.data for f in frames] == ["ok"]
    assert decoder.overflows == 1


def test_line_at_the_limit_is_kept():
    """A line of exactly MAX_LINE_BYTES is parsed."""
    frames, decoder = parse(b"data: " + b"x" * (MAX_LINE_BYTES - 6) + b"\n\n")
    assert frames[0].data_bytes == MAX_LINE_BYTES - 6
    assert decoder.overflows == 0


def test_line_without_end_is_not_buffered():
    """10 MB with no line end, in one chunk or in many, leaves no buffer behind."""
    tracemalloc.start()
    try:
        decoder = SseDecoder()
        decoder.feed(b"data: " + b"y" * 10_000_000, 1.0)
        piece = b"z" * 65536
        for _ in range(160):
            decoder.feed(piece, 1.0)
        current, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current < 1_000_000
    assert decoder.overflows == 1
    decoder.close(2.0)
    assert decoder.unterminated_bytes == 6 + 10_000_000 + 160 * 65536


def test_event_data_is_capped():
    """Data past MAX_EVENT_BYTES is dropped line by line and the event counted once."""
    line = b"data: " + b"d" * (MAX_LINE_BYTES - 6) + b"\n"
    frames, decoder = parse(line * 6 + b"\n")
    assert len(frames) == 1
    assert frames[0].data_bytes <= MAX_EVENT_BYTES
    assert frames[0].data_bytes == 3 * (MAX_LINE_BYTES - 6) + 2  # the fourth: not with its cost
    assert frames[0].wire_bytes == 6 * len(line) + 1
    assert decoder.overflows == 1


def test_many_short_data_lines_are_held_to_the_cap_with_their_cost():
    """Each held data line costs more than its bytes (its bytes object, its slot): 2-byte lines
    held ~15 times MAX_EVENT_BYTES until each line's DATA_LINE_COST counted against it."""
    decoder = SseDecoder()
    decoder.feed(b"data:xy\n" * 2_000_000, 0.0)  # one event that never ends
    held = len(decoder._data)
    assert held * (2 + DATA_LINE_COST) <= MAX_EVENT_BYTES + DATA_LINE_COST
    assert decoder.overflows == 1


def test_a_retry_field_too_long_for_a_number_is_ignored():
    """`retry:` with thousands of digits is no reconnection time (int() refuses past 4,300
    digits, an exception out of the meter): ignored, as a value that is not digits is."""
    decoder = SseDecoder()
    decoder.feed(b"retry: " + b"9" * 5000 + b"\nretry: 3000\n\n", 0.0)
    assert decoder.retry_ms == 3000


def test_feed_after_close_raises():
    """Feeding a closed decoder is a programming error."""
    decoder = SseDecoder()
    decoder.close(1.0)
    with pytest.raises(HopmeterError, match="after close"):
        decoder.feed(b"data: a\n\n", 2.0)


def test_close_is_idempotent_and_empty_feed_is_harmless():
    """close() twice returns nothing new; feeding b"" does nothing."""
    decoder = SseDecoder()
    assert decoder.feed(b"", 1.0) == []
    assert decoder.close(2.0) == []
    assert decoder.close(3.0) == []


MIXED = (
    b"\xef\xbb\xbf: hi\r\nretry: 10\r\nid: 1\r\nevent: a\r\ndata: x\r\ndata: \xe2\x82\xac\r\n\r\n"
    b"data: \xf0\x9f\r\rdata\n\ndata: y\r\n\r\ndata: half"
)


def comparable(frames: list[Frame]) -> list[Frame]:
    return [f._replace(t_s=0.0, wire_bytes=0) for f in frames]


def test_split_invariance_every_way():
    """A stream with every feature gives the same frames and byte totals however it is chunked."""
    whole, reference = parse(MIXED)
    assert len(whole) == 4
    for chunks in split_every_way(MIXED):
        decoder = SseDecoder()
        frames = feed_all(decoder, chunks)
        assert comparable(frames) == comparable(whole), chunks
        assert sum(f.wire_bytes for f in frames) + decoder.trailing_bytes == len(MIXED)
        assert decoder.unterminated_bytes == reference.unterminated_bytes == 10
        assert decoder.line_endings == reference.line_endings
        assert (decoder.bom, decoder.comments) == (True, 1)


def reference_events(stream: bytes) -> list[tuple[str, str, str, int | None]]:
    """The spec's algorithm on the decoded text, written plainly as an oracle."""
    text = stream.decode("utf-8", "replace")
    text = text.removeprefix("\ufeff")
    lines = re.split("\r\n|\r|\n", text)[:-1]  # the last piece never saw its line end
    events: list[tuple[str, str, str, int | None]] = []
    data: list[str] = []
    event_type, last_id, retry = "", "", None
    for line in lines:
        if not line:
            if data:
                events.append((event_type or "message", "\n".join(data), last_id, retry))
            data, event_type = [], ""
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value and value.isascii() and value.isdigit():
            retry = int(value)
    return events


_VALUE = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12).map(str.encode),
    st.binary(max_size=8).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.sampled_from(["😀", "你好", "é", "\ufffd", "\ufeff"]).map(str.encode),
)
_DATA_LINE = st.tuples(st.sampled_from([b"data: ", b"data:", b"data", b"data:  "]), _VALUE)
_LINE = st.one_of(
    _DATA_LINE,
    _DATA_LINE,
    _DATA_LINE,
    st.tuples(st.sampled_from([b"event: ", b"id: ", b"id:\x00", b"retry: ", b"foo: "]), _VALUE),
    st.tuples(st.just(b"retry: "), st.integers(0, 99999).map(lambda n: str(n).encode())),
    st.tuples(st.sampled_from([b":", b": ping "]), _VALUE),
).map(b"".join)
_END = st.sampled_from([b"\n", b"\r\n", b"\r"])
_BLOCK = st.tuples(
    st.lists(st.tuples(_LINE, _END).map(b"".join), min_size=1, max_size=4), _END
).map(lambda parts: b"".join(parts[0]) + parts[1])
STREAMS = st.tuples(
    st.sampled_from([b"", b"\xef\xbb\xbf", b"\xef\xbb"]),
    st.lists(_BLOCK, min_size=1, max_size=8).map(b"".join),
    st.sampled_from([b"", b"data: tail", b"data: tail\n", b"\r"]),
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(stream=STREAMS, data=st.data())
def test_split_invariance_and_spec_oracle(stream: bytes, data: st.DataObject):
    """Random streams give the oracle's events whole, byte by byte and in random chunkings."""
    expected = reference_events(stream)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    chunkings = [
        [stream],
        [stream[i : i + 1] for i in range(len(stream))],
        split_at(stream, cuts),
        split_after_events(stream),
    ]
    for chunks in chunkings:
        decoder = SseDecoder()
        frames = feed_all(decoder, chunks)
        got = [(f.kind, f.data, f.last_event_id, f.retry_ms) for f in frames]
        assert got == expected
        assert sum(f.wire_bytes for f in frames) + decoder.trailing_bytes == len(stream)
        for f in frames:
            assert 0 <= f.replacement_chars <= f.data.count("\ufffd")


def split_after_events(stream: bytes) -> list[bytes]:
    """One chunk per event, as servers write them: cut after every LF LF."""
    return split_at(stream, [m.end() for m in re.finditer(rb"\n\n", stream)])


def test_event_per_chunk_matches_byte_by_byte():
    """A chunk holding exactly one event takes the decoder's shorter path; it gives the same
    frames, wire bytes and statistics as the general one (fed byte by byte)."""
    stream = (
        b": hi\n\nevent: a\nid: 7\ndata: x\ndata: y\n\nretry: 5\ndata: \xe2\x82\n\n"
        b"data: z\n\nevent: only\n\ndata: \xe2\x82\xac\n\nfoo\ndata\n\n"
    )
    chunks = split_after_events(stream)
    assert len(chunks) == 7
    fast, slow = SseDecoder(), SseDecoder()
    got = [fast.feed(c, 1.0) for c in chunks]
    want: list[list[Frame]] = [[] for _ in chunks]
    at = 0
    for index, chunk in enumerate(chunks):
        for i in range(len(chunk)):
            want[index] += slow.feed(stream[at + i : at + i + 1], 1.0)
        at += len(chunk)
    assert got == want
    assert [len(g) for g in got] == [0, 1, 1, 1, 0, 1, 1]
    for name in ("line_endings", "comments", "overflows", "last_event_id", "retry_ms"):
        assert getattr(fast, name) == getattr(slow, name), name
    fast.close(2.0), slow.close(2.0)
    assert (fast.unterminated_bytes, fast.trailing_bytes) == (0, 0)
    assert (slow.unterminated_bytes, slow.trailing_bytes) == (0, 0)


@functools.cache
def corpus_event_counts() -> dict[str, int]:
    """ "Framing: N events" per file in SOURCES.md (events a strict parser dispatches)."""
    counts: dict[str, int] = {}
    name = ""
    for line in (CORPUS / "SOURCES.md").read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
        elif match := re.match(r"- Framing: (\d+) (events|JSON lines)", line):
            counts[name] = int(match.group(1))
    return counts


SSE_FILES = sorted(CORPUS.glob("**/*.sse"))


def test_corpus_is_present():
    """The corpus has recordings and SOURCES.md describes every one of them."""
    assert len(SSE_FILES) > 50
    counts = corpus_event_counts()
    assert {str(p.relative_to(CORPUS)) for p in SSE_FILES} <= set(counts)


@pytest.mark.parametrize("path", SSE_FILES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_event_counts(path: Path):
    """Each recording dispatches the documented number of events, however it is chunked."""
    stream = path.read_bytes()
    expected = corpus_event_counts()[str(path.relative_to(CORPUS))]
    whole, reference = parse(stream)
    assert len(whole) == expected
    assert reference.overflows == 0
    for chunks in [*split_every_way(stream, max_splits=8), split_after_events(stream)]:
        decoder = SseDecoder()
        frames = feed_all(decoder, chunks)
        assert comparable(frames) == comparable(whole)
        assert decoder.line_endings == reference.line_endings
        assert sum(f.wire_bytes for f in frames) + decoder.trailing_bytes == len(stream)
        assert decoder.unterminated_bytes == reference.unterminated_bytes


# whole plain events (most chunks), and the pieces that make a chunk anything else
_PLAIN_PIECES = st.sampled_from(
    [b'data: {"a":1}\n\n', b"data: x\n\n", b"data: \n\n", b"data: \xf0\x9f\n\n"] * 3
    + [b"data: ", b"\n", b"\r", b"\n\n", b"event: x\n", b"x", b": c\n", b"\xef\xbb\xbf"]
)


@settings(max_examples=300)
@given(st.lists(st.lists(_PLAIN_PIECES, max_size=3).map(b"".join), max_size=8))
def test_plain_data_events_read_what_feed_reads(chunks: list[bytes]):
    """Chunks read by plain_data_events where it takes them (feed where it declines) give the
    events, line ends and trailing bytes that feed gives for every chunk."""
    plain, full = SseDecoder(), SseDecoder()
    got: list[str] = []
    want: list[str] = []
    for chunk in chunks:
        values = plain.plain_data_events(chunk)
        if values is None:
            got += [f.data for f in plain.feed(chunk, 1.0)]
        else:
            plain.took_plain_events(chunk)
            got += [v.decode("utf-8", "replace") for v in values]
        want += [f.data for f in full.feed(chunk, 1.0)]
        assert got == want
        assert plain.line_endings == full.line_endings
    _ends_alike(plain, full)


@settings(max_examples=300)
@given(st.lists(st.lists(_PLAIN_PIECES, max_size=3).map(b"".join), max_size=8))
def test_plain_event_reads_what_feed_reads(chunks: list[bytes]):
    """Chunks of one event read by plain_event where it takes them (feed where it declines)
    give the events, line ends and trailing bytes that feed gives for every chunk; and what it
    takes is what plain_data_events takes as one event."""
    plain, full = SseDecoder(), SseDecoder()
    got: list[str] = []
    want: list[str] = []
    for chunk in chunks:
        value = plain.plain_event(chunk)
        values = plain.plain_data_events(chunk)
        assert value is None or values == [value]
        if value is None:
            got += [f.data for f in plain.feed(chunk, 1.0)]
        else:
            plain.took_plain_event(chunk)
            got += [value.decode("utf-8", "replace")]
        want += [f.data for f in full.feed(chunk, 1.0)]
        assert got == want
        assert plain.line_endings == full.line_endings
    _ends_alike(plain, full)


def _ends_alike(plain: SseDecoder, full: SseDecoder) -> None:
    """Both decoders closed: the same unterminated and trailing bytes."""
    plain.close(2.0)
    full.close(2.0)
    assert (plain.unterminated_bytes, plain.trailing_bytes) == (
        full.unterminated_bytes,
        full.trailing_bytes,
    )
