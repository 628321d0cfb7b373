"""One API's parser run over frames: literal payloads, or a recording's frames."""

from __future__ import annotations

import json

from hopmeter.core.apis import Delta, make_parser
from hopmeter.core.frames import Frame


def frame(data: str | object, kind: str = "message") -> Frame:
    """A frame of `kind` whose payload is `data` (a string as it is, anything else as JSON)."""
    text = data if isinstance(data, str) else json.dumps(data)
    return Frame(t_s=0.0, kind=kind, data=text, wire_bytes=len(text), data_bytes=len(text))


def parse(api: str, data: str | object, kind: str = "message") -> Delta:
    """The Delta a fresh parser for `api` reads from one such frame."""
    return make_parser(api).parse(frame(data, kind))


def parse_all(api: str, frames: list[Frame]) -> list[Delta]:
    """The Deltas of a recording's frames, read by one parser that finds none of them malformed."""
    parser = make_parser(api)
    deltas = [parser.parse(f) for f in frames]
    assert parser.malformed == 0
    return deltas
