"""Frame, the unit every framer dispatches: its fields, its fast builder, its byte accounting."""

from __future__ import annotations

import pytest

from hopmeter.core.frames import Frame, new_frame
from hopmeter.core.ndjson import NdjsonDecoder
from hopmeter.core.sse import SseDecoder


def test_new_frame_is_the_keyword_frame() -> None:
    """The positional builder of the per-event path gives the Frame the keywords give."""
    built = new_frame(1.5, "message", "x", 9, 1, "7", 30, True, 2)
    assert built == Frame(
        t_s=1.5,
        kind="message",
        data="x",
        wire_bytes=9,
        data_bytes=1,
        last_event_id="7",
        retry_ms=30,
        incomplete_utf8=True,
        replacement_chars=2,
    )
    assert type(built) is Frame
    assert (built.retry_ms, built.replacement_chars) == (30, 2)
    assert len(Frame._fields) == 9  # new_frame lists every field: update it with Frame


def test_a_frame_from_the_required_fields_is_clean() -> None:
    """Without the optional fields a frame has no id, no retry and whole, valid UTF-8."""
    frame = Frame(t_s=0.25, kind="ndjson", data="{}", wire_bytes=3, data_bytes=2)
    assert frame.last_event_id == ""
    assert frame.retry_ms is None
    assert frame.incomplete_utf8 is False
    assert frame.replacement_chars == 0


def test_a_frame_cannot_be_changed_in_place() -> None:
    """A dispatched frame is immutable: a changed copy is a new frame, the original stays."""
    frame = Frame(t_s=0.25, kind="message", data="a", wire_bytes=9, data_bytes=1)
    with pytest.raises(AttributeError):
        frame.data = "b"  # type: ignore[misc]
    assert frame._replace(data="b").data == "b"
    assert frame.data == "a"


@pytest.mark.parametrize(
    ("decoder", "chunks", "expected", "unframed"),
    [
        (
            SseDecoder,
            [b"data: a\n\ndata: ", b"bc\n\n: note\n", b"\ndata: tail"],
            [("a", 1.0), ("bc", 2.0)],
            len(b": note\n\ndata: tail"),  # a comment, an empty event, an unfinished one
        ),
        (
            NdjsonDecoder,
            [b'{"a":1}\n\n{"b"', b':2}\r\n{"c":3}\n', b'{"d"'],
            [('{"a":1}', 1.0), ('{"b":2}', 2.0), ('{"c":3}', 2.0), ('{"d"', 4.0)],
            0,  # the last line, unterminated, is completed by close()
        ),
    ],
)
def test_frames_stamp_the_completing_bytes_and_account_for_every_byte(
    decoder: type[SseDecoder] | type[NdjsonDecoder],
    chunks: list[bytes],
    expected: list[tuple[str, float]],
    unframed: int,
) -> None:
    """Each framer stamps a frame with the `now` of the bytes that completed it, and the frames'
    wire bytes plus the unframed tail add up to the body."""
    framer = decoder()
    frames: list[Frame] = []
    for t_s, chunk in zip((1.0, 2.0, 3.0), chunks, strict=True):
        frames += framer.feed(chunk, t_s)
    frames += framer.close(4.0)
    assert [(f.data, f.t_s) for f in frames] == expected
    assert framer.trailing_bytes == unframed
    assert sum(f.wire_bytes for f in frames) + unframed == sum(map(len, chunks))
    assert [f.data_bytes for f in frames] == [len(f.data.encode()) for f in frames]
