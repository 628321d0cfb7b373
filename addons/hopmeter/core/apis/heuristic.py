"""What one event of a stream of no known API says: text found under common keys, or the payload.

The fallback for an SSE or NDJSON stream whose path, headers and first payloads named no API
(FlowMeter stops asking wire.refine_api after a few frames): no payload of it is malformed.
"""

from __future__ import annotations

from typing import Final

from hopmeter.core.apis._base import EMPTY, ApiParser, Delta
from hopmeter.core.apis._json import _dict, _error_text, _int, _model
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api

# Keys the unknown-format heuristic reads text from, most specific first.
_TEXT_KEYS: Final = (
    "content",
    "text",
    "delta",
    "token",
    "response",
    "message",
    "output",
    "generated_text",
    "completion",
)
_HEURISTIC_DEPTH: Final = 4  # choices[0].delta.content is three levels down


class HeuristicParser(ApiParser):
    """Unknown SSE or NDJSON: text from common keys; a non-JSON payload is itself the text."""

    def __init__(self, api: Api = Api.SSE) -> None:
        super().__init__()
        self.api = api

    def parse_text(self, frame: Frame) -> Delta:
        return Delta(content=frame.data)

    def parse_other(self, doc: object, frame: Frame) -> Delta:
        """A JSON string is the text; any other value says nothing."""
        if isinstance(doc, str):
            return Delta(content=doc)
        return EMPTY

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        usage = _dict(doc.get("usage"))
        out = usage.get("completion_tokens", usage.get("output_tokens", doc.get("eval_count")))
        return Delta(
            content=_find_text(doc, _HEURISTIC_DEPTH),
            output_tokens_total=_int(out),
            model=_model(doc.get("model")),
            terminal=doc.get("done") is True,
            error=_error_text(doc.get("error")),
        )


def _find_text(value: object, depth: int) -> str:
    """The first string under a common text key, searching dicts and first list items."""
    if depth <= 0:
        return ""
    if isinstance(value, list):
        return _find_text(value[0], depth - 1) if value else ""
    if not isinstance(value, dict):
        return ""
    for key in _TEXT_KEYS:
        found = value.get(key)
        if isinstance(found, str):
            return found
    for key in ("choices", *_TEXT_KEYS):
        found = value.get(key)
        if isinstance(found, dict | list):
            text = _find_text(found, depth - 1)
            if text:
                return text
    return ""
