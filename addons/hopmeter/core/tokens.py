"""Counting tokens: per event, best source first, reconciled to the stream's usage total.

The stream's own counts come first (token ids, logprobs, TGI's `token`); then a tokenizer on the
event's text; then an estimate from the text's shape (`estimate_tokens`). When the stream ends with
a usage total, per-event counts are scaled to it (`reconcile`). Tokenizers are built outside the
core (hopmeter.proxy.addon.tokenizers reads their vocabularies); here a counter is anything with
`count(text)` and a `source`.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from hopmeter.core.vocab import TokenSource

# The estimate, calibrated against o200k_base on the 3,115 visible event texts of the development
# corpus (shared/corpus): mean absolute error 0.2 tokens per event and +3% over the whole text,
# where the common "UTF-8 bytes / 4" rule has 0.8 tokens per event. Pieces are split like a BPE
# pre-tokenizer splits them: letters, digits, other symbols, whitespace.
_PIECES: Final = re.compile(r"\s+|[^\W\d_]+|\d+|_+|[^\w\s]+")
LETTERS_PER_TOKEN: Final = 9  # a Latin-script word: one token per started 9 letters
OTHER_LETTERS_PER_TOKEN: Final = 6  # Cyrillic, Greek, Arabic, Indic ... words split more
DIGITS_PER_TOKEN: Final = 3  # o200k and cl100k split numbers into groups of 3 digits
SYMBOLS_PER_TOKEN: Final = 3  # runs of ASCII punctuation such as `{"`, `":`, `**`
SYMBOL_BYTES_PER_TOKEN: Final = 3  # other symbols (emoji, CJK punctuation) by UTF-8 bytes
CJK_TOKENS_PER_CHAR: Final = 0.7  # o200k: 14 tokens for 20 Chinese characters in our sample
# Ideographs, kana and hangul: scripts without spaces between words.
_CJK: Final = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ffff]")


def estimate_tokens(text: str) -> int:
    """Tokens in `text` by the heuristic above (0 for "", at least 1 otherwise)."""
    if not text:
        return 0
    n = 0
    for match in _PIECES.finditer(text):
        piece = match.group()
        first = piece[0]
        if first.isspace():
            n += piece != " "  # a lone space joins the next word
        elif first.isalpha():
            if piece.isascii():
                n += 1 + (len(piece) - 1) // LETTERS_PER_TOKEN
            else:
                cjk = len(_CJK.findall(piece))
                rest = len(piece) - cjk
                n += math.ceil(cjk * CJK_TOKENS_PER_CHAR)
                n += 1 + (rest - 1) // OTHER_LETTERS_PER_TOKEN if rest else 0
        elif first.isdigit():
            n += math.ceil(len(piece) / DIGITS_PER_TOKEN)
        elif piece.isascii():
            n += math.ceil(len(piece) / SYMBOLS_PER_TOKEN)
        else:
            n += math.ceil(len(piece.encode()) / SYMBOL_BYTES_PER_TOKEN)
    return max(1, n)


# TokenCounter remembers the counts of texts up to this long, at most this many of them.
MEMO_MAX_CHARS = 24
MEMO_ENTRIES = 4096


class TokenCounter:
    """Counts tokens in one event's text with one tokenizer (or the estimate)."""

    __slots__ = ("_count", "_memo", "exact", "fallback_reason", "name", "source")

    def __init__(
        self,
        *,
        name: str,
        source: TokenSource,
        exact: bool,
        count: Callable[[str], int],
        fallback_reason: str | None = None,
    ) -> None:
        self.name = name  # encoding name, file name, or "estimate"
        self.source = source  # TOKENIZER or ESTIMATE
        self.exact = exact  # the model's own tokenizer; False for a proxy tokenizer or estimate
        self.fallback_reason = fallback_reason  # why a tokenizer was not used
        self._count = count
        # Counts of short texts already seen. Most events carry one token and the same few
        # thousand tokens recur (" the", ","): a dict lookup is a tenth of a tokenizer call.
        # Bounded: cleared when full; in memory only, like the reply text a flow keeps anyway.
        self._memo: dict[str, int] = {}

    def count(self, text: str) -> int:
        """Tokens in `text`."""
        if len(text) > MEMO_MAX_CHARS:
            return self._count(text)
        n = self._memo.get(text)
        if n is None:
            if not text:
                return 0
            # every byte is a token in a byte-level BPE
            n = 1 if len(text) == 1 and text.isascii() else self._count(text)
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            self._memo[text] = n
        return n

    def __repr__(self) -> str:
        return f"TokenCounter({self.name!r}, source={self.source!r}, exact={self.exact})"


