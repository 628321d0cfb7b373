"""Counting tokens in event text: a real tokenizer when one loads, else an estimate (DESIGN.md §6).

Tokenizers never come from the network. hopmeter ships OpenAI's `o200k_base` and `cl100k_base`
vocabularies (hopmeter/data/*.tiktoken.gz, byte-identical to the files tiktoken pins by sha256) and
hands them to tiktoken through tiktoken's own cache: the decompressed file is written once, checked
against tiktoken's pinned hash, where tiktoken looks for it (`$TIKTOKEN_CACHE_DIR`, else
`$DATA_GYM_CACHE_DIR`, else `<tmp>/data-gym-cache`), so tiktoken builds the encoding exactly as it
would online and never downloads. Other encodings come from a file (`--tokenizer PATH`).

Model to encoding (`MODEL_ENCODINGS`): OpenAI's own models get their encoding (`exact`); every
other model (Llama, Claude, Gemini, Mistral, Qwen, DeepSeek, ...) is counted with o200k_base as a
proxy: still source "tokenizer" (closer than the estimate: a modern ~130k-256k BPE vocabulary splits
text much like o200k), but `exact` is False. Where the stream reports usage, per-event counts are
reconciled to it anyway (`reconcile`), so the proxy only shapes the split between events.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from hopmeter.core.frames import HopmeterError

DEFAULT_ENCODING: Final = "o200k_base"


@dataclass(frozen=True, slots=True)
class ShippedVocabulary:
    """A vocabulary in hopmeter/data and where tiktoken expects it."""

    file: str
    sha256: str  # of the decompressed .tiktoken file: the hash tiktoken_ext.openai_public pins
    url: str  # tiktoken's source URL; its cache key is sha1(url)


_BLOB = "https://openaipublic.blob.core.windows.net/encodings/"
SHIPPED: Final = {
    "o200k_base": ShippedVocabulary(
        "o200k_base.tiktoken.gz",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _BLOB + "o200k_base.tiktoken",
    ),
    "cl100k_base": ShippedVocabulary(
        "cl100k_base.tiktoken.gz",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _BLOB + "cl100k_base.tiktoken",
    ),
}
# Names tiktoken knows that count ordinary text like a shipped encoding (extra specials only).
ALIASES: Final = {"o200k_harmony": "o200k_base"}

# Model name (lower case) -> (encoding, exact). First match wins. OpenAI's model table in tiktoken
# (tiktoken/model.py) puts gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1, o3, o4, chatgpt-4o and gpt-oss on
# o200k_base and gpt-4, gpt-3.5 and the text-embedding-3/ada-002 models on cl100k_base.
MODEL_ENCODINGS: Final = (
    (
        re.compile(r"(^|/)(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o[134]\b|o[134]-|chatgpt-|gpt-oss)"),
        "o200k_base",
        True,
    ),
    (
        re.compile(r"(^|/)(gpt-4|gpt-3\.5|gpt-35|text-embedding-3|text-embedding-ada)"),
        "cl100k_base",
        True,
    ),
)

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


class TokenizerError(HopmeterError):
    """A tokenizer named by the user cannot be loaded; the message says what to do."""


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
        source: str,
        exact: bool,
        count: Callable[[str], int],
        fallback_reason: str | None = None,
    ) -> None:
        self.name = name  # encoding name, file name, or "estimate"
        self.source = source  # "tokenizer" | "estimate"
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
        source="estimate",
        exact=False,
        count=estimate_tokens,
        fallback_reason=reason,
    )


def encoding_for_model(model: str | None) -> tuple[str, bool]:
    """The encoding to count `model`'s text with, and whether it is the model's own."""
    name = (model or "").lower()
    for pattern, encoding, exact in MODEL_ENCODINGS:
        if pattern.search(name):
            return encoding, exact
    return DEFAULT_ENCODING, False


def make_counter(
    model: str | None, tokenizer: str | None = None, *, strict: bool = False
) -> TokenCounter:
    """A counter for `model`, or for the tokenizer the user named (`--tokenizer NAME|PATH`).

    A tokenizer that cannot load gives the estimate with `fallback_reason` set; with `strict`, a
    user-named one raises TokenizerError instead (for checking `--tokenizer` at start-up).
    """
    if tokenizer:
        spec, exact = tokenizer, True
    else:
        spec, exact = encoding_for_model(model)
    try:
        name, count = _load(spec)
    except TokenizerError as exc:
        if strict and tokenizer:
            raise
        return estimate_counter(str(exc))
    return TokenCounter(name=name, source="tokenizer", exact=exact, count=count)


def check_tokenizer(tokenizer: str) -> None:
    """Raise TokenizerError (one line, with the fix) when `--tokenizer` cannot be used."""
    make_counter(None, tokenizer, strict=True)


# Loaded tokenizers, by spec. A handful at most: one per encoding or file a deployment names.
@functools.lru_cache(maxsize=8)
def _load(spec: str) -> tuple[str, Callable[[str], int]]:
    path = Path(spec).expanduser()
    if spec.endswith(".json"):
        return path.name, _load_hf_json(path)
    if spec.endswith((".tiktoken", ".tiktoken.gz")) or os.sep in spec:
        return path.name, _load_tiktoken_file(path)
    name = ALIASES.get(spec, spec)
    return spec, _encoding(name).encode_ordinary_len


class _Counting:
    """Adapts an encoder's `encode_ordinary` to a token count."""

    __slots__ = ("_encode",)

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        self._encode = encode

    def encode_ordinary_len(self, text: str) -> int:
        return len(self._encode(text))


