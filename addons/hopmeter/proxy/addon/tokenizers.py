"""Tokenizers for counting: vocabularies read from the package or a file, one counter per model.

Tokenizers never come from the network. hopmeter ships OpenAI's `o200k_base` and `cl100k_base`
vocabularies (hopmeter/data/*.tiktoken.gz, byte-identical to the files tiktoken pins by sha256)
and counts with them through hopmeter.core.bpe: each vocabulary becomes a rank table (~4 MiB for
o200k_base), built once and kept in the cache directory (`cache_dir()`), from where every later
start maps it read-only: opening it costs nothing, and its pages are read in, and shared between
processes, as counting touches them. Other encodings come from a file (`--tokenizer PATH`: a
`.tiktoken` file gets a table the same way; a Hugging Face `tokenizer.json` goes through the
optional `tokenizers` package).

Model to encoding (`MODEL_ENCODINGS`): OpenAI's own models get their encoding (`exact`); every
other model (Llama, Claude, Gemini, Mistral, Qwen, DeepSeek, ...) is counted with o200k_base as a
proxy: still source "tokenizer" (closer than the estimate: a modern ~130k-256k BPE vocabulary splits
text much like o200k), but `exact` is False. Where the stream reports usage, per-event counts are
reconciled to it anyway (hopmeter.core.tokens.reconcile), so the proxy only shapes the split between
events. The counting itself (`TokenCounter`, the estimate) is in the core.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib
import mmap
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from hopmeter.core.bpe import (
    HEADER,
    PRE_TOKENIZERS,
    BpeCounter,
    PreTokenizer,
    RankTable,
    TableError,
    build_table,
    parse_tiktoken,
    pre_tokenizer_for,
)
from hopmeter.core.tokens import Counter, TokenCounter, estimate_counter
from hopmeter.core.vocab import TokenSource
from hopmeter.errors import TokenizerError
from hopmeter.log import get_logger

log = get_logger()

DEFAULT_ENCODING: Final = "o200k_base"

# What a thread does just before it loads a shipped vocabulary's table: `BUILD_GATE.wait()` if
# that thread set one (hopmeter.proxy.addon.tokenizer_load waits for a quiet loop).
BUILD_GATE = threading.local()


@dataclass(frozen=True, slots=True)
class ShippedVocabulary:
    """A vocabulary in hopmeter/data."""

    file: str
    sha256: str  # of the decompressed .tiktoken file: the hash tiktoken_ext.openai_public pins
    url: str  # where OpenAI publishes it


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
    return spec, _encoding(name)


def _encoding(name: str) -> Callable[[str], int]:
    vocab = SHIPPED.get(name)
    if vocab is None:
        known = ", ".join(sorted(SHIPPED))
        raise TokenizerError(
            f"tokenizer {name!r} is not shipped with hopmeter (it has {known}); "
            "pass --tokenizer PATH to a .tiktoken or tokenizer.json file"
        )
    gate = getattr(BUILD_GATE, "wait", None)
    if gate is not None:
        gate()
    sha = bytes.fromhex(vocab.sha256)
    return _counting(_table(name, sha, lambda: _shipped_bytes(vocab)), PRE_TOKENIZERS[name])


# The table counters made before the first flow; from then on each one's full pattern is
# compiled in a thread as soon as it is made (hopmeter.core.bpe.Splitter), so that the first
# non-ASCII text finds it ready rather than waiting on the loop. o200k_base's is compiled when
# hopmeter.core.bpe is imported (there, preparing finds it done); another encoding's is
# compiled here.
_WAITING: list[BpeCounter] = []
_TRAFFIC = threading.Event()
_TRAFFIC_LOCK = threading.Lock()


def _counting(table: RankTable, pre_tokenizer: PreTokenizer) -> BpeCounter:
    counter = BpeCounter(table, pre_tokenizer)
    with _TRAFFIC_LOCK:
        if not _TRAFFIC.is_set():
            _WAITING.append(counter)
            return counter
    _in_thread([counter.split.prepare])
    return counter


def traffic_started(then: Callable[[], None] | None = None) -> None:
    """A flow has started: compile every counter's full pattern in a thread, then call `then`
    there (`hopmeter run` freezes the heap the compiler left; hopmeter.proxy.run.runner). Called for
    every flow: after the first, one flag read."""
    if _TRAFFIC.is_set():
        return
    with _TRAFFIC_LOCK:
        if _TRAFFIC.is_set():
            return
        _TRAFFIC.set()
        steps = [c.split.prepare for c in _WAITING]
        _WAITING.clear()
    _in_thread([*steps, *([then] if then is not None else [])])


def _in_thread(steps: list[Callable[[], object]]) -> None:
    def run() -> None:
        try:
            for step in steps:
                step()
        except Exception as exc:  # counting non-ASCII text will raise it again, and say so
            log.warning("hopmeter: cannot prepare the tokenizer's pattern", error=repr(exc))

    if steps:
        threading.Thread(target=run, name="hopmeter-pattern", daemon=True).start()


def cache_dir() -> Path | None:
    """Where rank tables are kept: $HOPMETER_CACHE_DIR, else $XDG_CACHE_HOME/hopmeter, else
    ~/.cache/hopmeter; None when there is no home directory to put it in (tables in memory)."""
    if os.environ.get("HOPMETER_CACHE_DIR"):
        return Path(os.environ["HOPMETER_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "hopmeter"
    home = os.path.expanduser("~")
    if home.startswith("~"):  # no $HOME and no password entry: not a path relative to the cwd
        return None
    return Path(home) / ".cache" / "hopmeter"


def _table(stem: str, sha: bytes, source: Callable[[], bytes]) -> RankTable:
    """The rank table of a vocabulary (`source` gives its .tiktoken bytes, `sha` their SHA-256):
    mapped from the cache when it holds it, else built (~0.3 s for o200k_base) and written there;
    kept in memory when there is no cache to write (no home, a read-only file system)."""
    directory = cache_dir()
    path = None if directory is None else directory / f"{stem}-{sha.hex()[:16]}.bpe"
    if path is not None:
        try:
            return _map(path, sha)
        except FileNotFoundError:
            pass
        except (OSError, TableError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            log.info("hopmeter: rebuilding a token table", path=str(path), reason=reason)
    try:
        image = build_table(parse_tiktoken(source()), sha)
    except TableError as exc:
        raise TokenizerError(f"{stem} is not a .tiktoken file (base64 token, rank): {exc}") from exc
    reason = "no home directory for the cache"
    if path is not None:
        try:
            return _write_and_map(path, image, sha)
        except (OSError, TableError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
    log.warning(
        "hopmeter: token table kept in memory, not shared",
        path=None if path is None else str(path),
        reason=reason,
        fix="set HOPMETER_CACHE_DIR to a writable directory",
    )
    try:
        return RankTable(image, sha)
    except TableError as exc:  # a big-endian machine: the format is little-endian
        raise TokenizerError(f"cannot count with a token table here: {exc}") from exc


def _write_and_map(path: Path, image: bytes, sha: bytes) -> RankTable:
    """Write a table to the cache, whole or not at all (other processes read it), and map it.

    Written a page at a time: the page cache keeps a file in pieces the size of the writes that
    filled it, and a fault on a mapping maps the whole piece its page is in. Written in one
    call, the table sat in the cache as a few large pieces, and counting the first flow's words
    made all 4 MiB of it resident in every process that maps it; written by the page, a lookup
    maps a page and its neighbours (the kernel's fault-around, 64 KiB), ~0.2 MiB after a flow.
    """
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_by_page(partial, image)
        partial.replace(path)
        return _map(path, sha)
    except (OSError, TableError):
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise


BINARY: Final = getattr(os, "O_BINARY", 0)  # Windows reads and writes text otherwise


def _write_by_page(path: Path, image: bytes) -> None:
    """Write `image` to a new file at `path` in page-sized writes (`_write_and_map` says why)."""
    view = memoryview(image)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | BINARY, 0o644)
    try:
        for start in range(0, len(view), mmap.PAGESIZE):
            piece = view[start : start + mmap.PAGESIZE]
            while piece:
                piece = piece[os.write(fd, piece) :]
    finally:
        os.close(fd)


def _map(path: Path, sha: bytes) -> RankTable:
    """The table file at `path`, mapped read-only. Raises OSError or TableError.

    Its header is read without read-ahead (`POSIX_FADV_RANDOM`), as lookups read the mapping
    (`MADV_RANDOM`): read-ahead brings a file into the page cache in large pieces, which a fault
    then maps whole (`_write_and_map`)."""
    fd = os.open(path, os.O_RDONLY | BINARY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        header = os.read(fd, HEADER.size)
        if len(header) < HEADER.size:
            raise TableError("shorter than its header")
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    if hasattr(mmap, "MADV_RANDOM"):  # no read-ahead: a lookup reads one page, not 2 MiB
        mapped.madvise(mmap.MADV_RANDOM)
    try:
        return RankTable(mapped, sha, header=header)
    except TableError:
        mapped.close()
        raise


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
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TokenizerError(f"{path} is a damaged gzip file") from exc
    sha = hashlib.sha256(raw).digest()
    for name, vocab in SHIPPED.items():
        if vocab.sha256 == sha.hex():
            return _encoding(name)
    try:
        table = _table(path.name.split(".")[0] or "vocabulary", sha, lambda: raw)
    except TokenizerError as exc:
        raise TokenizerError(f"{path} is not a .tiktoken file (base64 token, rank)") from exc
    return _counting(table, pre_tokenizer_for(table.ranks))


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
        first flow instead, in a thread: hopmeter.proxy.addon.tokenizer_load)."""
        self.for_model(None)


def load_counter(tokenizer: str | None) -> Counters:
    """The counters for this process; `tokenizer` forces one encoding or file for every flow."""
    return Counters(tokenizer)
