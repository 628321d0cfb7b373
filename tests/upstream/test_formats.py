"""The demo upstream's wire formats: valid events of each API's shape with the planned tokens."""

from __future__ import annotations

import orjson
import pytest

from hopmeter.core.apis import Delta, make_parser
from hopmeter.core.frames import Frame
from hopmeter.core.ndjson import NdjsonDecoder
from hopmeter.core.sse import SseDecoder
from hopmeter.core.vocab import Api
from hopmeter.upstream.formats import (
    Planned,
    anthropic_document,
    anthropic_error,
    anthropic_messages,
    ollama_chat,
    ollama_document,
    ollama_error,
    openai_chat,
    openai_document,
    openai_error,
    reply_tokens,
)
from hopmeter.upstream.scenario import Scenario

# Seven answer tokens, two per event (so the last event carries one), after three reasoning ones.
SCENARIO = Scenario(tokens=7, reasoning=3, coalesce=2)
MODEL = "demo-1"


def _frames(planned: list[Planned], ndjson: bool = False) -> list[Frame]:
    """The events as hopmeter's own framers read them, event by event."""
    framer = NdjsonDecoder() if ndjson else SseDecoder()
    frames: list[Frame] = []
    for n, p in enumerate(planned):
        frames += framer.feed(p.body, float(n))
    return frames + framer.close(float(len(planned)))


def _deltas(api: Api, planned: list[Planned], ndjson: bool = False) -> list[Delta]:
    """What hopmeter's parser for `api` reads from the events; none may be malformed."""
    parser = make_parser(api)
    deltas = [parser.parse(f) for f in _frames(planned, ndjson)]
    assert parser.malformed == 0
    return deltas


def _check_plan(planned: list[Planned], s: Scenario) -> None:
    """Token-carrying events count every token once, in order, ending on the last one."""
    carrying = [p for p in planned if p.last_token is not None]
    assert sum(p.tokens for p in carrying) == s.total_tokens
    assert [p.last_token for p in carrying] == sorted({p.last_token for p in carrying})
    assert carrying[-1].last_token == s.total_tokens - 1
    assert all(p.tokens == 0 for p in planned if p.last_token is None)


def test_reply_tokens_are_deterministic_with_emoji_where_asked() -> None:
    """The same scenario gives the same tokens; with emoji every fifth answer token is one, and
    with fffd that token is a replacement character instead."""
    reasoning, answer = reply_tokens(SCENARIO)
    assert reasoning == ["Thinking", " step1", " step2"]
    assert answer[:3] == ["Streaming", " puts", " the"]
    assert reply_tokens(SCENARIO) == (reasoning, answer)
    _, emoji = reply_tokens(Scenario(tokens=10, emoji=True))
    assert (emoji[4], emoji[9]) == ("🦙", " 👩\u200d💻")
    _, fffd = reply_tokens(Scenario(tokens=10, emoji=True, fffd=True))
    assert (fffd[4], fffd[9]) == ("\ufffd", "\ufffd")


def test_openai_chat_events_are_chunks_hopmeter_reads_as_planned() -> None:
    """Each event is an SSE `data:` line holding a chat.completion.chunk of the model (or the
    final [DONE]); hopmeter's parser reads the reasoning, the answer and the usage total."""
    planned = openai_chat(SCENARIO, MODEL, include_usage=True)
    _check_plan(planned, SCENARIO)
    assert planned[-1].body == b"data: [DONE]\n\n"
    for p in planned[:-1]:
        assert p.body.startswith(b"data: ") and p.body.endswith(b"\n\n")
        chunk = orjson.loads(p.body[6:])
        assert (chunk["object"], chunk["model"]) == ("chat.completion.chunk", MODEL)
    reasoning, answer = reply_tokens(SCENARIO)
    deltas = _deltas(Api.OPENAI_CHAT, planned)
    assert "".join(d.reasoning for d in deltas) == "".join(reasoning)
    assert "".join(d.content for d in deltas) == "".join(answer)
    assert [d.output_tokens_total for d in deltas if d.output_tokens_total] == [10]
    assert deltas[-1].terminal


def test_openai_chat_sends_usage_only_when_asked() -> None:
    """Without stream_options.include_usage (or with usage off) no usage chunk is sent."""
    for planned in (
        openai_chat(SCENARIO, MODEL, include_usage=False),
        openai_chat(Scenario(tokens=3, usage=False), MODEL, include_usage=True),
    ):
        assert all(b'"usage"' not in p.body for p in planned)


