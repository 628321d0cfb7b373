"""What every format's parser shares: `Delta`, what one event says, and `ApiParser`, the base class
that decodes a frame's JSON payload once and hands it to the format's reader by its shape."""

from __future__ import annotations

from typing import Final, NamedTuple

import orjson

from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api


class Delta(NamedTuple):
    """What one event adds to the reply, and what it says about the stream.

    An immutable NamedTuple, not a frozen dataclass: one is built per event on the proxy's event
    loop, where a frozen dataclass costs 2.2 µs and this 0.8 µs (bench/micro_feed.py).
    """

    content: str = ""  # visible answer text (refusal text included)
    reasoning: str = ""  # reasoning / thinking text
    tool_args: str = ""  # tool-call names and argument fragments
    stream_tokens: int | None = None  # tokens the stream says this event carries
    token_ids: tuple[int, ...] | None = None
    output_tokens_total: int | None = None  # usage as reported (cumulative where cumulative)
    input_tokens_total: int | None = None
    # the part of the output total the API says was reasoning (OpenAI reasoning_tokens, Gemini
    # thoughtsTokenCount); when no reasoning text was streamed, those tokens were never on the wire
    reasoning_tokens_total: int | None = None
    model: str | None = None
    terminal: bool = False  # the API's own end-of-stream marker
    error: str | None = None  # an error event inside the stream
    ids_visible: bool = False  # a token-ID stream: its ids are the visible output (it has no text)

    @property
    def visible(self) -> bool:
        """True when the event adds something a user sees: text, reasoning or a tool call.

        In a token-ID stream (`ids_visible`), the ids are that output, though they carry no text
        here; elsewhere ids ride along with the text (Together, vLLM, TGI) and do not count, so a
        special token such as TGI's `</s>` is not visible.
        """
        return bool(
            self.content
            or self.reasoning
            or self.tool_args
            or (self.ids_visible and self.token_ids)
        )


_tuple_new = tuple.__new__


def content_delta(content: str, model: str | None, terminal: bool) -> Delta:
    """`Delta(content=..., model=..., terminal=...)` for the per-event paths: built directly,
    without the NamedTuple constructor's keyword and default handling (a third of the cost)."""
    return _tuple_new(
        Delta, (content, "", "", None, None, None, None, None, model, terminal, None, False)
    )


EMPTY: Final = Delta()
DONE: Final = Delta(terminal=True)


def _text_delta(field: str, text: str, tokens: int | None = None) -> Delta:
    """A Delta with `text` in the named field ("content", "reasoning" or "tool_args")."""
    if field == "reasoning":
        return Delta(reasoning=text, stream_tokens=tokens)
    if field == "tool_args":
        return Delta(tool_args=text, stream_tokens=tokens)
    if tokens is None:
        return content_delta(text, None, False)
    return Delta(content=text, stream_tokens=tokens)


def _is_done(data: str) -> bool:
    return data.strip() == "[DONE]"


class ApiParser:
    """Turns frames into Deltas for one API; never raises, counts what it could not read.

    Every API here sends JSON, nearly always one object per event: `parse` decodes the payload
    once and hands an object to `parse_object`, any other JSON value to `parse_other` and a payload
    that is not JSON to `parse_text`. The last two count the frame as malformed unless the format
    sends such payloads too (Gemini's array form, a token-ID array, an unknown stream's text).
    """

    api = Api.OTHER

    def __init__(self) -> None:
        self.malformed = 0  # frames whose payload was not what this API sends

    def parse(self, frame: Frame) -> Delta:
        """The Delta of one frame (an empty one when the frame says nothing this parser reads)."""
        data = frame.data
        if data[:1] != "{":  # not the usual JSON object: blank, [DONE], or something else
            if not data.strip():
                return EMPTY
            if _is_done(data):
                return DONE
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self.parse_text(frame)
        try:
            if type(doc) is dict:  # orjson builds plain dicts: no subclass to allow for
                return self.parse_object(doc, frame)
            return self.parse_other(doc, frame)
        except Exception:  # a reader bug must cost one event, never the flow
            self.malformed += 1
            return EMPTY

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        """One payload that is a JSON object: the format's reader."""
        raise NotImplementedError

    def parse_other(self, doc: object, frame: Frame) -> Delta:
        """A JSON payload that is not an object: malformed for an API that sends objects."""
        del doc, frame
        self.malformed += 1
        return EMPTY

    def parse_text(self, frame: Frame) -> Delta:
        """A payload that is not JSON: malformed for a JSON API."""
        del frame
        self.malformed += 1
        return EMPTY
