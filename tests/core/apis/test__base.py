"""Tests for hopmeter.core.apis._base: Delta, its per-event builder, and what ApiParser counts."""

from __future__ import annotations

import pytest

from hopmeter.core.apis import DONE, EMPTY, ApiParser, Delta, content_delta, make_parser
from hopmeter.core.frames import Frame
from tests.harness.events import frame


def test_malformed_json_is_counted_not_raised():
    """Invalid JSON gives an empty Delta and one count in `malformed`."""
    parser = make_parser("openai.chat")
    assert parser.parse(frame('{"choices": [')) == Delta()
    assert parser.parse(frame("[1, 2]")) == Delta()
    assert parser.malformed == 2


def test_content_delta_is_the_keyword_delta():
    """The positional builder of the per-event path fills the fields the keywords name."""
    assert content_delta("hi", "m", True) == Delta(content="hi", model="m", terminal=True)
    assert content_delta("", None, False) == Delta()
    assert type(content_delta("x", None, False)) is Delta
    assert len(Delta._fields) == 12  # content_delta lists every field: update it with Delta


class BrokenParser(ApiParser):
    """A reader with a bug: it raises on every object."""

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        raise KeyError("bug")


@pytest.mark.parametrize(("data", "malformed"), [("not json", 1), ('"text"', 1), ("42", 1)])
def test_what_is_not_an_object_is_malformed(data: str, malformed: int):
    """A payload that is not JSON, or JSON that is not an object, is one malformed event."""
    parser = make_parser("anthropic.messages")
    assert parser.parse(frame(data)) == EMPTY
    assert parser.malformed == malformed


@pytest.mark.parametrize("data", ["", "  \n", "[DONE]", " [DONE] "])
def test_blank_and_done_payloads_are_not_malformed(data: str):
    """A blank payload says nothing and `[DONE]` is the end; neither is malformed."""
    parser = make_parser("gemini")
    assert parser.parse(frame(data)) == (DONE if data.strip() else EMPTY)
    assert parser.malformed == 0


def test_a_reader_bug_costs_one_event():
    """An exception inside a format's reader gives an empty Delta and one malformed count."""
    parser = BrokenParser()
    assert parser.parse(frame({"a": 1})) == EMPTY
    assert parser.parse(frame("[DONE]")) == DONE
    assert parser.malformed == 1