def _encoding(name: str) -> _Counting:
    try:
        import tiktoken  # noqa: PLC0415 - a heavy import, needed only when counting
    except ImportError as exc:
        raise TokenizerError("tiktoken is not installed: pip install tiktoken") from exc
    vocab = SHIPPED.get(name)
    if vocab is None:
        known = ", ".join(sorted(SHIPPED))
        raise TokenizerError(
            f"tokenizer {name!r} is not shipped with hopmeter (it has {known}); "
            "pass --tokenizer PATH to a .tiktoken or tokenizer.json file"
        )
    _prime_tiktoken_cache(vocab)
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]  # noqa: PLC0415

    # tiktoken.get_encoding would do the same, into an Encoding its registry shares; this one is
    # hopmeter's own, so it may drop the Python copy of the vocabulary below.
    args = openai_public.ENCODING_CONSTRUCTORS[name]()
    enc = tiktoken.Encoding(**args)
    # The encoder (Rust) copied the ranks when it was built and counts without them; the Python
    # dict of 200,000 byte strings (~28 MiB of the process's RSS) serves only to pickle the
    # Encoding, which hopmeter never does.
    args["mergeable_ranks"].clear()
    return _Counting(enc.encode_ordinary)


def _prime_tiktoken_cache(vocab: ShippedVocabulary) -> None:
    """Put the shipped vocabulary where tiktoken looks before it downloads (see module doc)."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not cache_dir:
        raise TokenizerError("TIKTOKEN_CACHE_DIR is empty, which makes tiktoken download; unset it")
    target = Path(cache_dir) / hashlib.sha1(vocab.url.encode()).hexdigest()  # noqa: S324
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == vocab.sha256:
        return
    data = _shipped_bytes(vocab)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        partial.write_bytes(data)
        partial.replace(target)
    except OSError as exc:
        raise TokenizerError(f"cannot write tiktoken's cache {cache_dir}: {exc.strerror}") from exc


def _shipped_bytes(vocab: ShippedVocabulary) -> bytes:
    try:
        packed = resources.files("hopmeter").joinpath("data", vocab.file).read_bytes()
        data = gzip.decompress(packed)
    except (OSError, EOFError) as exc:
        raise TokenizerError(f"hopmeter's {vocab.file} is missing or damaged: reinstall") from exc
    if hashlib.sha256(data).hexdigest() != vocab.sha256:
        raise TokenizerError(f"hopmeter's {vocab.file} does not match its hash: reinstall")
    return data


def _load_tiktoken_file(path: Path) -> Callable[[str], int]:
    """A `.tiktoken` BPE file (one `base64-token rank` per line), plain or gzip'd."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"cannot read tokenizer file {path}: {exc.strerror}") from exc
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    digest = hashlib.sha256(raw).hexdigest()
    for name, vocab in SHIPPED.items():
        if vocab.sha256 == digest:
            return _encoding(name).encode_ordinary_len
    try:
        ranks = {
            base64.b64decode(tok): int(rank)
            for tok, rank in (line.split() for line in raw.splitlines() if line)
        }
    except ValueError as exc:
        raise TokenizerError(f"{path} is not a .tiktoken file (base64 token, rank)") from exc
    import tiktoken  # noqa: PLC0415
    from tiktoken_ext import openai_public  # noqa: PLC0415

    # The file says nothing of its pre-tokenizer: take the pattern of the OpenAI encoding of its
    # size (GPT-2's up to 60k tokens, cl100k's up to 150k, o200k's beyond).
    if len(ranks) <= 60_000:
        pattern = openai_public.r50k_pat_str
    else:
        near = "cl100k_base" if len(ranks) <= 150_000 else "o200k_base"
        _prime_tiktoken_cache(SHIPPED[near])
        # the constructor's arguments, not tiktoken.get_encoding: that would keep a second
        # vocabulary (~75 MiB) in the registry for the sake of one string
        pattern = openai_public.ENCODING_CONSTRUCTORS[near]()["pat_str"]
    enc = tiktoken.Encoding(
        name=path.name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
    )
    ranks.clear()  # the encoder holds its own copy (see _encoding)
    return _Counting(enc.encode_ordinary).encode_ordinary_len


def _load_hf_json(path: Path) -> Callable[[str], int]:
    """A Hugging Face `tokenizer.json`, through the optional `tokenizers` package."""
    if not path.is_file():
        raise TokenizerError(f"tokenizer file {path} does not exist")
    try:
        hf = importlib.import_module("tokenizers")  # optional: Rust wheels, ~9 MB
    except ImportError as exc:
        raise TokenizerError(
            f"{path.name} needs the 'tokenizers' package: pip install tokenizers"
        ) from exc
    try:
        tok = hf.Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises its own bare Exception types
        raise TokenizerError(f"{path} is not a tokenizer.json file: {exc}") from exc

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return count


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
    while left < 0:  # the minimum of one overshot: take back from the most over quota
        i = max((j for j in live if alloc[j] > 1), key=lambda j: (alloc[j] - quota[j], -j))
        alloc[i] -= 1
        left += 1
    return alloc
