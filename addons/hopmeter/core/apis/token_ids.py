"""What one event of a token-ID stream says: the ids of the tokens it carries, instead of text.

The format follows the seed "Stream tokens, not text": SSE or NDJSON events of JSON ids, or a packed
body of raw ids that packed_ids.PackedIdDecoder turns into events of the same JSON arrays.
"""

from __future__ import annotations

from hopmeter.core.apis._base import ApiParser, Delta
from hopmeter.core.apis._json import _dict, _error_text, _int, _int_list, _model, _str
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api


class TokenIdsParser(ApiParser):
    """Token-ID streams (seed "Stream tokens, not text"): ids instead of text.

    A payload is a JSON array of ids (`[15496, 11]`, also what packed_ids.PackedIdDecoder emits),
    or an object with `ids` / `token_ids` (array) or `token_id` / `id` (one id), optionally `text`,
    `done: true` or a non-null `finish_reason`. The ids are the event's tokens.
    """

    api = Api.TOKEN_IDS

    def parse_other(self, doc: object, frame: Frame) -> Delta:
        """A JSON array of ids; any other value that is not an object is malformed."""
        ids = _int_list(doc)
        if ids is None:
            return super().parse_other(doc, frame)
        return Delta(token_ids=ids, stream_tokens=len(ids), ids_visible=True)

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        ids = _int_list(doc.get("ids"))
        if ids is None:
            ids = _int_list(doc.get("token_ids"))
        one = doc.get("token_id", doc.get("id"))
        if ids is None and isinstance(one, int) and not isinstance(one, bool):
            ids = (one,)
        usage = _dict(doc.get("usage"))
        return Delta(
            content=_str(doc.get("text")),
            token_ids=ids,
            stream_tokens=len(ids) if ids is not None else None,
            output_tokens_total=_int(usage.get("completion_tokens", usage.get("output_tokens"))),
            model=_model(doc.get("model")),
            terminal=doc.get("done") is True or doc.get("finish_reason") not in (None, ""),
            error=_error_text(doc.get("error")),
            ids_visible=True,
        )