def test_openai_coalesces_the_planned_number_of_tokens_per_event() -> None:
    """With coalesce=2 each content event carries two tokens' text, the last one the remainder."""
    planned = openai_chat(SCENARIO, MODEL, include_usage=False)
    _, answer = reply_tokens(SCENARIO)
    content = [p for p in planned if b'"content":"' in p.body and p.tokens]
    assert [p.tokens for p in content] == [2, 2, 2, 1]
    first = orjson.loads(content[0].body[6:])["choices"][0]["delta"]["content"]
    assert first == answer[0] + answer[1]


def test_anthropic_events_name_their_type_and_hopmeter_reads_them() -> None:
    """Each SSE event's name is its JSON type, in the Messages order (start, a thinking block
    then a text block, delta, stop); hopmeter's parser reads the text and the output total."""
    planned = anthropic_messages(SCENARIO, MODEL)
    _check_plan(planned, SCENARIO)
    types = []
    for p in planned:
        head, data = p.body.split(b"\n", 1)
        doc = orjson.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + doc["type"].encode()
        types.append(doc["type"])
    assert types[:3] == ["message_start", "content_block_start", "ping"]
    assert types[-2:] == ["message_delta", "message_stop"]
    assert types.count("content_block_start") == types.count("content_block_stop") == 2
    reasoning, answer = reply_tokens(SCENARIO)
    deltas = _deltas(Api.ANTHROPIC_MESSAGES, planned)
    assert "".join(d.reasoning for d in deltas) == "".join(reasoning)
    assert "".join(d.content for d in deltas) == "".join(answer)
    assert [d.output_tokens_total for d in deltas if d.output_tokens_total][-1] == 10
    assert any(d.terminal for d in deltas)


@pytest.mark.parametrize("generate", [False, True], ids=["chat", "generate"])
def test_ollama_lines_are_json_and_end_with_the_eval_count(generate: bool) -> None:
    """Each line is one JSON object ending in a newline; the last says done with eval_count,
    and hopmeter's parser reads the answer from /api/chat or /api/generate alike."""
    planned = ollama_chat(SCENARIO, MODEL, generate)
    _check_plan(planned, SCENARIO)
    docs = [orjson.loads(p.body) for p in planned]
    assert all(p.body.endswith(b"\n") and p.body.count(b"\n") == 1 for p in planned)
    assert [d["done"] for d in docs] == [False] * (len(docs) - 1) + [True]
    assert (docs[-1]["eval_count"], docs[-1]["done_reason"]) == (10, "stop")
    _, answer = reply_tokens(SCENARIO)
    deltas = _deltas(Api.OLLAMA, planned, ndjson=True)
    assert "".join(d.content for d in deltas) == "".join(answer)
    assert deltas[-1].terminal


@pytest.mark.parametrize("generate", [False, True], ids=["chat", "generate"])
def test_an_ollama_whole_reply_is_one_document_with_the_counts(generate: bool) -> None:
    """`"stream": false` to /api/chat or /api/generate: Ollama's own whole reply, which
    hopmeter's parser reads as the answer, the usage and the end."""
    doc = orjson.loads(ollama_document(SCENARIO, MODEL, generate))
    _, answer = reply_tokens(SCENARIO)
    text = doc["response"] if generate else doc["message"]["content"]
    assert text == "".join(answer) and doc["done"] is True and doc["eval_count"] == 10


def test_error_events_are_each_apis_error_shape() -> None:
    """The in-stream errors are marked as errors and read by hopmeter as error events."""
    cases = [
        (Api.OPENAI_CHAT, openai_error(), False),
        (Api.ANTHROPIC_MESSAGES, anthropic_error(), False),
        (Api.OLLAMA, ollama_error(), True),
    ]
    for api, planned, ndjson in cases:
        assert planned.error and planned.last_token is None
        (delta,) = _deltas(api, [planned], ndjson)
        assert delta.error, api


def test_documents_hold_the_whole_reply_and_its_usage() -> None:
    """A non-streamed reply is one JSON document with the whole answer and the usage total."""
    _, answer = reply_tokens(SCENARIO)
    openai = orjson.loads(openai_document(SCENARIO, MODEL))
    assert openai["choices"][0]["message"]["content"] == "".join(answer)
    assert openai["usage"]["completion_tokens"] == 10
    anthropic = orjson.loads(anthropic_document(SCENARIO, MODEL))
    assert anthropic["content"] == [{"type": "text", "text": "".join(answer)}]
    assert (anthropic["model"], anthropic["usage"]["output_tokens"]) == (MODEL, 10)
