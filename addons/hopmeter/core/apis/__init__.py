"""What one event says, for each API: visible text, token counts, usage, the end and errors.

`make_parser(api).parse(frame)` turns one frame into a `Delta`. One module per wire format, as
mitmproxy's contentviews/ has one per view: openai (chat and responses), anthropic, gemini, tgi,
ollama, token_ids, and heuristic for a stream of no known API; `_base` holds `Delta` and the
`ApiParser` base class, `_json` the typed readers they share. Which API a response speaks is
core/wire.py's question.

Usage totals are reported as the API sends them (cumulative where it is cumulative), so the last
non-None value is the total. The output total includes reasoning wherever the API bills it as
output: OpenAI `completion_tokens` (which holds `reasoning_tokens`), Anthropic `output_tokens`
(thinking included), and Gemini `candidatesTokenCount + thoughtsTokenCount` (counted apart there).
Parsers never raise: payloads they cannot read are counted in `parser.malformed` (the record's
`stream.malformed_events`) and yield an empty `Delta`.
"""

from __future__ import annotations

from typing import Final

from hopmeter.core.apis._base import DONE, EMPTY, ApiParser, Delta, content_delta
from hopmeter.core.apis._json import shown_error
from hopmeter.core.apis.anthropic import AnthropicParser
from hopmeter.core.apis.gemini import GeminiParser
from hopmeter.core.apis.heuristic import HeuristicParser
from hopmeter.core.apis.ollama import OllamaParser
from hopmeter.core.apis.openai import OpenAIChatParser, ResponsesParser
from hopmeter.core.apis.tgi import TgiParser
from hopmeter.core.apis.token_ids import TokenIdsParser
from hopmeter.core.vocab import UNKNOWN_APIS, Api

__all__ = ["DONE", "EMPTY", "ApiParser", "Delta", "content_delta", "make_parser", "shown_error"]

_PARSERS: Final[dict[str, type[ApiParser]]] = {
    Api.OPENAI_CHAT: OpenAIChatParser,
    Api.OPENAI_RESPONSES: ResponsesParser,
    Api.ANTHROPIC_MESSAGES: AnthropicParser,
    Api.GEMINI: GeminiParser,
    Api.TGI: TgiParser,
    Api.OLLAMA: OllamaParser,
    Api.TOKEN_IDS: TokenIdsParser,
}


def make_parser(api: Api) -> ApiParser:
    """A fresh parser for one flow speaking `api` (unknown names get the heuristic one)."""
    cls = _PARSERS.get(api)
    return cls() if cls is not None else HeuristicParser(api if api in UNKNOWN_APIS else Api.OTHER)
