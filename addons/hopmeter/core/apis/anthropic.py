"""What one event says in Anthropic's Messages stream: text, thinking and tool input, usage, errors.

Events and their payloads as https://docs.anthropic.com/en/docs/build-with-claude/streaming lists
them. Usage comes in message_start (the input's; its `output_tokens`, 1 or so, is the count so
far) and, cumulative, in message_delta; `output_tokens` includes thinking. `content_block_delta`,
the token event, also has a plain reader (`plain_anthropic_delta`) that FlowMeter calls on the
payload bytes.
"""

from __future__ import annotations

from typing import Final

from hopmeter.core.apis._base import DONE, EMPTY, ApiParser, Delta, _text_delta
from hopmeter.core.apis._json import (
    _dict,
    _dumps,
    _error_text,
    _int,
    _json_object,
    _list,
    _model,
    _str,
)
from hopmeter.core.frames import Frame
from hopmeter.core.vocab import Api

# Anthropic content blocks and deltas that carry text: type -> (Delta field, key holding the text).
# signature_delta and citations_delta carry no text; compaction_delta is a summary of the context
# made for the next turn, not reply (its tokens are not in the usage); web_search_tool_result is
# tool output.
_ANTHROPIC_TEXT: Final = {
    "text_delta": ("content", "text"),
    "thinking_delta": ("reasoning", "thinking"),
    "input_json_delta": ("tool_args", "partial_json"),
    "text": ("content", "text"),
    "thinking": ("reasoning", "thinking"),
    "tool_use": ("tool_args", "name"),
    "server_tool_use": ("tool_args", "name"),
    "mcp_tool_use": ("tool_args", "name"),
}


def _anthropic_block(doc: dict[str, object], kind: str) -> Delta:
    """The text a content_block_delta or content_block_start event adds (answer, thinking or
    tool input), by its block type."""
    inner = _dict(doc.get("delta") if kind == "content_block_delta" else doc.get("content_block"))
    read = _ANTHROPIC_TEXT.get(_str(inner.get("type")))
    return _text_delta(read[0], _str(inner.get(read[1]))) if read else EMPTY


def plain_anthropic_delta(raw: bytes) -> Delta | None:
    """The Delta of the payload of an event the stream typed `content_block_delta` (Anthropic's
    token event), as `AnthropicParser.parse` gives it; None when the payload is not a JSON object
    of that type: then the frame goes through the full reader."""
    doc = _json_object(raw)
    if doc is None or (_str(doc.get("type")) or "content_block_delta") != "content_block_delta":
        return None
    return _anthropic_block(doc, "content_block_delta")


class AnthropicParser(ApiParser):
    """Anthropic Messages events; usage comes in message_start and (cumulative) message_delta."""

    api = Api.ANTHROPIC_MESSAGES

    def parse_object(self, doc: dict[str, object], frame: Frame) -> Delta:
        kind = _str(doc.get("type")) or frame.kind
        if kind in ("content_block_delta", "content_block_start"):
            return _anthropic_block(doc, kind)
        if kind in ("message_start", "message"):
            msg = _dict(doc.get("message")) if kind == "message_start" else doc
            return self._usage(
                _dict(msg.get("usage")),
                model=_model(msg.get("model")),
                document=msg if kind == "message" else None,
                # message_start's output_tokens is the count so far (1, as it starts), not the
                # reply's: only message_delta's, cumulative, or a whole message's is the total
                output=kind == "message",
            )
        if kind == "message_delta":
            return self._usage(_dict(doc.get("usage")))
        if kind == "message_stop":
            return DONE
        if kind == "error" or "error" in doc:
            return Delta(error=_error_text(doc.get("error") or doc) or "error")
        return EMPTY

    @staticmethod
    def _usage(
        usage: dict[str, object],
        *,
        model: str | None = None,
        document: dict[str, object] | None = None,
        output: bool = True,
    ) -> Delta:
        content = reasoning = tools = ""
        if document is not None:  # a whole (non-streamed) message
            for raw in _list(document.get("content")):
                block = _dict(raw)
                content += _str(block.get("text"))
                reasoning += _str(block.get("thinking"))
                if "input" in block:
                    tools += _str(block.get("name")) + _dumps(block.get("input"))
        return Delta(
            content=content,
            reasoning=reasoning,
            tool_args=tools,
            output_tokens_total=_int(usage.get("output_tokens")) if output else None,
            input_tokens_total=_int(usage.get("input_tokens")),
            model=model,
            terminal=document is not None,
        )
