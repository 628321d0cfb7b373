"""What the probe asks for, and what a `hopmeter upstream` at the origin will send back.

Sans-I/O. Every probe request is an ordinary streaming chat request any OpenAI-compatible or
Anthropic endpoint answers: a prompt asking for a reply rich in emoji and CJK. It also carries the
canary, an `X-Hopmeter-Scenario` header: a `hopmeter upstream` at the origin plays it (emoji and CJK
tokens, the line ending asked for, each event written in pieces cut at random byte offsets, on a
known token clock), so the probe knows every byte it should receive. The upstream names itself in
its response headers (`X-Hopmeter-Request-Id`, and `X-Hopmeter-Scenario`: the scenario it played);
a gateway such as LiteLLM renames them (`llm_provider-x-hopmeter-request-id`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hopmeter.upstream import formats
from hopmeter.upstream.scenario import Scenario, apply

# The scenario key asking the upstream to cut each event's write at random byte offsets (not yet
# known to every upstream: the probe falls back to the fixed cut of `split_writes`).
RANDOM_CUTS_KEY = "split_cuts"
RANDOM_CUTS = 3  # cuts per event: enough to land inside a 4-byte emoji and between CR and LF
DEFAULT_TOKENS = 40
DEFAULT_RATE = 20.0  # tokens per second: 40 tokens span ~2 s, long enough to see a hold
# A model name an operator can route to the canary origin; picked from /v1/models when listed.
CANARY_MODEL = "hopmeter-probe"
# What a real model is asked for: characters that break careless clients (4-byte emoji split
# across reads, CJK), in a reply long enough to time (tens of events).
PROMPT = (
    "Reply with 60 to 80 words about a cat's day in Tokyo, mixing English, at least ten emoji "
    "(such as 🐱 🌞 🍣 🚃) and Japanese or Chinese words (such as 猫, 日本語, 你好), one short "
    "sentence after another. No markdown, no lists."
)
# Anthropic requires max_tokens: room for the reply above (the demo upstream plays its scenario).
MAX_REPLY_TOKENS = 512
# Response headers by which a `hopmeter upstream` at the origin names itself, as sent and as a
# gateway that prefixes every upstream header (LiteLLM: `llm_provider-`) passes them on.
REQUEST_ID_HEADERS = ("x-hopmeter-request-id", "llm_provider-x-hopmeter-request-id")
SCENARIO_HEADERS = ("x-hopmeter-scenario", "llm_provider-x-hopmeter-scenario")
_CREATED = re.compile(rb'"created":\d+')  # the one field of a reply that depends on the clock
_ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


def header_of(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The first of `names` present in (lower-cased) response headers."""
    return next((headers[n] for n in names if n in headers), None)


def without_created(body: bytes) -> bytes:
    """A reply with its `created` fields zeroed: the one part that depends on the clock."""
    return _CREATED.sub(b'"created":0', body)


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """One probe request: the API spoken, the model, and the reply the canary asks for."""

    api: str = "openai"  # "openai" | "anthropic"
    model: str = CANARY_MODEL
    tokens: int = DEFAULT_TOKENS
    rate: float = DEFAULT_RATE
    line_ending: str = "crlf"
    seed: int = 1
    random_cuts: bool = True

    @property
    def path(self) -> str:
        """The route of this API."""
        return _PATHS[self.api]

    def pairs(self) -> list[tuple[str, str]]:
        """Every scenario key that shapes the reply, so no server-wide default can change it."""
        return [
            *(("tokens", str(self.tokens)), ("rate", repr(self.rate)), ("ttft_s", "0.05")),
            *(("prelude_s", "0"), ("coalesce", "1"), ("reasoning", "0"), ("jitter", "0")),
            *(("seed", str(self.seed)), ("stall_at", "-1"), ("emoji", "1"), ("fffd", "0")),
            *(("split_writes", "1"), ("line_ending", self.line_ending), ("gzip", "0")),
            *(("gzip_flush", "0"), ("buffered", "0"), ("error_at", "-1"), ("cut_at", "-1")),
            *(("stream", "1"), ("usage", "1"), ("headers", "good"), ("replay", "")),
        ]

    def header(self) -> str:
        """The X-Hopmeter-Scenario header value."""
        extra = [(RANDOM_CUTS_KEY, str(RANDOM_CUTS))] if self.random_cuts else []
        return ";".join(f"{k}={v}" for k, v in [*self.pairs(), *extra])

    def scenario(self) -> Scenario:
        """The scenario the upstream plays (the cut key changes write boundaries, not bytes)."""
        return apply(Scenario(), self.pairs())

    def request(self) -> dict[str, object]:
        """The JSON body of the request: any endpoint of the API can answer it."""
        doc: dict[str, object] = {
            "model": self.model,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPT}],
        }
        if self.api == "openai":
            doc["stream_options"] = {"include_usage": True}
        else:
            doc["max_tokens"] = MAX_REPLY_TOKENS
        return doc

    def plan(self) -> list[formats.Planned]:
        """The events a `hopmeter upstream` sends, in order."""
        s = self.scenario()
        if self.api == "anthropic":
            return formats.anthropic_messages(s, self.model)
        return formats.openai_chat(s, self.model, True)

    def expected_body(self) -> bytes:
        """The decoded body the client should receive from the canary, `created` zeroed."""
        body = b"".join(p.body for p in self.plan()).replace(b"\n", _ENDINGS[self.line_ending])
        return without_created(body)

    def clock_s(self) -> list[float]:
        """When the upstream sends each token-carrying event, seconds after it got the request."""
        s = self.scenario()
        due = [0.0]
        for gap in s.intervals():
            due.append(due[-1] + gap)
        return [
            s.ttft_s + s.prelude_s + due[p.last_token]
            for p in self.plan()
            if p.last_token is not None
        ]

    def expected_text(self) -> str:
        """The visible reply of the canary."""
        return "".join(formats.reply_tokens(self.scenario())[1])

    def played(self, headers: Mapping[str, str], text: str) -> bool:
        """Whether the origin played this canary: its scenario echoed back (an upstream that does
        not echo it: the reply's text is the canary's)."""
        echoed = header_of(headers, SCENARIO_HEADERS)
        if echoed is not None:
            return echoed == self.header()
        return header_of(headers, REQUEST_ID_HEADERS) is not None and text == self.expected_text()
