"""Tokenizers for counting: vocabularies read from the package or a file, one counter per model.

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
reconciled to it anyway (hopmeter.core.tokens.reconcile), so the proxy only shapes the split between
events. The counting itself (`TokenCounter`, the estimate) is in the core.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib
import os
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from hopmeter.core.tokens import Counter, TokenCounter, estimate_counter
from hopmeter.core.vocab import TokenSource
from hopmeter.errors import TokenizerError
from hopmeter.log import get_logger

log = get_logger()

DEFAULT_ENCODING: Final = "o200k_base"

# What a thread does just before tiktoken builds an encoder, which holds the GIL for 0.2-1 s:
# `BUILD_GATE.wait()` if that thread set one (hopmeter.proxy.tokenizer_load waits for a quiet loop).
BUILD_GATE = threading.local()


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
    return TokenCounter(name=name, source=TokenSource.TOKENIZER, exact=exact, count=count)


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
    gate = getattr(BUILD_GATE, "wait", None)
    if gate is not None:
        gate()
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


# Model names come from traffic, so the cache is bounded; 256 distinct models is far more than one
# deployment serves, and a miss only costs a dictionary lookup in the tokenizer library's own cache.
MAX_CACHED_MODELS = 256


class Counters:
    """Chooses a counter by model name, or uses the one named by `--tokenizer`."""

    def __init__(self, tokenizer: str | None) -> None:
        """Raises TokenizerError when a named tokenizer cannot be used (checked at start-up)."""
        if tokenizer:
            check_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self._by_model: dict[str | None, Counter] = {}
        self._warned: set[str] = set()

    def for_model(self, model: str | None) -> Counter:
        """The counter for `model` (the forced tokenizer when one was given)."""
        key = None if self.tokenizer else model
        counter = self._by_model.get(key)
        if counter is None:
            counter = make_counter(model, self.tokenizer)
            reason = getattr(counter, "fallback_reason", None)
            if reason and reason not in self._warned:
                self._warned.add(reason)
                log.warning("hopmeter: tokens are estimated", reason=reason)
            if len(self._by_model) >= MAX_CACHED_MODELS:
                self._by_model.clear()
            self._by_model[key] = counter
        return counter

    def preload(self) -> None:
        """Load the default encoding now (~0.3 s) (with `--lazy-tokenizer` it is loaded at the
        first flow instead, in a thread: hopmeter.proxy.tokenizer_load)."""
        self.for_model(None)


def load_counter(tokenizer: str | None) -> Counters:
    """The counters for this process; `tokenizer` forces one encoding or file for every flow."""
    return Counters(tokenizer)
