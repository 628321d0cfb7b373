"""FlowMeter: everything hopmeter knows about one response, fed chunk by chunk.

The proxy layer calls `feed(chunk, now)` for each chunk the stream callable stamped (a millisecond
later, from its measure queue) and `close(now)` when the flow ends. `feed` does only what must
happen per chunk: count it, decode a side copy, frame it into events and read each event's text.
Token counting, figures and detectors run once at the end (hopmeter.core.measure.measure).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson

from hopmeter.core.apis import Delta, make_parser
from hopmeter.core.apis._json import clip_model
from hopmeter.core.apis.anthropic import AnthropicParser, plain_anthropic_delta
from hopmeter.core.apis.openai import OpenAIChatParser, plain_chat_payload, plain_chat_said
from hopmeter.core.decoding import IdentityDecoder, Utf8Decoder, make_decoder
from hopmeter.core.frames import Frame
from hopmeter.core.sse import SseDecoder
from hopmeter.core.vocab import UNKNOWN_APIS, Api
from hopmeter.core.wire import Framer, is_document, make_framer, refine_api
from hopmeter.errors import DecodingError, HopmeterError

# Bounds per flow (STYLE: every buffer has a bound). A record lists at most this many chunks and
# events; the rest are counted in `chunks_dropped` / `events_dropped`. 4,096 events is a 4,000-token
# reply at one token per event; the arrays cost 4-12 bytes per chunk and 12-16 per event.
MAX_CHUNKS = 4096
MAX_EVENTS = 8192
# Visible text kept for tokenizing at the end of the flow. Past this, tokens are estimated from the
# character count: 256 KiB is ~64,000 tokens of English, longer than any model's reply limit.
MAX_TEXT_CHARS = 256 * 1024
# The kept text is joined into one string every this many events: a str per event costs ~50 bytes
# beyond its characters (~200 KiB held until the end of a 4,000-token reply, were none joined);
# 32 keeps at most ~1.6 KiB of them per open stream (256 kept up to ~12 KiB, tracemalloc).
TEXT_BLOCK_EVENTS = 32
# A non-streamed JSON reply is parsed at the end for its usage and text; bigger ones are timed only.
MAX_DOCUMENT_BYTES = 1024 * 1024
# Reading an event costs a few microseconds, and what comes off a socket is read in proportion to
# the bytes sent; but a compressed body can decode to millions of events in one read (1.4 KB of
# brotli: 64 MiB of `data: x`, ~26 s of CPU on the loop every stream shares). A chunk to decode is
# read while it has given fewer than MAX_EVENTS_PER_READ events, or one per
# MIN_WIRE_BYTES_PER_EVENT of its own bytes if that allows more (a compressed chat stream sends a
# few per event, a whole body measured at once included; a bomb, a thousandth); past that the flow
# is read in part: this chunk and every later one are forwarded unread (a decoder stopped
# mid-chunk cannot go on), their bytes counted in `unread_bytes`, and the detectors claim no
# missing end.
MAX_EVENTS_PER_READ = 2 * MAX_EVENTS
MIN_WIRE_BYTES_PER_EVENT = 1
# The largest content offset an event's 32-bit column holds; a later one is said as this.
MAX_OFFSET = 2**31 - 1
# Error events kept per flow (each up to ~500 characters); the rest are counted in errors_seen.
MAX_ERRORS_KEPT = 5
# Chunks in a row the plain chat path may read and decline before a flow stops trying it (its
# role, finish and usage chunks decline one at a time; some vendors' every chunk declines).
PLAIN_MISSES_MAX = 8


class EventMarks:
    """Per-event columns, kept as compact arrays: a time and a content offset (8 + 4 bytes per
    event), and the tokens each event says it carries (4 more) from the first event that says
    (most streams never do: a chat or Anthropic stream without logprobs or token ids)."""

    __slots__ = ("content_offset", "t_s", "tokens_said")

    def __init__(self) -> None:
        self.t_s = array("d")
        self.content_offset = array("i")
        # None until an event says how many tokens it carries; then one entry per event, -1 for
        # those that say nothing (filled back for the events before)
        self.tokens_said: array[int] | None = None

    @property
    def stream_tokens(self) -> array[int]:
        """The tokens each event says it carries (-1: it says nothing)."""
        if self.tokens_said is not None:
            return self.tokens_said
        return array("i", [-1]) * len(self.t_s)

    def said(self, tokens: int | None, token_ids: tuple[int, ...] | None) -> None:
        """What the event just added says it carries: `tokens`, else one per token id, else
        nothing."""
        n = len(token_ids) if tokens is None and token_ids is not None else tokens
        column = self.tokens_said
        if column is not None:
            column.append(-1 if n is None else n)
        elif n is not None:  # the first event that says
            self.tokens_said = column = array("i", [-1]) * (len(self.t_s) - 1)
            column.append(n)


@dataclass(slots=True)
class StreamFacts:
    """What was seen in the stream, beyond timing: the evidence detectors read."""

    first_visible_s: float | None = None
    first_content_s: float | None = None
    first_event_s: float | None = None
    terminal_seen: bool = False
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS_KEPT, as kept
    errors_seen: int = 0
    model: str | None = None  # the first the reply names, clipped (`clip_model`)
    model_clipped_chars: int = 0
    usage_output_tokens: int | None = None
    usage_input_tokens: int | None = None
    usage_reasoning_tokens: int | None = None
    reasoning_chars: int = 0
    payload_bytes: int = 0  # UTF-8 bytes of visible text
    replacement_chars: int = 0  # U+FFFD in the visible text
    events_incomplete_utf8: int = 0
    decode_error: str | None = None


class FlowMeter:
    """Measures one response: chunks in, events out, figures at the end."""

    # one is held per open stream: slots take ~300 bytes where an instance dict of these took
    # ~1.6 KiB; `__dict__` stays for an attribute not listed (made only when one is set)
    __slots__ = (
        "__dict__",
        "_chat",
        "_chunk_t",
        "_decoder",
        "_document",
        "_document_overflow",
        "_framer",
        "_head",
        "_keep_text",
        "_malformed_before",
        "_parser",
        "_plain",
        "_plain_event",
        "_plain_misses",
        "_plain_read",
        "_sniffs_left",
        "_text",
        "_text_blocks",
        "_text_lens",
        "_text_recent",
        "_utf8",
        "_visible_chars",
        "api",
        "bytes_decoded",
        "bytes_wire",
        "chunk_bytes",
        "chunks_seen",
        "content_encoding",
        "content_type",
        "events",
        "events_seen",
        "facts",
        "first_byte_s",
        "last_byte_s",
        "text_chars",
        "text_overflow_chars",
        "unread_bytes",
    )

    def __init__(
        self,
        *,
        api: Api,
        content_type: str,
        content_encoding: str | None,
        headers: Mapping[str, str] | None = None,
        keep_text: bool = True,
        stream_requested: bool | None = None,
    ) -> None:
        self.api = api
        self.content_type = content_type
        self.content_encoding = content_encoding or None
        # each recorded chunk's size, and its time: while the i-th chunk's time is the i-th
        # event's (every chunk so far completed one event: the usual stream), the times are not
        # kept twice (`chunk_t`); from the first chunk where that fails they have their own column
        self.chunk_bytes = array("i")
        self._chunk_t: array[float] | None = None
        self.chunks_seen = 0
        self.bytes_wire = 0
        self.bytes_decoded = 0
        self.first_byte_s: float | None = None
        self.last_byte_s: float | None = None
        self.events = EventMarks()
        self.events_seen = 0
        self.facts = StreamFacts()
        self.text_chars = 0  # kept (see `event_texts`)
        self.text_overflow_chars = 0  # not kept: past MAX_TEXT_CHARS or MAX_EVENTS, or not asked
        # the kept text of each recorded event: the last few one string each, the ones before
        # joined TEXT_BLOCK_EVENTS at a time, with each event's length
        self._text_recent: list[str] = []
        self._text_blocks: list[str] = []
        self._text_lens = array("i")  # of the events in _text_blocks
        self._keep_text = keep_text
        self._visible_chars = 0
        self._document = bytearray()
        self._document_overflow = False
        # an SSE body's bytes before its first event (bounded); None once there is no need
        self._head: bytearray | None = None
        try:
            self._decoder = make_decoder(content_encoding) if content_encoding else None
        except DecodingError as exc:  # an encoding hopmeter cannot undo: timed, never read
            self._decoder = IdentityDecoder()
            self.facts.decode_error = str(exc)
        self.unread_bytes = 0  # of the chunks not read in full (MAX_EVENTS_PER_READ), and after
        self._utf8 = Utf8Decoder()
        try:
            self._framer = make_framer(content_type, api, headers, stream_requested)
        except HopmeterError as exc:  # a framing hopmeter does not read (a token-id width)
            self._framer, self._decoder = None, IdentityDecoder()  # timed, never read
            self.facts.decode_error = str(exc)
        if isinstance(self._framer, SseDecoder):
            self._head = bytearray()
        # the body is read as text (UTF-8, events or one document) or only timed and counted
        self._text = self._framer is not None or is_document(content_type)
        self._parser = make_parser(api)
        self._malformed_before = 0  # counted by the parsers a sniffed API replaced
        # an unknown SSE/NDJSON stream is sniffed frame by frame until a payload tells its API;
        # a bounded number of tries, so a plain-text stream does not pay for it forever
        self._sniffs_left = 8 if api in UNKNOWN_APIS else 0
        self._plain: SseDecoder | None = None
        self._plain_read: Callable[[bytes], Delta | None] = plain_chat_payload
        self._plain_event = b""  # the `event:` line the plain path's events carry, if any
        self._plain_misses = 0  # chunks in a row the plain path declined after reading them
        # the plain path's SseDecoder while its usual chunk can be read in `feed` itself: a chat
        # stream, past its first event, with no content coding (`_sync_chat`)
        self._chat: SseDecoder | None = None
        self._pick_plain_path()

    def _pick_plain_path(self) -> None:
        # A chat or Anthropic stream over SSE reads its common token event straight from the
        # payload bytes (no Frame, no decoded copy; `_take_plain`): a sixth (chat) to a quarter
        # (Anthropic) less per event than the general path, a third less when reads coalesce
        # several events (bench/micro_feed.py).
        framer = self._framer
        self._plain = None
        if not isinstance(framer, SseDecoder) or self._sniffs_left:
            return
        if type(self._parser) is OpenAIChatParser:
            self._plain = framer
            self._plain_read, self._plain_event = plain_chat_payload, b""
        elif type(self._parser) is AnthropicParser:
            self._plain = framer
            self._plain_read, self._plain_event = plain_anthropic_delta, b"content_block_delta"
        self._sync_chat()

    def _sync_chat(self) -> None:
        """`_chat` from what it rests on, each time one of them changes."""
        plain = self._plain
        ready = self._head is None and self._decoder is None and not self._plain_event
        self._chat = plain if ready else None

    @property
    def chunk_t(self) -> array[float]:
        """When each recorded chunk arrived (seconds since the request started)."""
        if self._chunk_t is not None:
            return self._chunk_t
        return self.events.t_s[: len(self.chunk_bytes)]

    @property
    def chunk_t_shared(self) -> bool:
        """Whether `chunk_t` is the first events' times (every chunk so far completed one
        event, each at its chunk's time), so a caller may take them from `events.t_s`."""
        return self._chunk_t is None

    @property
    def framer(self) -> Framer | None:
        """The SSE or NDJSON decoder in use, if the body is an event stream."""
        return self._framer

    @property
    def event_stream(self) -> bool:
        """Whether the body is framed as events (SSE or NDJSON) rather than one document."""
        return self._framer is not None

    @property
    def malformed_events(self) -> int:
        """Events whose payload the parser could not read (not what the API sends): each one was
        measured as an event that says nothing."""
        return self._malformed_before + self._parser.malformed

    @property
    def utf8(self) -> Utf8Decoder:
        """The side UTF-8 decoder, with its counts of replacements and split sequences."""
        return self._utf8

    def feed(self, data: bytes, now_s: float) -> None:
        """Stamp one chunk as it arrived (`now_s` is seconds since the request started)."""
        n = len(data)
        self.chunks_seen += 1
        self.bytes_wire += n
        if self.first_byte_s is None:
            self.first_byte_s = now_s
        self.last_byte_s = now_s
        k, times = len(self.chunk_bytes), self._chunk_t
        shared = k < MAX_CHUNKS and times is None
        if k < MAX_CHUNKS:
            self.chunk_bytes.append(n)
            if times is not None:
                times.append(now_s)
        try:
            chat = self._chat
            if chat is not None:
                # a chat stream's usual chunk, one plain event (`_take`'s plain path for it, with
                # no call to `_take`; once per event): read, counted, measured
                raw = chat.plain_event(data)
                if raw is not None:
                    said = plain_chat_said(raw)
                    self.bytes_decoded += n
                    utf8 = self._utf8
                    if utf8.carrying or not data.isascii():
                        utf8.count(data)
                    else:
                        utf8.chars += n
                    if said is None:  # read and declined: the general path, the miss counted
                        self._take_plain(data, now_s, [None])
                        self._on_frames(chat.feed(data, now_s))
                        return
                    self._plain_misses = 0
                    chat.took_plain_event(data)
                    self._on_content(now_s, *said)
                    return
            if self._decoder is None:
                self._take(data, now_s)
            elif self.facts.decode_error is None:
                self._take_decoded(data, n, now_s)
        finally:  # the chunk is listed whatever reading it did
            if shared:
                t_s = self.events.t_s
                if len(t_s) <= k or t_s[k] != now_s:  # this chunk's time is not the k-th event's
                    self._chunk_t = times = t_s[:k]  # the chunks before it each had theirs
                    times.append(now_s)

    def _take_decoded(self, data: bytes, n: int, now_s: float) -> None:
        """A chunk to decode, one bounded step at a time (a compression bomb never sits
        decoded), while its events to read last; a chunk not read in full, and every one after
        it, counts in unread_bytes."""
        if self.unread_bytes:  # read in part: the decoder stopped mid-chunk
            self.unread_bytes += n
            return
        limit = self.events_seen + max(MAX_EVENTS_PER_READ, n // MIN_WIRE_BYTES_PER_EVENT)
        try:
            for piece in self._decoder.steps(data):  # type: ignore[union-attr]
                if self.events_seen >= limit:
                    self.unread_bytes += n
                    return
                self._take(piece, now_s)
        except DecodingError as exc:
            self.facts.decode_error = str(exc)

    def close(self, now_s: float) -> None:
        """End of body: flush the decoders; an unterminated last event is not dispatched."""
        if self.facts.decode_error is None and self._decoder is not None and not self.unread_bytes:
            try:
                self._take(self._decoder.flush(), now_s)
            except DecodingError as exc:
                self.facts.decode_error = str(exc)
        self._utf8.flush()
        if self._framer is not None:
            self._on_frames(self._framer.close(now_s))
            head, self._head = self._head, None
            self._sync_chat()
            if self.events_seen == 0 and head and _is_json_document(head):
                # declared an event stream, sent one JSON document: measure it as what it is
                self._framer = None
                self._on_document(bytes(head), now_s)
        elif self._document and not self._document_overflow:
            self._on_document(bytes(self._document), now_s)

    def text(self) -> str:
        """The reply text kept so far (answer, reasoning and tool arguments), in order."""
        return "".join(self._text_blocks) + "".join(self._text_recent)

    def text_head(self, n: int) -> str:
        """The first `n` characters of the kept text, without joining the rest."""
        out: list[str] = []
        got = 0
        for piece in itertools.chain(self._text_blocks, self._text_recent):
            out.append(piece)
            got += len(piece)
            if got >= n:
                break
        return "".join(out)[:n]

    @property
    def visible_chars(self) -> int:
        """Visible characters so far, kept or not (the last event's content offset)."""
        return self._visible_chars

    def event_texts(self) -> list[str]:
        """The kept text of each recorded event: "" for one without text or past MAX_TEXT_CHARS."""
        folded = "".join(self._text_blocks)
        pos = 0
        # each folded event's slice, its end the next one's start (a comprehension: no append)
        out = [folded[pos : (pos := pos + n)] for n in self._text_lens]
        out += self._text_recent
        return out

    def _on_usage(self, delta: Delta) -> None:
        facts = self.facts
        if delta.output_tokens_total is not None:
            facts.usage_output_tokens = delta.output_tokens_total
        if delta.input_tokens_total is not None:
            facts.usage_input_tokens = delta.input_tokens_total
        if delta.reasoning_tokens_total is not None:
            facts.usage_reasoning_tokens = delta.reasoning_tokens_total

    def _fold_text(self) -> None:
        recent = self._text_recent
        self._text_lens.extend(map(len, recent))
        self._text_blocks.append("".join(recent))
        recent.clear()

    @property
    def document(self) -> bytes | None:
        """The body of a response that was not an event stream (bounded), for not_streamed."""
        return None if self._document_overflow else bytes(self._document)

    def _take(self, decoded: bytes, now_s: float) -> None:
        if not decoded:
            return
        self.bytes_decoded += len(decoded)
        sse = self._plain
        if sse is not None and self._head is None:
            # the plain path's stream (SSE read as text, past its first event), whose usual
            # chunk is one plain event: `_take_plain`'s steps for it inline (once per event),
            # and `Utf8Decoder.count`'s for an ASCII chunk with nothing carried
            utf8 = self._utf8
            if utf8.carrying or not decoded.isascii():
                utf8.count(decoded)
            else:
                utf8.chars += len(decoded)
            event = self._plain_event
            if not event:  # a chat stream: what its one-event chunk says, without a Delta
                raw = sse.plain_event(decoded)
                if raw is not None:
                    said = plain_chat_said(raw)
                    if said is not None:
                        self._plain_misses = 0
                        sse.took_plain_event(decoded)
                        self._on_content(now_s, *said)
                        return
                    self._take_plain(decoded, now_s, [None])  # counts the miss
                    self._on_frames(sse.feed(decoded, now_s))
                    return
            payloads = sse.plain_data_events(decoded, event)
            if payloads is not None and len(payloads) == 1:  # an Anthropic text delta
                delta = self._plain_read(payloads[0])
                if delta is not None:
                    self._plain_misses = 0
                    sse.took_plain_events(decoded)
                    self._on_delta(now_s, False, delta)
                    return
                self._take_plain(decoded, now_s, [None])  # counts the miss
            elif payloads is not None and self._take_plain(
                decoded, now_s, [self._plain_read(raw) for raw in payloads]
            ):
                return
            self._on_frames(sse.feed(decoded, now_s))
            return
        if not self._text:
            return
        self._utf8.count(decoded)
        if self._framer is not None:
            if self._head is not None:
                # kept until the first event: the body may be one JSON document in disguise
                if self.events_seen or len(self._head) + len(decoded) > MAX_DOCUMENT_BYTES:
                    self._head = None
                    self._sync_chat()
                else:
                    self._head += decoded
            sse = self._plain
            if sse is not None and self._head is None:  # the first chunk past the first event
                payloads = sse.plain_data_events(decoded, self._plain_event)
                if payloads is not None and self._take_plain(
                    decoded, now_s, [self._plain_read(raw) for raw in payloads]
                ):
                    return
            self._on_frames(self._framer.feed(decoded, now_s))
        elif not self._document_overflow:
            if len(self._document) + len(decoded) > MAX_DOCUMENT_BYTES:
                self._document_overflow = True
                self._document.clear()
            else:
                self._document += decoded

    def _take_plain(self, decoded: bytes, now_s: float, deltas: list[Delta | None]) -> bool:
        """Measure a chunk of plain events (chat or Anthropic), given what the plain reader read
        of each payload `plain_data_events` gave; False (nothing changed) when one was not a
        plain chunk.

        A chunk of plain-shaped events whose payload is not the plain chunk gets read twice (here,
        then by the full reader). A stream whose every event is like that (Together's token ids,
        DeepSeek's reasoning fields, logprobs) stops trying after PLAIN_MISSES_MAX in a row.
        """
        sse = self._plain
        assert sse is not None
        if None in deltas:
            self._plain_misses += 1
            if self._plain_misses >= PLAIN_MISSES_MAX:
                self._plain = None
                self._sync_chat()
            return False
        self._plain_misses = 0
        sse.took_plain_events(decoded)
        for delta in deltas:
            self._on_delta(now_s, False, delta)  # type: ignore[arg-type]
        return True

    def _on_document(self, body: bytes, now_s: float) -> None:
        # A whole JSON reply: one event at the end, so that a non-streamed chat reply is measured
        # (its first visible token is its last byte) and its usage reconciles the count.
        try:
            text = body.decode("utf-8", errors="replace")
        except Exception:  # pragma: no cover - bytes.decode with replace does not raise
            return
        frame = Frame(
            t_s=now_s, kind="document", data=text, wire_bytes=len(body), data_bytes=len(body)
        )
        self._on_frames([frame])

    def _on_frames(self, frames: list[Frame]) -> None:
        for frame in frames:
            if self._sniffs_left:
                self._sniffs_left -= 1
                api = refine_api(self.api, frame.data)
                if api != self.api:
                    self.api = api
                    self._malformed_before += self._parser.malformed
                    self._parser = make_parser(api)
                    self._sniffs_left = 0
                    self._pick_plain_path()
            self._on_delta(frame.t_s, frame.incomplete_utf8, self._parser.parse(frame))

    def _on_delta(self, t: float, incomplete_utf8: bool, delta: Delta) -> None:
        facts = self.facts
        self.events_seen += 1
        if facts.first_event_s is None:
            facts.first_event_s = t
        if incomplete_utf8:
            facts.events_incomplete_utf8 += 1
        # one unpacking instead of a field read each (this runs for every event)
        (
            content,
            reasoning,
            tool_args,
            stream_tokens,
            token_ids,
            out_total,
            in_total,
            reasoning_total,
            model,
            terminal,
            error,
            ids_visible,
        ) = delta
        if model and facts.model is None:
            facts.model, facts.model_clipped_chars = clip_model(model)
        if out_total is not None or in_total is not None or reasoning_total is not None:
            self._on_usage(delta)
        if reasoning:
            facts.reasoning_chars += len(reasoning)
        if terminal:
            facts.terminal_seen = True
        if error:
            facts.errors_seen += 1
            if len(facts.errors) < MAX_ERRORS_KEPT:
                facts.errors.append(error)
        text = content + reasoning + tool_args if reasoning or tool_args else content
        if text or delta.visible:
            if facts.first_visible_s is None:
                facts.first_visible_s = t
            if (content or ids_visible) and facts.first_content_s is None:
                facts.first_content_s = t
            # a token-ID stream has no text: its offset advances one per id
            self._visible_chars += len(text) or len(token_ids or ())
            if text.isascii():
                facts.payload_bytes += len(text)
            else:
                facts.replacement_chars += text.count("\ufffd")
                facts.payload_bytes += len(text.encode("utf-8"))
        marks = self.events
        if len(marks.t_s) >= MAX_EVENTS:
            self.text_overflow_chars += len(text)
            return
        if text:
            if self._keep_text and self.text_chars + len(text) <= MAX_TEXT_CHARS:
                self.text_chars += len(text)
            else:
                self.text_overflow_chars += len(text)
                text = ""
        recent = self._text_recent
        recent.append(text)
        if len(recent) >= TEXT_BLOCK_EVENTS:
            self._fold_text()
        marks.t_s.append(t)
        if stream_tokens is not None or token_ids is not None or marks.tokens_said is not None:
            marks.said(stream_tokens, token_ids)  # (most streams never say: no call)
        _append_offset(marks.content_offset, self._visible_chars)

    def _on_content(self, t: float, content: str, model: str | None, terminal: bool) -> None:
        """`_on_delta` of a Delta that says only its content, model and end (the plain chat
        chunk's, `plain_chat_said`): the same steps without those for the fields such a Delta
        leaves empty (tests hold the plain path to the general one). Once per event: each
        attribute read once, the content's length taken once."""
        facts = self.facts
        self.events_seen += 1
        size = len(content)
        # the first content's time is set after the first event's and the first visible one's
        # (here and in `_on_delta`): once it is, so are they, and one test spares the other two
        if facts.first_content_s is None:
            if facts.first_event_s is None:
                facts.first_event_s = t
            if size:
                if facts.first_visible_s is None:
                    facts.first_visible_s = t
                facts.first_content_s = t
        if facts.model is None and model:
            facts.model, facts.model_clipped_chars = clip_model(model)
        if terminal:
            facts.terminal_seen = True
        visible = self._visible_chars
        if size:
            self._visible_chars = visible = visible + size
            if content.isascii():
                facts.payload_bytes += size
            else:
                facts.replacement_chars += content.count("\ufffd")
                facts.payload_bytes += len(content.encode("utf-8"))
        marks = self.events
        t_s = marks.t_s
        if len(t_s) >= MAX_EVENTS:
            self.text_overflow_chars += size
            return
        if size:
            if self._keep_text and self.text_chars + size <= MAX_TEXT_CHARS:
                self.text_chars += size
            else:
                self.text_overflow_chars += size
                content = ""
        recent = self._text_recent
        recent.append(content)
        if len(recent) >= TEXT_BLOCK_EVENTS:
            self._fold_text()
        t_s.append(t)
        if marks.tokens_said is not None:
            marks.said(None, None)
        try:  # (a `try` costs nothing unless it catches)
            marks.content_offset.append(visible)
        except OverflowError:  # past 2**31 - 1 characters: a hostile reply, clamped
            marks.content_offset.append(MAX_OFFSET)


def _append_offset(column: array[int], visible: int) -> None:
    """An event's content offset into its 32-bit column, clamped at MAX_OFFSET (a reply of two
    billion characters is a hostile one): never an event half listed. (The plain path's
    `_on_content` does the same inline.)"""
    try:
        column.append(visible)
    except OverflowError:
        column.append(MAX_OFFSET)


def _is_json_document(body: bytes | bytearray) -> bool:
    """Whether a body is one JSON object or array (and nothing else)."""
    if body.lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True
