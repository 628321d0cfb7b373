"""Tests for hopmeter.core.apis._base: Delta, its per-event builder, and what ApiParser counts."""

from __future__ import annotations

from hopmeter.core.apis import Delta, content_delta, make_parser
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
