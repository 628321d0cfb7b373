"""Newline-delimited JSON framing (Ollama, `application/x-ndjson`): one frame per non-blank line.

Sans-I/O like `sse`: `feed(data, now)` returns the lines the bytes completed, `close(now)` the last
line if the body ended without a newline (Ollama sometimes omits it). Lines end at LF only, as the
NDJSON and JSON Lines conventions say; a CR before the LF is stripped and counted as "crlf".
The JSON itself is not parsed here.
"""

from __future__ import annotations

from hopmeter.core.decoding import decode_payload
from hopmeter.core.frames import Frame
from hopmeter.errors import HopmeterError

# A line longer than this is dropped (not buffered) up to its end and counted in `overflows`.
# Ollama's longest lines are the final ones of /api/generate carrying the `context` token ids
# (about 7 bytes per id: ~900 KB for a 128k context), hence 4 MiB rather than SSE's 1 MiB line.
MAX_LINE_BYTES = 4 * 1024 * 1024

_BLANK = b" \t\r"  # JSON whitespace other than LF: a line of only these is no record


class NdjsonDecoder:
    """Incremental NDJSON framer producing one `Frame` (kind "ndjson") per non-blank line.

    Blank lines produce nothing; their bytes count in the next frame's `wire_bytes`. After
    `close()`, `unterminated_bytes` is the length of a final line that had no newline (0 if the
    body ended with one) and `trailing_bytes` the bytes no frame accounts for, so
    `sum(f.wire_bytes for f in frames) + trailing_bytes == bytes fed`.
    """

    def __init__(self) -> None:
        self.line_endings = {"lf": 0, "crlf": 0, "cr": 0}  # "cr" stays 0: a lone CR ends no line
        self.overflows = 0
        self.unterminated_bytes = 0
        self.trailing_bytes = 0
        self._fed = 0
        self._frame_start = 0
        self._line_start = 0  # just after the last LF
        self._partial = bytearray()
        self._discarding = False
        self._closed = False

    def feed(self, data: bytes, now: float) -> list[Frame]:
        """Take the next bytes of the body; return the lines they complete, stamped `now`."""
        if self._closed:
            raise HopmeterError("NdjsonDecoder.feed() called after close()")
        self._fed += len(data)
        first = data.find(b"\n")
        if first < 0:
            self._extend_partial(data)
            return []
        if first == len(data) - 1 and not self._partial and not self._discarding:
            # exactly one whole line (how Ollama writes nearly every chunk)
            self._line_start = self._fed
            if first and data[first - 1] == 0x0D:
                self.line_endings["crlf"] += 1
                line = data[: first - 1]
            else:
                self.line_endings["lf"] += 1
                line = data[:first]
            if first > MAX_LINE_BYTES:
                self.overflows += 1
                return []
            frame = self._frame(line, self._fed, now)
            return [] if frame is None else [frame]
        drop_first = self._discarding
        self._discarding = False
        buf = bytes(self._partial) + data if self._partial else data
        self._partial.clear()
        lines = buf.split(b"\n")
        tail = lines.pop()
        # every line end counted at once: a CR before an LF makes it "crlf" (the tail has no LF)
        crlfs = buf.count(b"\r\n")
        self.line_endings["crlf"] += crlfs
        self.line_endings["lf"] += len(lines) - crlfs
        frames: list[Frame] = []
        end = self._fed - len(buf)
        for index, line in enumerate(lines):
            end += len(line) + 1
            crlf = line[-1:] == b"\r"
            if index == 0 and drop_first:
                continue  # the end of a line that already overflowed
            if len(line) > MAX_LINE_BYTES:
                self.overflows += 1
                continue
            frame = self._frame(line[:-1] if crlf else line, end, now)
            if frame is not None:
                frames.append(frame)
        self._line_start = end
        if tail:
            self._extend_partial(tail)
        return frames

    def close(self, now: float) -> list[Frame]:
        """End of the body: a final line without a newline is still a record; return its frame."""
        if self._closed:
            return []
        self._closed = True
        frames: list[Frame] = []
        self.unterminated_bytes = self._fed - self._line_start
        if self._partial:
            frame = self._frame(bytes(self._partial), self._fed, now)
            if frame is not None:
                frames.append(frame)
        self._partial = bytearray()
        self.trailing_bytes = self._fed - self._frame_start
        return frames

    def _extend_partial(self, data: bytes) -> None:
        if self._discarding:
            return
        self._partial += data
        if len(self._partial) > MAX_LINE_BYTES:
            self.overflows += 1
            self._discarding = True
            self._partial = bytearray()  # release the memory, not just the length

    def _frame(self, line: bytes, end: int, now: float) -> Frame | None:
        if not line.strip(_BLANK):
            return None
        text, produced, incomplete = decode_payload(line)
        wire_bytes = end - self._frame_start
        self._frame_start = end
        return Frame(
            t_s=now,
            kind="ndjson",
            data=text,
            wire_bytes=wire_bytes,
            data_bytes=len(line),
            incomplete_utf8=incomplete,
            replacement_chars=produced,
        )
