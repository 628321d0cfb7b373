"""Tests for hopmeter.core.apis.token_ids: events of token ids instead of text."""

from __future__ import annotations

import pytest

from hopmeter.core.apis import EMPTY, make_parser
from tests.harness.events import frame, parse


@pytest.mark.parametrize(
    ("data", "ids", "terminal"),
    [
        ("[15496, 11]", (15496, 11), False),
        ({"ids": [1, 2, 3]}, (1, 2, 3), False),
        ({"token_ids": [4], "text": "x"}, (4,), False),
        ({"token_id": 7, "finish_reason": "stop"}, (7,), True),
        ({"done": True}, None, True),
    ],
)
def test_token_id_events(data, ids, terminal):
    """Token-ID events carry ids (a JSON array, or ids/token_ids/token_id keys) as their tokens."""
    d = parse("token_ids", data)
    assert d.token_ids == ids
    assert d.stream_tokens == (len(ids) if ids else None)
    assert d.terminal == terminal
    assert d.visible == bool(ids)


@pytest.mark.parametrize("data", ["[1, 2.5]", '["a"]', "[true]", "7", '"ids"'])
def test_an_array_of_other_than_ids_is_malformed(data: str):
    """A JSON array holding anything but integer ids, or a bare value, is a malformed event."""
    parser = make_parser("token_ids")
    assert parser.parse(frame(data)) == EMPTY
    assert parser.malformed == 1
