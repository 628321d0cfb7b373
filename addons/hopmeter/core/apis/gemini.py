"""What one chunk of Gemini's `streamGenerateContent` says, on Google AI and Vertex AI alike.

With `alt=sse` each event is one chunk object; without it the whole body is one JSON array of
chunks, read as one event.
"""

from __future__ import annotations

from hopmeter.core.apis._base import ApiParser, Delta
from hopmeter.core.apis._json import _dict, _dumps, _error_text, _int, _list, _model, _str
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api


class GeminiParser(ApiParser):
    """Gemini / Vertex `streamGenerateContent?alt=sse` chunks (and the JSON-array form).

    Parts: `text` (`thought: true` is reasoning), `functionCall` and `executableCode` are tool
    calls; `codeExecutionResult` is tool output, not model text. `usageMetadata` is cumulative:
    output = candidatesTokenCount + thoughtsTokenCount. `finishReason` marks the last chunk.
    """

    api = Api.GEMINI

    def parse_other(self, doc: object, frame: Frame) -> Delta:
        """Without alt=sse, one JSON array of chunks: read as one event. An array item that is
        not a chunk object makes the event malformed (counted once); the chunks are still read."""
        if not isinstance(doc, list):
            return super().parse_other(doc, frame)
        chunks = [d for d in doc if isinstance(d, dict)]
        if len(chunks) != len(doc):
            self.malformed += 1
        return _merge([self.parse_object(d, frame) for d in chunks])

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        content: list[str] = []
        reasoning: list[str] = []
        tools: list[str] = []
        terminal = False
        for raw in _list(doc.get("candidates")):
            cand = _dict(raw)
            terminal = terminal or bool(cand.get("finishReason"))
            for praw in _list(_dict(cand.get("content")).get("parts")):
                part = _dict(praw)
                text = _str(part.get("text"))
                (reasoning if part.get("thought") is True else content).append(text)
                call = part.get("functionCall")
                if isinstance(call, dict):
                    tools.append(_str(call.get("name")) + _dumps(call.get("args") or {}))
                tools.append(_str(_dict(part.get("executableCode")).get("code")))
        usage = _dict(doc.get("usageMetadata"))
        out_parts = [_int(usage.get("candidatesTokenCount")), _int(usage.get("thoughtsTokenCount"))]
        given = [n for n in out_parts if n is not None]
        error = _error_text(doc.get("error"))
        blocked = _dict(doc.get("promptFeedback")).get("blockReason")
        if error is None and blocked:
            error = f"prompt blocked: {blocked}"
        return Delta(
            content="".join(content),
            reasoning="".join(reasoning),
            tool_args="".join(tools),
            output_tokens_total=sum(given) if given else None,
            input_tokens_total=_int(usage.get("promptTokenCount")),
            reasoning_tokens_total=out_parts[1],
            model=_model(doc.get("modelVersion")),
            terminal=terminal,
            error=error,
        )


def _merge(parts: list[Delta]) -> Delta:
    """One Delta for several payloads in one frame (last usage and model win)."""
    out_total = [p.output_tokens_total for p in parts if p.output_tokens_total is not None]
    in_total = [p.input_tokens_total for p in parts if p.input_tokens_total is not None]
    models = [p.model for p in parts if p.model]
    errors = [p.error for p in parts if p.error]
    return Delta(
        content="".join(p.content for p in parts),
        reasoning="".join(p.reasoning for p in parts),
        tool_args="".join(p.tool_args for p in parts),
        output_tokens_total=out_total[-1] if out_total else None,
        input_tokens_total=in_total[-1] if in_total else None,
        reasoning_tokens_total=next(
            (p.reasoning_tokens_total for p in reversed(parts) if p.reasoning_tokens_total), None
        ),
        model=models[-1] if models else None,
        terminal=any(p.terminal for p in parts),
        error=errors[0] if errors else None,
    )
