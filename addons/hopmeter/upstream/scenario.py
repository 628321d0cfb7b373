"""What the demo upstream does to one reply: its token clock and the faults it can play.

A scenario is set per server (command-line flags) and overridden per request, by the query string
or an `X-Hopmeter-Scenario: key=value;key=value` header, so one running upstream can play every
case a test or a probe needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from hopmeter.errors import ScenarioError


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One reply's shape. Times in seconds; token positions count from 0."""

    tokens: int = 40  # output tokens in the reply
    rate: float = 50.0  # token clock, tokens per second
    ttft_s: float = 0.05  # prefill: request to the first byte
    prelude_s: float = 0.0  # role prelude sent at once, then this wait before the first token
    coalesce: int = 1  # tokens per event (origin coalescing)
    reasoning: int = 0  # reasoning tokens before the answer
    jitter: float = 0.0  # each interval times uniform(1 - jitter, 1 + jitter)
    seed: int = 1
    stall_at: int = -1  # token index before which the stream stalls
    stall_s: float = 0.9
    emoji: bool = False  # the reply includes emoji and CJK tokens
    fffd: bool = False  # emit U+FFFD where a server decoding tokens alone would
    split_writes: bool = False  # write each event in two pieces, cut inside a character if any
    split_cuts: int = 0  # with split_writes: this many cuts at random offsets (seeded) instead
    line_ending: str = "lf"  # "lf" | "crlf" | "cr"
    gzip: bool = False  # Content-Encoding: gzip without per-event flush (a compressor holding)
    gzip_flush: bool = False  # gzip with a sync flush per event (streams, still compressed)
    buffered: bool = False  # whole body at the end with Content-Length and ETag (body hashing)
    error_at: int = -1  # an error event after this many tokens, then the end
    cut_at: int = -1  # the connection is cut after this many tokens
    stream: bool | None = None  # force streamed / not streamed (default: what the request asks)
    usage: bool = True  # send usage at the end where the API can
    headers: str = "good"  # "good" (X-Accel-Buffering: no, no-cache) | "bare"
    replay: str = ""  # name of a transcript loaded with --replay

    def intervals(self) -> list[float]:
        """Seconds between consecutive tokens (len = tokens - 1), jittered deterministically."""
        import random  # noqa: PLC0415 - seeded generator, only when jitter is on

        rng = random.Random(self.seed)
        base = 1.0 / self.rate if self.rate > 0 else 0.0
        out = []
        for i in range(1, self.total_tokens):
            gap = base
            if self.jitter:
                gap *= rng.uniform(1 - self.jitter, 1 + self.jitter)
            if i == self.stall_at:
                gap += self.stall_s
            out.append(gap)
        return out

    @property
    def total_tokens(self) -> int:
        """Reasoning plus answer tokens."""
        return self.reasoning + self.tokens


_FIELDS = {f.name: f for f in fields(Scenario)}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, raw: str) -> Any:
    kind = _FIELDS[name].type
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind in ("bool", "bool | None"):
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
    except ValueError as exc:
        raise ScenarioError(f"scenario {name}={raw!r}: expected {kind}") from exc
    return raw


def apply(base: Scenario, pairs: Iterable[tuple[str, str]]) -> Scenario:
    """`base` with each known key replaced; an unknown key is an error naming it."""
    changes: dict[str, Any] = {}
    for key, raw in pairs:
        name = key.strip().replace("-", "_")
        if name not in _FIELDS:
            known = ", ".join(sorted(_FIELDS))
            raise ScenarioError(f"unknown scenario key {key!r}; known keys: {known}")
        changes[name] = _convert(name, raw.strip())
    if changes.get("line_ending", base.line_ending) not in ("lf", "crlf", "cr"):
        raise ScenarioError("scenario line_ending must be lf, crlf or cr")
    result = replace(base, **changes)
    if result.coalesce < 1 or result.tokens < 0 or result.rate <= 0:
        raise ScenarioError("scenario needs coalesce >= 1, tokens >= 0 and rate > 0")
    return result


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """`key=value;key=value` (commas work too) as pairs."""
    out = []
    for part in text.replace(",", ";").split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        out.append((key, value if sep else "1"))
    return out


def from_request(base: Scenario, query: Mapping[str, str], header: str | None) -> Scenario:
    """The scenario for one request: server defaults, then the header, then the query string."""
    pairs = parse_pairs(header) if header else []
    pairs += [(k, v) for k, v in query.items() if k.replace("-", "_") in _FIELDS]
    return apply(base, pairs)
