"""Tokens per event, best source first, reconciled to the stream's usage total (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hopmeter.core.tokens import estimate_tokens, reconcile


class Counter(Protocol):
    """A token counter: a tokenizer, or the estimate."""

    source: str

    def count(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenAccount:
    """Per-event token counts and where they came from."""

    per_event: tuple[int, ...]
    source: str  # "stream" | "usage" | "tokenizer" | "estimate" (what the final counts rest on)
    counted: int  # sum before reconciliation
    counted_source: str  # the best source used before reconciliation
    usage: int | None  # the stream's own total, when it sent one
    mismatch: int | None  # usage - hidden reasoning - counted
    hidden_reasoning: int = 0  # reasoning tokens in usage that no event carried


def account_tokens(
    *,
    stream_tokens: Sequence[int],
    texts: Sequence[str],
    overflow: Sequence[bool],
    usage: int | None,
    counter: Counter,
    hidden_reasoning: int | None = None,
) -> TokenAccount:
    """Count each event's tokens from the stream, else the tokenizer, else an estimate.

    `stream_tokens[i]` is -1 when the stream says nothing about event i; `overflow[i]` marks events
    whose text was not kept (past the per-flow text bound), which are estimated.
    `hidden_reasoning` is the part of `usage` spent on reasoning that was never streamed (OpenAI
    reasoning models, Gemini thinking without summaries): it is taken off the total before the
    visible events are reconciled to it, or they would be inflated many times over.
    """
    counts: list[int] = []
    append, count = counts.append, counter.count
    from_stream = estimated = tokenized = False
    for given, text, lost in zip(stream_tokens, texts, overflow, strict=True):
        if given >= 0:
            append(given)
            from_stream = from_stream or given > 0
        elif lost:
            append(1)
            estimated = True
        elif text:
            append(count(text) or 1)
            tokenized = True
        else:
            append(0)
    sources = {
        name for name, seen in (("stream", from_stream), ("estimate", estimated)) if seen
    } | ({counter.source} if tokenized else set())
    counted = sum(counts)
    counted_source = _weakest(sources)
    hidden = min(hidden_reasoning or 0, usage or 0)
    target = None if usage is None else usage - hidden
    if target is not None and target > 0 and any(counts):
        # the stream's own total is the best count there is; per-event counts are scaled to it
        final = counts if counted == target else reconcile(counts, target)
        return TokenAccount(
            per_event=tuple(final),
            source="usage",
            counted=counted,
            counted_source=counted_source,
            usage=usage,
            mismatch=target - counted,
            hidden_reasoning=hidden,
        )
    return TokenAccount(
        per_event=tuple(counts),
        source=counted_source,
        counted=counted,
        counted_source=counted_source,
        usage=usage,
        mismatch=None if target is None else target - counted,
        hidden_reasoning=hidden,
    )


_STRENGTH = {"stream": 0, "tokenizer": 1, "estimate": 2}


def _weakest(sources: set[str]) -> str:
    """A mix of sources is only as good as its weakest member."""
    if not sources:
        return "stream"
    return max(sources, key=lambda s: _STRENGTH.get(s, 3))


class EstimateCounter:
    """The fallback counter: no vocabulary, a heuristic from the text's shape."""

    source = "estimate"

    def count(self, text: str) -> int:
        """Estimated tokens in `text`."""
        return estimate_tokens(text)
