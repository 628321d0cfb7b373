"""What one line of Ollama's `/api/chat` or `/api/generate` NDJSON stream says."""

from __future__ import annotations

from hopmeter.core.apis._base import ApiParser, Delta
from hopmeter.core.apis._json import _dict, _dumps, _error_text, _int, _list, _model, _str
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api


class OllamaParser(ApiParser):
    """Ollama `/api/chat` and `/api/generate` NDJSON lines; `done: true` carries eval counts."""

    api = Api.OLLAMA

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        msg = _dict(doc.get("message"))
        tools = "".join(
            _str(_dict(_dict(t).get("function")).get("name"))
            + _dumps(_dict(_dict(t).get("function")).get("arguments") or {})
            for t in _list(msg.get("tool_calls"))
        )
        done = doc.get("done") is True
        return Delta(
            content=_str(msg.get("content")) + _str(doc.get("response")),
            reasoning=_str(msg.get("thinking")) + _str(doc.get("thinking")),
            tool_args=tools,
            output_tokens_total=_int(doc.get("eval_count")) if done else None,
            input_tokens_total=_int(doc.get("prompt_eval_count")) if done else None,
            model=_model(doc.get("model")),
            terminal=done,
            error=_error_text(doc.get("error")),
        )
