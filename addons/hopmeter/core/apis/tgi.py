"""What one event of TGI's `/generate_stream` says: one token object, with the details at the end.

TGI's Messages API (`/v1/chat/completions`) speaks "openai.chat" instead (apis/openai.py).
"""

from __future__ import annotations

from hopmeter.core.apis._base import ApiParser, Delta
from hopmeter.core.apis._json import _dict, _error_text, _int, _str
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api


class TgiParser(ApiParser):
    """TGI `/generate_stream`: one `token` object per event; special tokens are not visible."""

    api = Api.TGI

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        token = _dict(doc.get("token"))
        token_id = token.get("id")
        ids = (token_id,) if isinstance(token_id, int) and not isinstance(token_id, bool) else None
        text = "" if token.get("special") is True else _str(token.get("text"))
        details = _dict(doc.get("details"))
        return Delta(
            content=text,
            stream_tokens=1 if token else None,
            token_ids=ids,
            output_tokens_total=_int(details.get("generated_tokens")),
            terminal=doc.get("generated_text") is not None,
            error=_error_text(doc.get("error")),
        )
