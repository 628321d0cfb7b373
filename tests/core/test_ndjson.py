"""NdjsonDecoder: one frame per non-blank LF-terminated line, on literal bytes and times."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopmeter.core.frames import Frame
from hopmeter.core.ndjson import MAX_LINE_BYTES, NdjsonDecoder
from hopmeter.errors import HopmeterError
from hopmeter.testing import feed_all, split_at, split_every_way
from tests.harness.corpus import CORPUS

SOURCES = (CORPUS / "SOURCES.md").read_text()


def parse(data: bytes) -> tuple[list[Frame], NdjsonDecoder]:
    decoder = NdjsonDecoder()
    return feed_all(decoder, [data], [1.0, 2.0]), decoder


def frame(data: str, wire_bytes: int, **fields: object) -> Frame:
    values: dict[str, object] = {
        "t_s": 1.0,
        "kind": "ndjson",
        "data": data,
        "wire_bytes": wire_bytes,
        "data_bytes": len(data.encode()),
    }
    values.update(fields)
    return Frame(**values)  # type: ignore[arg-type]


def test_one_frame_per_line():
    """Every LF-terminated line is one "ndjson" frame stamped with the completing feed's time."""
    decoder = NdjsonDecoder()
    assert decoder.feed(b'{"a":1}\n{"b"', 1.0) == [frame('{"a":1}', 8)]
    assert decoder.feed(b":2}\n", 2.0) == [frame('{"b":2}', 8, t_s=2.0)]
    assert decoder.close(3.0) == []
    assert decoder.line_endings == {"lf": 2, "crlf": 0, "cr": 0}
    assert (decoder.unterminated_bytes, decoder.trailing_bytes) == (0, 0)


def test_crlf_is_stripped_and_counted():
    """A CR before the LF is not part of the line and counts as a "crlf" ending."""
    frames, decoder = parse(b"{}\r\n[]\n")
    assert frames == [frame("{}", 4), frame("[]", 3)]
    assert decoder.line_endings == {"lf": 1, "crlf": 1, "cr": 0}


def test_lone_cr_does_not_end_a_line():
    """Only LF ends an NDJSON line; a CR elsewhere stays in the data."""
    assert parse(b"1\r2\n")[0] == [frame("1\r2", 4)]


def test_crlf_split_across_chunks():
    """A CRLF cut between CR and LF is still stripped."""
    decoder = NdjsonDecoder()
    assert feed_all(decoder, [b"{}\r", b"\n"], [1.0, 2.0, 3.0]) == [frame("{}", 4, t_s=2.0)]
    assert decoder.line_endings["crlf"] == 1


def test_blank_lines_are_skipped_into_the_next_frame():
    """Blank and whitespace-only lines make no frame; their bytes count for the next one."""
    frames, decoder = parse(b"\n \t\r\n{}\n\n")
    assert frames == [frame("{}", 8)]
    assert decoder.trailing_bytes == 1
    assert decoder.unterminated_bytes == 0


def test_final_line_without_newline_is_dispatched_at_close():
    """A last line with no newline (as Ollama sometimes sends) is a frame at close time."""
    decoder = NdjsonDecoder()
    assert decoder.feed(b'{"a":1}\n{"done":true}', 1.0) == [frame('{"a":1}', 8)]
    assert decoder.close(2.0) == [frame('{"done":true}', 13, t_s=2.0)]
    assert (decoder.unterminated_bytes, decoder.trailing_bytes) == (13, 0)


def test_final_blank_fragment_is_not_dispatched():
    """Whitespace after the last newline is no record, though it is unterminated."""
    frames, decoder = parse(b"{}\n  ")
    assert frames == [frame("{}", 3)]
    assert (decoder.unterminated_bytes, decoder.trailing_bytes) == (2, 2)


def test_utf8_problems_are_reported():
    """Invalid bytes and a line ending mid-sequence are counted like in SSE data."""
    frames, _ = parse(b'"\xff\xef\xbf\xbd"\n"\xe4\xbd"\n')
    assert frames == [
        frame('"\ufffd\ufffd"', 7, data_bytes=6, replacement_chars=1),
        frame('"\ufffd"', 5, data_bytes=4, replacement_chars=1),
    ]
    assert parse(b'"\xe4\xbd')[0][0].incomplete_utf8 is True