def estimate_counter(reason: str | None = None) -> TokenCounter:
    """The counter of last resort, keeping the reason a tokenizer was not used."""
    return TokenCounter(
        name="estimate",
        source=TokenSource.ESTIMATE,
        exact=False,
        count=estimate_tokens,
        fallback_reason=reason,
    )


def reconcile(counts: list[int], total: int) -> list[int]:
    """Scale per-event counts so they sum to `total` exactly (largest-remainder method).

    Each event's quota is `total * count / sum(counts)`. Events counted as zero stay zero (a
    prelude or `[DONE]` carries no tokens), unless all are zero: then `total` is spread evenly.
    An event that had tokens keeps at least one when `total` allows (total >= events with tokens);
    the ones most over their quota give way first. Ties go to the earlier event. When
    `total == sum(counts)` the counts come back unchanged.
    """
    n = len(counts)
    if n == 0 or total <= 0:
        return [0] * n
    weights = counts if any(c > 0 for c in counts) else [1] * n
    weights = [max(0, c) for c in weights]
    whole = sum(weights)
    quota = [total * w / whole for w in weights]
    alloc = [math.floor(q) for q in quota]
    live = [i for i in range(n) if weights[i] > 0]
    if total >= len(live):
        for i in live:
            alloc[i] = max(1, alloc[i])
    left = total - sum(alloc)
    order = sorted(live, key=lambda i: (alloc[i] - quota[i], i))  # most under quota first
    for i in order[: max(0, left)]:
        alloc[i] += 1
    if left < 0:  # the minimum of one overshot: take back from the most over quota, one at a time
        _take_back(alloc, quota, live, -left)
    return alloc


def _take_back(alloc: list[int], quota: list[float], live: list[int], k: int) -> None:
    """Take `k` tokens back, one at a time from the event most over its quota that keeps one
    (ties: the earlier event), as `max(alloc[j] - quota[j], -j)` picked anew each time would.

    A heap keeps every candidate at its current excess: k steps of log n, where picking anew
    was k scans of every event (an 8,192-event flow whose usage total undercut the minimum of
    one stalled the loop for seconds).
    """
    heap = [(quota[j] - alloc[j], j) for j in live if alloc[j] > 1]
    heapq.heapify(heap)
    for _ in range(k):
        _, i = heapq.heappop(heap)
        alloc[i] -= 1
        if alloc[i] > 1:
            heapq.heappush(heap, (quota[i] - alloc[i], i))


class Counter(Protocol):
    """A token counter: a tokenizer, or the estimate."""

    source: TokenSource  # TOKENIZER or ESTIMATE

    def count(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenAccount:
    """Per-event token counts and where they came from."""

    per_event: tuple[int, ...]
    source: TokenSource  # what the final counts rest on
    counted: int  # sum before reconciliation
    counted_source: TokenSource  # the best source used before reconciliation
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
        name
        for name, seen in ((TokenSource.STREAM, from_stream), (TokenSource.ESTIMATE, estimated))
        if seen
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
            source=TokenSource.USAGE,
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


_STRENGTH = {TokenSource.STREAM: 0, TokenSource.TOKENIZER: 1, TokenSource.ESTIMATE: 2}


def _weakest(sources: set[TokenSource]) -> TokenSource:
    """A mix of sources is only as good as its weakest member."""
    if not sources:
        return TokenSource.STREAM
    return max(sources, key=lambda s: _STRENGTH.get(s, 3))
