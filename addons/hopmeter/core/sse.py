"""Server-Sent Events framing, to the letter of WHATWG HTML §9.2.6 "Interpreting an event stream".

Sans-I/O: `feed(data, now)` returns the events the bytes completed, `close(now)` ends the stream.

The spec decodes the stream as UTF-8 and then splits lines. This parser splits lines on bytes and
decodes each field value with errors="replace", which is equivalent: CR, LF and ":" are ASCII, and
bytes below 0x80 never occur inside a UTF-8 multi-byte sequence, so they are found at the same
places either way; a line end interrupts any unfinished sequence, so a decoder over the whole
stream emits the same U+FFFD there that a decoder over the value alone emits at its end.
"""

from __future__ import annotations

import re

from hopmeter.core.decoding import decode_payload
from hopmeter.core.frames import Frame, new_frame
from hopmeter.errors import HopmeterError

# A line longer than this is dropped (not buffered) up to its end and counted in `overflows`.
# The longest line in the recorded corpus is ~35 KB (an Anthropic web-search result); 1 MiB is
# 30 times that and keeps a hostile or broken stream (no line end at all) from growing a buffer.
MAX_LINE_BYTES = 1024 * 1024
# An event whose data would grow past this (its bytes, and DATA_LINE_COST per held line) keeps
# the data lines that fit; the rest are dropped and the event counts once in `overflows`. Three
# maximal lines and most of a fourth, far above any token event.
MAX_EVENT_BYTES = 4 * 1024 * 1024
# What one held data line costs beyond its bytes (the bytes object and its slot in the buffer),
# charged against MAX_EVENT_BYTES: 2-byte lines would otherwise hold ~15 times the bound.
DATA_LINE_COST = 48
# A `retry:` value longer than this is no reconnection time (and int() refuses past 4,300 digits).
MAX_RETRY_DIGITS = 15

# A chunk up to this size that holds exactly one whole event takes a shorter path (`_whole_event`).
_WHOLE_EVENT_MAX = 64 * 1024
_BOM = b"\xef\xbb\xbf"  # U+FEFF encoded as UTF-8; the spec ignores one at the stream's start
_EOL = re.compile(rb"(\r\n|\r|\n)")  # "CRLF, a single LF, or a single CR" (spec, line parsing)
_ENDING_NAMES = {b"\n": "lf", b"\r\n": "crlf", b"\r": "cr"}