def test_overlong_line_is_dropped_and_counted():
    """A line over MAX_LINE_BYTES is discarded without buffering and the stream goes on."""
    tracemalloc.start()
    try:
        decoder = NdjsonDecoder()
        piece = b"x" * 65536
        for _ in range(MAX_LINE_BYTES // 65536 + 2):
            decoder.feed(piece, 1.0)
        current, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current < 1_000_000
    assert decoder.feed(b"\n{}\n", 2.0) == [frame("{}", MAX_LINE_BYTES + 2 * 65536 + 4, t_s=2.0)]
    assert decoder.overflows == 1


def test_overlong_line_in_one_chunk_and_unterminated():
    """An overlong line is dropped whole too, and an overlong last line is not dispatched."""
    frames, decoder = parse(b"y" * (MAX_LINE_BYTES + 1) + b"\n1\n" + b"z" * (MAX_LINE_BYTES + 1))
    assert [f.data for f in frames] == ["1"]
    assert decoder.overflows == 2
    assert decoder.unterminated_bytes == MAX_LINE_BYTES + 1


def test_feed_after_close_raises():
    """Feeding a closed decoder is a programming error."""
    decoder = NdjsonDecoder()
    decoder.close(1.0)
    with pytest.raises(HopmeterError, match="after close"):
        decoder.feed(b"{}\n", 2.0)


LINES = st.lists(
    st.tuples(
        st.one_of(
            st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=10),
            st.sampled_from(["", " ", "\t\r", '{"content":"😀"}', "你好"]),
        ).map(str.encode),
        st.sampled_from([b"\n", b"\r\n"]),
    ).map(b"".join),
    max_size=8,
)
STREAMS = st.tuples(LINES.map(b"".join), st.sampled_from([b"", b"{}", b" ", b"\r"])).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(stream=STREAMS, data=st.data())
def test_split_invariance(stream: bytes, data: st.DataObject):
    """Random NDJSON gives the same frames whole, byte by byte and in random chunkings."""
    lines = stream.split(b"\n")
    expected = [
        (line[:-1] if line.endswith(b"\r") and i < len(lines) - 1 else line).decode(
            "utf-8", "replace"
        )
        for i, line in enumerate(lines)
    ]
    expected = [text for text in expected if text.strip(" \t\r")]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    chunkings = [[stream], [stream[i : i + 1] for i in range(len(stream))], split_at(stream, cuts)]
    reference = None
    for chunks in chunkings:
        decoder = NdjsonDecoder()
        frames = feed_all(decoder, chunks)
        assert [f.data for f in frames] == expected
        assert sum(f.wire_bytes for f in frames) + decoder.trailing_bytes == len(stream)
        if reference is None:
            reference = frames
        assert [f._replace(t_s=0.0) for f in frames] == [f._replace(t_s=0.0) for f in reference]


NDJSON_FILES = sorted(CORPUS.glob("**/*.ndjson"))


@pytest.mark.parametrize("path", NDJSON_FILES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_line_counts(path: Path):
    """Each Ollama recording gives one frame per JSON line, the last one done, however chunked."""
    stream = path.read_bytes()
    whole, reference = parse(stream)
    name = re.escape(str(path.relative_to(CORPUS)))
    documented = re.search(rf"## {name}\n(?:- .*\n)*?- Framing: (\d+) JSON lines", SOURCES)
    assert documented is not None
    assert len(whole) == int(documented.group(1)) == stream.rstrip(b"\n").count(b"\n") + 1
    assert all(f.data.startswith("{") and f.data.endswith("}") for f in whole)
    assert '"done":true' in whole[-1].data
    assert reference.unterminated_bytes == (0 if stream.endswith(b"\n") else len(whole[-1].data))
    for chunks in split_every_way(stream, max_splits=8):
        frames = feed_all(NdjsonDecoder(), chunks)
        assert [f._replace(t_s=0.0) for f in frames] == [f._replace(t_s=0.0) for f in whole]
