"""Tests for hopmeter.core.meter: the plain chat path measures what the general path does."""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopmeter.core import meter as meter_module
from hopmeter.core.meter import (
    MAX_ERRORS_KEPT,
    MAX_EVENTS_PER_READ,
    PLAIN_MISSES_MAX,
    TEXT_BLOCK_EVENTS,
    FlowMeter,
)
from hopmeter.core.sse import SseDecoder
from hopmeter.testing import split_at
from tests.harness.corpus import CORPUS

needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")


def chunk(text: str, **extra: object) -> bytes:
    choices = [{"index": 0, "delta": {"content": text}}]
    doc: dict[str, object] = {"id": "c", "model": "m", "choices": choices, **extra}
    return b"data: " + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"


# A chat stream with everything near the common chunk: a role chunk, plain chunks (ASCII, emoji,
# an escaped quote), a payload with invalid UTF-8, an event type, a comment, an id line, a chunk
# with two data lines, a CRLF event, an empty event, a finish chunk, a usage chunk and [DONE].
EDGES = b"".join(
    [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        chunk("Hello"),
        chunk(" w\u00f6rld \U0001f600"),
        chunk(' "quoted"'),
        b'data: {"choices":[{"delta":{"content":"bad \xff byte"}}]}\n\n',
        chunk(" after"),
        b": keep-alive\n\n",
        chunk(" x"),
        b"event: delta\n" + chunk(" typed"),
        b"id: 7\n" + chunk(" with id"),
        b'data: {"choices":[{"delta":\ndata: {"content":" two lines"}}]}\n\n',
        chunk(" crlf")[:-2] + b"\r\n\r\n",
        chunk(" y"),
        b"data:\n\n",
        chunk(" z"),
        chunk("", choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        b'data: {"choices":[],"usage":{"completion_tokens":12,"prompt_tokens":3}}\n\n',
        b"data: [DONE]\n\n",
    ]
)


def state(meter: FlowMeter) -> dict[str, Any]:
    """Everything a FlowMeter has measured that the record, figures and detectors read."""
    framer = meter.framer
    assert isinstance(framer, SseDecoder)
    return {
        "events": (
            list(meter.events.t_s),
            list(meter.events.stream_tokens),
            list(meter.events.content_offset),
        ),
        "text": meter.event_texts(),
        "facts": asdict(meter.facts),
        "counts": (
            meter.events_seen,
            meter.bytes_wire,
            meter.bytes_decoded,
            meter.api,
            meter.malformed_events,
        ),
        "utf8": (meter.utf8.replacement_chars, meter.utf8.split_sequences, meter.utf8.chars),
        "sse": (
            framer.line_endings,
            framer.comments,
            framer.overflows,
            framer.last_event_id,
            framer.unterminated_bytes,
            framer.trailing_bytes,
        ),
    }


def measure(chunks: list[bytes], api: str, plain: bool) -> tuple[dict[str, Any], int]:
    """Feed the chunks (chunk i at i ms) with the plain path on or off; the state and how many
    chunks the plain path took."""
    meter = FlowMeter(api=api, content_type="text/event-stream", content_encoding=None)
    taken = 0
    if plain:
        sse = meter.framer
        assert isinstance(sse, SseDecoder)
        took, took_one = sse.took_plain_events, sse.took_plain_event

        def counting(data: bytes) -> None:
            nonlocal taken
            taken += 1
            took(data)

        def counting_one(data: bytes) -> None:
            nonlocal taken
            taken += 1
            took_one(data)

        sse.took_plain_events = counting  # type: ignore[method-assign]
        sse.took_plain_event = counting_one  # type: ignore[method-assign]
    else:
        meter._pick_plain_path = lambda: None  # type: ignore[method-assign]
        meter._plain = None
    for i, data in enumerate(chunks):
        meter.feed(data, i / 1000)
    meter.close(len(chunks) / 1000)
    return state(meter), taken


def chunkings(body: bytes, seed: int) -> list[list[bytes]]:
    """The body cut after every event, after every other event, in threes, and at random."""
    ends = [i + 2 for i in range(len(body)) if body.startswith(b"\n\n", i)]
    rng = random.Random(seed)
    return [
        split_at(body, ends),
        split_at(body, ends[1::2]),
        split_at(body, ends[2::3]),
        split_at(body, rng.sample(range(1, len(body)), min(40, len(body) - 1))),
        split_at(body, sorted([*rng.sample(ends, len(ends) // 2), rng.randrange(len(body))])),
    ]


@pytest.mark.parametrize("api", ["openai.chat", "sse"])
def test_plain_path_measures_what_the_general_path_does_on_edge_shapes(api: str) -> None:
    """Every shape near the common chunk, however the body is cut, gives the same measurement
    with the plain path as without it; and the plain path takes the common chunks (else this
    test would compare the general path with itself)."""
    for seed, chunks in enumerate(chunkings(EDGES, 1)):
        general, _ = measure(chunks, api, plain=False)
        plain, taken = measure(chunks, api, plain=True)
        assert plain == general, seed
        if seed == 0:
            assert taken == 6, taken  # Hello, wörld, quoted, after, x, z
            assert general["facts"]["replacement_chars"] == 1  # the \xff, either way
            assert general["sse"][0]["crlf"] == 2


def test_plain_path_takes_coalesced_events_and_declines_a_batch_with_another_shape() -> None:
    sse = SseDecoder()
    sse.feed(chunk("a"), 0.0)
    assert sse.plain_data_events(chunk("b") + chunk("c")) == [chunk("b")[6:-2], chunk("c")[6:-2]]
    for declined in (
        chunk("b") + b": comment\n\n",
        chunk("b") + b"event: x\n" + chunk("c"),
        chunk("b")[:-1] + chunk("c"),  # one event with two data lines
        chunk("b") + b"\n\n",  # an empty event after it
        chunk("b")[:-2] + b"\r\n\r\n",
        chunk("b")[:-1],  # not ended
        b"data:" + chunk("b")[6:],  # no space after the colon: the general path reads it
    ):
        assert sse.plain_data_events(declined) is None, declined
    sse.feed(b"data: unfinished", 1.0)
    assert sse.plain_data_events(chunk("d")) is None  # a partial line is pending


def anthropic(kind: str, doc: dict[str, object]) -> bytes:
    return (
        f"event: {kind}\ndata: ".encode() + json.dumps(doc, ensure_ascii=False).encode() + b"\n\n"
    )


def text_delta(text: str, block: str = "text_delta", field: str = "text") -> bytes:
    doc = {"type": "content_block_delta", "index": 0, "delta": {"type": block, field: text}}
    return anthropic("content_block_delta", doc)


# An Anthropic stream with every shape near its token event: text, thinking and tool-input
# deltas, a ping, a delta whose payload names another type, one without a type, a payload with
# invalid UTF-8, an event without its event line, a CRLF one, two data lines, and the usage events.
ANTHROPIC_EDGES = b"".join(
    [
        anthropic(
            "message_start",
            {
                "type": "message_start",
                "message": {"model": "claude-x", "usage": {"input_tokens": 9}},
            },
        ),
        anthropic("content_block_start", {"type": "content_block_start", "index": 0}),
        text_delta("think", "thinking_delta", "thinking"),
        text_delta("Hello"),
        text_delta(" w\u00f6rld \U0001f600"),
        anthropic("ping", {"type": "ping"}),
        text_delta(' "quoted"'),
        anthropic("content_block_delta", {"type": "message_delta", "usage": {"output_tokens": 1}}),
        anthropic(
            "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " t"}}
        ),
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
        b'{"type":"text_delta","text":"bad \xff"}}\n\n',
        text_delta(" after"),
        text_delta(" untyped")[len(b"event: content_block_delta\n") :],
        text_delta(" crlf")[:-2] + b"\r\n\r\n",
        b'event: content_block_delta\ndata: {"type":"content_block_delta",\n'
        b'data: "delta":{"type":"text_delta","text":" two"}}\n\n',
        text_delta('{"a":', "input_json_delta", "partial_json"),
        text_delta(" z"),
        anthropic("content_block_stop", {"type": "content_block_stop", "index": 0}),
        anthropic("message_delta", {"type": "message_delta", "usage": {"output_tokens": 14}}),
        anthropic("message_stop", {"type": "message_stop"}),
    ]
)


@pytest.mark.parametrize("api", ["anthropic.messages", "sse"])
def test_anthropic_plain_path_measures_what_the_general_path_does(api: str) -> None:
    """Anthropic's content_block_delta events take the plain path (its `event:` line checked),
    and every shape near them measures the same with the plain path as without it."""
    for seed, chunks in enumerate(chunkings(ANTHROPIC_EDGES, 5)):
        general, _ = measure(chunks, api, plain=False)
        plain, taken = measure(chunks, api, plain=True)
        assert plain == general, seed
        if seed == 0:
            assert general["counts"][3] == "anthropic.messages"
            # think, Hello, wörld, quoted, the payload without a type, after, {"a":, z (the one
            # naming another type goes the general way)
            assert taken == 8, taken
            assert general["facts"]["replacement_chars"] == 1
            assert general["facts"]["reasoning_chars"] == 5


def test_typed_plain_events_need_their_event_line_on_every_event() -> None:
    sse = SseDecoder()
    sse.feed(text_delta("a"), 0.0)
    two = text_delta("b") + text_delta("c")
    kind = b"content_block_delta"
    head = len(b"event: content_block_delta\ndata: ")
    assert sse.plain_data_events(two, kind) == [text_delta("b")[head:-2], text_delta("c")[head:-2]]
    assert sse.plain_data_events(two) is None  # an event line where none may be
    assert sse.plain_data_events(chunk("b"), kind) is None  # none where one must be
    for declined in (
        text_delta("b") + chunk("c"),
        text_delta("b") + anthropic("ping", {"type": "ping"}),
        text_delta("b")[:-1] + text_delta("c"),  # two data lines
        text_delta("b") + b"\n\n",
        b"event: content_block_delta\nid: 1\n"
        + text_delta("b")[len(b"event: content_block_delta\n") :],
        text_delta("b")[:-2] + b"\r\n\r\n",
        text_delta("b")[:-1],
    ):
        assert sse.plain_data_events(declined, kind) is None, declined


def test_plain_path_on_the_bench_chunk_builds_no_frame() -> None:
    """The bench's chunk (one event per chunk, a plain OpenAI stream) goes the plain way."""
    body = b"".join(chunk(" tok") for _ in range(50))
    chunks = chunkings(body, 2)[0]
    general, _ = measure(chunks, "openai.chat", plain=False)
    plain, taken = measure(chunks, "openai.chat", plain=True)
    assert plain == general
    assert taken == 49  # all but the first: the meter keeps the head until the first event


@needs_corpus
def test_plain_path_measures_what_the_general_path_does_on_the_corpus() -> None:
    """Every chat and Anthropic recording of the corpus (LF and CRLF, every vendor's variant, as
    sniffed and as declared), cut several ways, measures the same with and without the plain
    path; and the plain path takes chunks of both."""
    taken_total = {"openai.chat": 0, "anthropic.messages": 0}
    recordings = sorted(CORPUS.rglob("*.sse"))
    for path in recordings:
        body = path.read_bytes()
        for seed, chunks in enumerate(chunkings(body, 3)):
            general, _ = measure(chunks, "sse", plain=False)
            api = general["counts"][3]
            if api not in taken_total:
                break
            plain, taken = measure(chunks, "sse", plain=True)
            assert plain == general, (path.name, seed)
            declared, declared_taken = measure(chunks, api, plain=True)
            assert declared == measure(chunks, api, plain=False)[0], (path.name, seed, api)
            taken_total[api] += taken + declared_taken
    assert taken_total["openai.chat"] > 300, taken_total
    assert taken_total["anthropic.messages"] > 100, taken_total


def test_a_stream_whose_every_chunk_declines_stops_trying_the_plain_path() -> None:
    """Together-style chunks (a token id beside every piece of text) are data-only events the
    plain path reads and declines: after PLAIN_MISSES_MAX in a row it is no longer tried, so
    such a stream's JSON is not read twice per event, and it measures what the general path
    does. A plain stream's isolated declines (role, finish, usage) do not turn it off."""
    together = {"choices": [{"index": 0, "delta": {"content": " tok", "token_id": 7}}]}
    body = b"".join(chunk("", **together) for _ in range(40))
    chunks = chunkings(body, 4)[0]
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    sse = meter.framer
    assert isinstance(sse, SseDecoder)
    tried = 0
    read = sse.plain_event

    def counting(data: bytes) -> bytes | None:
        nonlocal tried
        tried += 1
        return read(data)

    sse.plain_event = counting  # type: ignore[method-assign]
    for i, data in enumerate(chunks):
        meter.feed(data, i / 1000)
    meter.close(len(chunks) / 1000)
    assert tried == PLAIN_MISSES_MAX
    assert meter.events_seen == 40 and meter.facts.payload_bytes == 160  # read, not malformed
    assert state(meter) == measure(chunks, "openai.chat", plain=False)[0]
    assert measure(chunkings(EDGES, 1)[0], "openai.chat", plain=True)[1] == 6  # still on


def _long_reply(events: int) -> tuple[bytes, list[str]]:
    """A chat stream of `events` events, every fifth one without text; and each event's text."""
    body, texts = [], []
    for i in range(events):
        text = "" if i % 5 == 4 else f" w{i}\u00e9"
        body.append(chunk(text))
        texts.append(text)
    return b"".join(body), texts


def test_kept_text_joined_in_blocks_reads_back_per_event() -> None:
    """The reply text is stored a block of events at a time; each event's text and the whole
    reply read back exactly, across block boundaries and events without text."""
    body, texts = _long_reply(TEXT_BLOCK_EVENTS * 2 + 37)
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    for i, piece in enumerate(split_at(body, list(range(0, len(body), 97)))):
        meter.feed(piece, i * 0.001)
    meter.close(1.0)
    assert meter.event_texts() == texts
    assert meter.text() == "".join(texts)
    assert meter.text_chars == sum(map(len, texts))


def test_text_past_the_bounds_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_TEXT_CHARS an event's text is counted, not kept; past MAX_EVENTS nothing is."""
    monkeypatch.setattr(meter_module, "MAX_TEXT_CHARS", 60)
    monkeypatch.setattr(meter_module, "MAX_EVENTS", 30)
    body, texts = _long_reply(40)
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    meter.feed(body, 0.0)
    kept, total = [], 0
    for text in texts[:30]:
        fits = total + len(text) <= 60
        kept.append(text if fits else "")
        total += len(text) if fits else 0
    assert meter.event_texts() == kept
    assert meter.text() == "".join(kept)
    assert meter.text_overflow_chars == sum(map(len, texts)) - total
    assert len(meter.events.t_s) == 30
    assert meter.events_seen == 40


def test_malformed_events_counted_before_the_api_was_sniffed_are_kept() -> None:
    """Replacing an unknown stream's parser once a payload names the API keeps what it counted."""
    meter = FlowMeter(api="sse", content_type="text/event-stream", content_encoding=None)
    meter._parser.malformed = 1  # as if a payload had broken the heuristic reader
    meter.feed(chunk("Hi") + b"data: {not json}\n\n", 0.0)
    assert meter.api == "openai.chat"
    assert meter.malformed_events == 2


@needs_corpus
@pytest.mark.parametrize("repeats", [False, True], ids=["distinct times", "repeated times"])
def test_chunk_times_are_the_times_fed_in_either_column(
    monkeypatch: pytest.MonkeyPatch, repeats: bool
) -> None:
    """The chunk times a record lists are the times each chunk was fed, whether they are read
    from the event column (every chunk so far completed exactly one event) or from their own
    (kept from the first chunk that completed none or several): every recording of the corpus
    (SSE and NDJSON) cut every way, gzipped, past the chunk bound, with chunks that share a
    time (a read of two events then one of none, at one instant) and events capped below the
    chunk bound."""
    monkeypatch.setattr(meter_module, "MAX_CHUNKS", 40)
    if repeats:
        monkeypatch.setattr(meter_module, "MAX_EVENTS", 25)
    bodies = [
        (p, p.read_bytes()) for p in sorted(CORPUS.rglob("*")) if p.suffix in (".sse", ".ndjson")
    ]
    own = shared = 0
    for path, body in bodies:
        media = "text/event-stream" if path.suffix == ".sse" else "application/x-ndjson"
        for seed, chunks in enumerate(chunkings(body, 5)):
            for encoding in (None, "gzip"):
                fed = chunks if encoding is None else split_at(gzip.compress(body), [5, 40, 41])
                meter = FlowMeter(api="sse", content_type=media, content_encoding=encoding)
                times = [(i // 2 if repeats else i) / 1000 + 0.25 for i in range(len(fed))]
                for t, data in zip(times, fed, strict=True):
                    meter.feed(data, t)
                meter.close(1.0)
                assert list(meter.chunk_t) == times[:40], (path.name, seed, encoding)
                assert list(meter.chunk_bytes) == [len(d) for d in fed[:40]]
                own += meter._chunk_t is not None
                shared += meter._chunk_t is None
    assert own > 100 and shared > 10, (own, shared)


def test_chunk_times_hold_through_a_decoding_error_and_a_failed_read() -> None:
    """A chunk is listed at the time it was fed when its body cannot be decoded, and when
    reading it fails: the times stay aligned with the sizes."""
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding="gzip")
    meter.feed(b"not gzip at all", 0.5)
    meter.feed(b"more", 0.75)
    assert meter.facts.decode_error and list(meter.chunk_t) == [0.5, 0.75]
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    meter.feed(chunk("a"), 0.1)

    def broken(decoded: bytes, now_s: float) -> None:
        raise RuntimeError("a reader's bug")

    meter._take = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        meter.feed(chunk("b"), 0.2)
    del meter._take
    meter.feed(chunk("c"), 0.3)
    meter.feed(chunk("d"), 0.4)
    assert list(meter.chunk_t) == [0.1, 0.2, 0.3, 0.4]
    assert len(meter.chunk_bytes) == 4


def test_a_stream_of_one_event_per_chunk_keeps_one_time_column() -> None:
    """The usual stream (each read one whole event) keeps its times once, for events and chunks."""
    body, _ = _long_reply(300)
    ends = [i + 2 for i in range(len(body)) if body.startswith(b"\n\n", i)]
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    for i, data in enumerate(split_at(body, ends)):
        meter.feed(data, i / 50)
    meter.close(7.0)
    assert meter._chunk_t is None
    assert list(meter.chunk_t) == [i / 50 for i in range(300)] == list(meter.events.t_s)


def test_token_counts_events_say_read_back_and_a_stream_that_never_says_keeps_none() -> None:
    """An event that says how many tokens it carries (logprobs entries here) reads back its count,
    one that says nothing -1, whether the first event says or only a later one; a stream whose
    events never say keeps no column for it."""

    def said(n: int) -> bytes:
        entries = [{"token": "t", "logprob": -0.1}] * n
        choice = {"index": 0, "delta": {"content": "w"}, "logprobs": {"content": entries}}
        return b"data: " + json.dumps({"model": "m", "choices": [choice]}).encode() + b"\n\n"

    for events, expected in (
        ([chunk("a"), chunk("b"), said(2), chunk("c"), said(3)], [-1, -1, 2, -1, 3]),
        ([said(1), chunk("a")], [1, -1]),
    ):
        meter = FlowMeter(
            api="openai.chat", content_type="text/event-stream", content_encoding=None
        )
        for i, data in enumerate(events):
            meter.feed(data, i / 100)
        meter.close(1.0)
        assert list(meter.events.stream_tokens) == expected
    body, texts = _long_reply(50)
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    meter.feed(body, 0.0)
    assert meter.events.tokens_said is None
    assert list(meter.events.stream_tokens) == [-1] * len(texts)


# Chat events near the plain chunk: its content any text, its model and object varied, beside
# the role, finish and usage chunks, a comment and [DONE]
_CHAT_EVENTS = st.one_of(
    st.builds(
        lambda text, extra: chunk(text, **extra),
        st.text(max_size=6),
        st.sampled_from(
            [{}, {"model": ""}, {"model": None}, {"object": "chat.completion"}, {"usage": None}]
        ),
    ),
    st.sampled_from(
        [
            b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
            chunk("", choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n',
            b": keep-alive\n\n",
            b"data: [DONE]\n\n",
        ]
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_CHAT_EVENTS, min_size=1, max_size=12), st.data())
def test_plain_path_measures_what_the_general_path_does_on_chat_streams(
    events: list[bytes], data: st.DataObject
) -> None:
    """Any chat stream of plain chunks and the chunks near them, one event per chunk or cut
    anywhere, measures the same with the plain path (its one-event reading of what a chunk says,
    `_on_content`) as without it."""
    body = b"".join(events)
    cuts = data.draw(st.lists(st.integers(1, len(body) - 1), max_size=4)) if len(body) > 1 else []
    per_event = list(events)
    for chunks in (per_event, split_at(body, sorted(set(cuts)))):
        general, _ = measure(chunks, "openai.chat", plain=False)
        plain, _ = measure(chunks, "openai.chat", plain=True)
        assert plain == general


def test_declines_between_plain_chunks_never_add_up_to_turning_the_plain_path_off() -> None:
    """A chat stream whose every third chunk declines (a finish or usage chunk) keeps the
    plain path for all its plain chunks, however many declines it has in all: each plain chunk
    read starts the count of declines in a row again."""
    finish = chunk("", choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
    chunks = [chunk("a"), *([chunk("b"), chunk("c"), finish] * (3 * PLAIN_MISSES_MAX))]
    _, taken = measure(chunks, "openai.chat", plain=True)
    assert taken == 2 * 3 * PLAIN_MISSES_MAX  # every plain chunk but the first (the head's)


def test_error_events_are_kept_up_to_a_bound_and_all_counted() -> None:
    """A stream of error events keeps the first MAX_ERRORS_KEPT (memory per flow is bounded)
    and counts every one in errors_seen."""
    doc = {"error": {"type": "overloaded_error", "message": "try later"}}
    body = b"".join(b"data: " + json.dumps(doc).encode() + b"\n\n" for _ in range(40))
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    meter.feed(body, 0.01)
    meter.close(0.02)
    assert meter.facts.errors == ["overloaded_error\ntry later"] * MAX_ERRORS_KEPT
    assert meter.facts.errors_seen == 40


def test_a_compressed_body_of_millions_of_events_is_read_within_its_budget() -> None:
    """1.4 KB of brotli decoding to millions of tiny events cost ~26 s of CPU in one feed on the
    loop every stream shares. A chunk to decode is read up to MAX_EVENTS_PER_READ events (or one
    per few of its bytes); past it the flow is read in part: that chunk and the later ones are
    forwarded unread, counted, and nothing is read of them (the decoder stopped mid-chunk)."""
    import brotli

    wire = brotli.compress(b"data: hello\n\n" * 5_000_000)
    meter = FlowMeter(api="other", content_type="text/event-stream", content_encoding="br")
    meter.feed(wire, 0.01)
    assert MAX_EVENTS_PER_READ <= meter.events_seen < MAX_EVENTS_PER_READ + 10_000
    assert meter.unread_bytes == len(wire)
    seen = meter.events_seen
    meter.feed(brotli.compress(b"data: more\n\n"), 0.02)  # whatever comes next: not read
    meter.close(0.03)
    assert meter.events_seen == seen and meter.unread_bytes > len(wire)
    assert meter.facts.decode_error is None  # no decoder fed past its stop: no false corruption


def test_a_whole_compressed_body_of_many_events_is_read_in_full() -> None:
    """A body measured whole (one chunk) of 20,000 events, compressed as a real stream is: each
    event is many wire bytes, so the chunk's budget allows them all; the end is seen."""
    import gzip

    events = (
        b"".join(chunk(f" tok{i}") for i in range(20_000))
        + b'data: {"choices": [], "usage": {"completion_tokens": 20000}}\n\ndata: [DONE]\n\n'
    )
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding="gzip")
    meter.feed(gzip.compress(events), 0.01)
    meter.close(0.02)
    assert meter.unread_bytes == 0 and meter.events_seen == 20_002
    assert meter.facts.terminal_seen and meter.facts.usage_output_tokens == 20_000


def test_a_large_plain_chunk_is_read_in_full() -> None:
    """A body measured whole that is not compressed is read whole, however many events: its
    bytes came off the socket, so reading them costs in proportion to what was sent."""
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    whole = b"".join(chunk("x") for _ in range(40_000)) + b"data: [DONE]\n\n"
    meter.feed(whole, 0.01)
    meter.close(0.02)
    assert meter.events_seen == 40_001 and meter.unread_bytes == 0 and meter.facts.terminal_seen


def test_content_offsets_past_32_bits_are_clamped_never_half_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An event's content offset lives in a 32-bit column: past 2**31 - 1 visible characters (a
    hostile reply) it is said as MAX_OFFSET, and the event is listed whole (its time too)."""
    meter = FlowMeter(api="openai.chat", content_type="text/event-stream", content_encoding=None)
    meter.feed(chunk("hi"), 0.01)
    meter._visible_chars = 2**31 + 5  # as after two billion characters
    meter.feed(chunk("there"), 0.02)
    meter.feed(
        b"data: "
        + json.dumps({"choices": [{"delta": {"content": "x"}}], "u": 1}).encode()
        + b"\n\n",
        0.03,
    )
    marks = meter.events
    assert len(marks.t_s) == len(marks.content_offset) == 3
    assert list(marks.content_offset)[1:] == [meter_module.MAX_OFFSET] * 2


def test_a_body_in_an_encoding_hopmeter_cannot_undo_is_timed_and_flagged() -> None:
    """Content-Encoding: compress (or any unknown one): the flow is timed, its chunks listed and
    decode_error says why nothing was read; the meter is made, never an exception."""
    meter = FlowMeter(
        api="openai.chat", content_type="text/event-stream", content_encoding="compress"
    )
    meter.feed(b"\x1f\x9d\x90garbled", 0.01)
    meter.close(0.02)
    assert (
        meter.facts.decode_error == "unknown Content-Encoding 'compress'; cannot measure this body"
    )
    assert meter.chunks_seen == 1 and meter.events_seen == 0 and meter.first_byte_s == 0.01


def test_a_token_id_body_of_a_width_hopmeter_does_not_read_is_timed_and_flagged() -> None:
    """Packed token ids 7 bits wide: the flow is timed and decode_error says why it was not
    read, rather than the meter failing to be made (the flow unmeasured)."""
    meter = FlowMeter(
        api="token_ids", content_type="application/x-token-ids; width=7", content_encoding=None
    )
    meter.feed(b"\x01\x02\x03", 0.01)
    meter.close(0.02)
    assert meter.facts.decode_error is not None and "7" in meter.facts.decode_error
    assert meter.chunks_seen == 1 and meter.events_seen == 0 and not meter.event_stream