class SseDecoder:
    """Incremental `text/event-stream` parser producing one `Frame` per dispatched event.

    Statistics (`line_endings`, `comments`, `bom`, `overflows`) are plain attributes. After
    `close()`, `unterminated_bytes` is the length of the tail after the last blank line (an event
    the stream never finished, which the spec discards) and `trailing_bytes` the bytes no frame
    accounts for, so `sum(f.wire_bytes for f in frames) + trailing_bytes == bytes fed`.
    """

    def __init__(self) -> None:
        self.line_endings = {"lf": 0, "crlf": 0, "cr": 0}
        self.comments = 0
        self.bom = False
        self.overflows = 0
        self.last_event_id = ""  # the spec's "last event ID buffer": persists across events
        self.retry_ms: int | None = (
            None  # the stream's reconnection time, once a retry field set it
        )
        self.unterminated_bytes = 0
        self.trailing_bytes = 0
        self._fed = 0  # bytes fed so far; every position below is an offset in the whole stream
        self._frame_start = 0  # where the bytes of the next frame begin
        self._event_start = 0  # just after the last blank line
        self._started = False  # past the place a BOM could be
        self._head = b""  # a possible BOM's first bytes, while it may still be one
        self._partial = bytearray()  # the current line, while its end has not arrived
        self._discarding = False  # the current line overflowed: drop bytes up to its end
        self._cr_pending = False  # the last chunk ended with CR: a leading LF belongs to it
        self._closed = False
        self._data: list[bytes] = []  # the spec's data buffer, one entry per data line
        self._data_size = 0
        self._data_overflowed = False
        self._event_type = b""
        # the chunk `plain_data_events` last accepted and its line ends, for `took_plain_events`
        self._plain_ends: tuple[bytes, int] | None = None
        # True from a chunk `took_plain_events` took until the next `feed` or `close`: nothing is
        # pending (as `_idle` finds), without its seven tests on every plain chunk
        self._plain_idle = False

    def feed(self, data: bytes, now: float) -> list[Frame]:
        """Take the next bytes of the body; return the events they complete, stamped `now`."""
        if self._closed:
            raise HopmeterError("SseDecoder.feed() called after close()")
        self._plain_idle = False
        self._fed += len(data)
        if not self._started:
            data = self._strip_bom(data)
        if data and self._cr_pending:
            self._cr_pending = False
            if data[0] == 0x0A:  # the LF of a CRLF split across chunks: not a blank line
                self.line_endings["crlf"] += 1
                if self._event_start == self._fed - len(data):
                    self._event_start += 1  # the LF ends the blank line dispatched at its CR
                data = data[1:]
            else:
                self.line_endings["cr"] += 1
        if not data:
            return []
        # one scan for each line end: where the first LF is, and whether there is a CR (find(),
        # not `in`: bytes.__contains__ tries its operand as an int first and clears the
        # TypeError, ~2,600 instructions a test)
        first = data.find(b"\n")
        cr = data.find(b"\r") >= 0
        if first < 0 and not cr:
            self._extend_partial(data)
            return []
        last = len(data) - 2
        if (
            first > 0  # not a blank line first: a line end was the last thing fed
            and not cr
            and data[-1] == 0x0A
            and not self._partial
            and not self._discarding
            and len(data) <= _WHOLE_EVENT_MAX
        ):
            if first == last:  # one line and the blank line (the usual chunk)
                return self._whole_event(data, now, 2)
            if data.find(b"\n\n", first) == last:  # the first blank line is the last line
                return self._whole_event(data, now, 0)
        drop_first = self._discarding
        self._discarding = False
        buf = bytes(self._partial) + data if self._partial else data
        self._partial.clear()
        return self._lines(buf, drop_first, now, cr)

    def plain_data_events(self, data: bytes, event: bytes = b"") -> list[bytes] | None:
        """The data values when `data` is exactly whole events of one `data: <value>` line each,
        every one ended by a blank line (LF only), and nothing is pending; else None. With
        `event`, each event must also start with the line `event: <event>`. Changes nothing: a
        caller that reads the values itself then calls `took_plain_events` instead of
        `feed(data)`.

        The shape LLM servers write nearly every token event in (one per chunk, several when reads
        coalesce), read without building Frames: OpenAI-style chat chunks, and Anthropic's
        `content_block_delta` events (`FlowMeter._pick_plain_path`).
        """
        self._plain_ends = None
        if not event:
            raw = self.plain_event(data)
            if raw is not None:
                self._plain_ends = (data, 2)
                return [raw]
        head = b"event: " + event + b"\ndata: " if event else b"data: "
        if (
            not data.startswith(head)
            or not data.endswith(b"\n\n")
            or not self._idle()
            or len(data) > _WHOLE_EVENT_MAX
            or data.find(b"\r") >= 0  # (not `in`: see feed)
        ):
            return None
        # an event's line ends: its head's, its data line's and the blank line's; a value with a
        # line end of its own, or an empty event, makes more
        per_event = 3 if event else 2
        n = len(head)
        if data.find(b"\n", n) == len(data) - 2:  # one event (the usual chunk): no LF in its value
            self._plain_ends = (data, per_event)
            return [data[n:-2]]
        ends = data.count(b"\n")
        events = data[:-2].split(b"\n\n")
        if ends != per_event * len(events):
            return None
        for ev in events:
            if ev[:n] != head:
                return None
        self._plain_ends = (data, ends)
        return [ev[n:] for ev in events]

    def plain_event(self, data: bytes) -> bytes | None:
        """The data value when `data` is exactly one event of one `data: <value>` line ended by a
        blank line (LF only), and nothing is pending; else None: `plain_data_events(data)` for
        the usual chunk of a chat stream, without the list. Changes nothing: a caller that reads
        the value itself then calls `took_plain_event` instead of `feed(data)`."""
        # by slices and `in` tests (an int's is a memchr; bytes.find and startswith parse their
        # arguments, ~700 instructions a call)
        raw = data[6:-2]
        if (
            data[:6] == b"data: "
            and data[-2:] == b"\n\n"
            and 10 not in raw  # no LF: one event
            and 13 not in raw  # no CR (its head and blank line have none)
            and len(data) <= _WHOLE_EVENT_MAX
            and (self._plain_idle or self._idle())
        ):
            return raw
        return None

    def took_plain_event(self, data: bytes) -> None:
        """Account for a chunk whose one event `plain_event` read, as `feed` would have: its two
        LF line ends, and its event ends where the stream now ends (nothing pending)."""
        self._fed = fed = self._fed + len(data)
        self.line_endings["lf"] += 2
        self._plain_idle = True
        self._event_start = self._frame_start = fed

    def _idle(self) -> bool:
        """Nothing is pending: past the BOM's place, no partial line, event or CR, not closed."""
        return (
            self._started
            and not self._partial
            and not self._data
            and not self._event_type
            and not self._cr_pending
            and not self._discarding
            and not self._closed
        )

    def took_plain_events(self, data: bytes) -> None:
        """Account for a chunk whose events `plain_data_events` read, as `feed` would have: its
        lines all end in LF, and its last event ends where the stream now ends."""
        self._fed += len(data)
        counted = self._plain_ends  # the line ends `plain_data_events` counted in these bytes
        self._plain_ends = None
        read = counted is not None and counted[0] is data
        ends = counted[1] if read and counted is not None else data.count(b"\n")
        self.line_endings["lf"] += ends
        self._plain_idle = read  # `plain_data_events` found nothing pending, and none is now
        self._event_start = self._frame_start = self._fed

    def close(self, now: float) -> list[Frame]:
        """End of the body: a pending CR ends its line; an unfinished event is discarded (spec)."""
        self._plain_idle = False
        if not self._closed:
            self._closed = True
            if self._cr_pending:
                self._cr_pending = False
                self.line_endings["cr"] += 1
            self.unterminated_bytes = self._fed - self._event_start
            self.trailing_bytes = self._fed - self._frame_start
            self._partial = bytearray()
            self._data = []
        return []

    def _strip_bom(self, data: bytes) -> bytes:
        data = self._head + data
        if len(data) < len(_BOM) and _BOM.startswith(data):
            self._head = data  # could still become a BOM: wait for more bytes
            return b""
        self._started = True
        self._head = b""
        if data.startswith(_BOM):
            self.bom = True
            self._event_start = len(_BOM)
            return data[len(_BOM) :]
        return data

    def _whole_event(self, data: bytes, now: float, ends: int) -> list[Frame]:
        """A chunk that is exactly one event's lines and its blank line, LF only, after a line
        end: how nearly every LLM server writes its events. The same steps as `_lines`, without
        its general bookkeeping: each line is a field (none is empty or overlong), then dispatch.
        `ends` is 2 when the caller found one line and the blank line (0: more lines).
        """
        if ends == 2 and data[:6] == b"data: " and not self._data:
            # the commonest of all: one data line; _field and _dispatch inlined
            self.line_endings["lf"] += 2
            end = self._event_start = self._fed
            raw = data[6:-2]
            text, produced, incomplete = decode_payload(raw)
            wire_bytes, self._frame_start = end - self._frame_start, end
            kind = self._event_type.decode("utf-8", "replace") if self._event_type else "message"
            self._event_type = b""
            return [
                new_frame(
                    now,
                    kind,
                    text,
                    wire_bytes,
                    len(raw),
                    self.last_event_id,
                    self.retry_ms,
                    incomplete,
                    produced,
                )
            ]
        lines = data[:-2].split(b"\n")
        self.line_endings["lf"] += len(lines) + 1
        for line in lines:
            self._field(line)
        frame = self._dispatch(self._fed, now)
        return [] if frame is None else [frame]

    def _extend_partial(self, data: bytes) -> None:
        if self._discarding:
            return
        self._partial += data
        if len(self._partial) > MAX_LINE_BYTES:
            self.overflows += 1
            self._discarding = True
            self._partial = bytearray()  # release the memory, not just the length

    def _lines(self, buf: bytes, drop_first: bool, now: float, cr: bool) -> list[Frame]:
        # Split in C (bytes.split / re.split), not byte by byte: this runs on the proxy's loop.
        # `cr`: the bytes fed hold a CR (a pending partial line holds none: it would have ended)
        if cr:
            parts = _EOL.split(buf)
            lines, endings, tail = parts[0:-1:2], parts[1::2], parts[-1]
            if not tail and endings[-1] == b"\r":
                self._cr_pending = True  # counted once the next byte (or close) says CR or CRLF
            for ending in endings[:-1] if self._cr_pending else endings:
                self.line_endings[_ENDING_NAMES[ending]] += 1
        else:
            lines = buf.split(b"\n")
            tail = lines.pop()
            endings = []
            self.line_endings["lf"] += len(lines)
        frames: list[Frame] = []
        end = self._fed - len(buf)
        for index, line in enumerate(lines):
            end += len(line) + (len(endings[index]) if endings else 1)
            if index == 0 and drop_first:
                continue  # the end of a line that already overflowed
            if not line:
                frame = self._dispatch(end, now)
                if frame is not None:
                    frames.append(frame)
            elif len(line) > MAX_LINE_BYTES:
                self.overflows += 1
            else:
                self._field(line)
        if tail:
            self._extend_partial(tail)
        return frames

    def _field(self, line: bytes) -> None:
        if line[0] == 0x3A:  # ":" starts a comment
            self.comments += 1
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._append_data(value)
        elif name == b"event":
            self._event_type = value
        elif name == b"id":
            if b"\x00" not in value:
                self.last_event_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit() and len(value) <= MAX_RETRY_DIGITS:
            self.retry_ms = int(value)  # bytes.isdigit(): ASCII digits only, not ""
        # any other field name is ignored

    def _append_data(self, value: bytes) -> None:
        size = self._data_size + len(value) + (1 if self._data else 0)
        if size + DATA_LINE_COST * len(self._data) > MAX_EVENT_BYTES:
            if not self._data_overflowed:
                self._data_overflowed = True
                self.overflows += 1
            return
        self._data.append(value)
        self._data_size = size

    def _dispatch(self, end: int, now: float) -> Frame | None:
        """A blank line ended at `end`: dispatch the event if its data buffer is not empty."""
        self._event_start = end
        data, event_type = self._data, self._event_type
        self._data, self._data_size, self._data_overflowed, self._event_type = [], 0, False, b""
        if not data:
            return None
        raw = data[0] if len(data) == 1 else b"\n".join(data)
        text, produced, incomplete = decode_payload(raw)
        wire_bytes = end - self._frame_start
        self._frame_start = end
        return Frame(
            t_s=now,
            kind=event_type.decode("utf-8", "replace") if event_type else "message",
            data=text,
            wire_bytes=wire_bytes,
            data_bytes=len(raw),
            last_event_id=self.last_event_id,
            retry_ms=self.retry_ms,
            incomplete_utf8=incomplete,
            replacement_chars=produced,
        )
