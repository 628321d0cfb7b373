"""Tests for hopmeter.proxy.addon.tokenizers: offline vocabularies, one counter per model."""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import os
import socket
from pathlib import Path

import pytest

from hopmeter.core.bpe import RankTable
from hopmeter.core.tokens import MEMO_ENTRIES, MEMO_MAX_CHARS, estimate_tokens
from hopmeter.errors import HopmeterError, TokenizerError
from hopmeter.proxy.addon import tokenizers
from hopmeter.proxy.addon.tokenizers import (
    SHIPPED,
    ShippedVocabulary,
    _load,
    _shipped_bytes,
    cache_dir,
    check_tokenizer,
    encoding_for_model,
    make_counter,
)
from tests.harness import tiktoken_ref
from tests.harness.procs import wait_for

DATA = Path(__file__).resolve().parents[3] / "addons" / "hopmeter" / "data"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No test here may reach the network, and each starts with an empty table cache."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a token counting test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    cache = tmp_path / "hopmeter-cache"
    monkeypatch.setenv("HOPMETER_CACHE_DIR", str(cache))
    _load.cache_clear()  # loaded tokenizers are cached per process
    return cache


@pytest.mark.parametrize(
    ("model", "encoding", "exact"),
    [
        ("gpt-4o-2024-08-06", "o200k_base", True),
        ("gpt-4.1-mini", "o200k_base", True),
        ("gpt-5-2025-08-07", "o200k_base", True),
        ("o3-mini", "o200k_base", True),
        ("openai/gpt-oss-120b", "o200k_base", True),
        ("gpt-4-turbo", "cl100k_base", True),
        ("gpt-3.5-turbo", "cl100k_base", True),
        ("claude-sonnet-4-5-20250929", "o200k_base", False),
        ("meta-llama/Llama-3.3-70B-Instruct", "o200k_base", False),
        ("gemini-2.5-pro", "o200k_base", False),
        ("o1-preview-is-not-o10", "o200k_base", True),
        (None, "o200k_base", False),
    ],
)
def test_model_to_encoding(model, encoding, exact):
    """OpenAI models get their own encoding; every other model o200k_base as a proxy."""
    assert encoding_for_model(model) == (encoding, exact)


def test_o200k_counts_offline_from_shipped_vocabulary(offline: Path):
    """gpt-4o's text is counted with o200k_base built from the shipped file, without a download."""
    counter = make_counter("gpt-4o")
    assert (counter.source, counter.name, counter.exact) == ("tokenizer", "o200k_base", True)
    assert counter.fallback_reason is None
    assert counter.count("Hello, world!") == 4
    assert counter.count("") == 0
    assert counter.count("<|endoftext|>") > 1  # special-token text is counted as plain text
    (table,) = offline.glob("o200k_base-*.bpe")  # built once, mapped by every later start
    assert RankTable(table.read_bytes(), bytes.fromhex(SHIPPED["o200k_base"].sha256)).ranks == (
        199_998
    )


def test_cl100k_counts_differ_from_o200k():
    """gpt-4 is counted with cl100k_base, which splits non-English text into more tokens."""
    text = "Привет, как дела? 猫がかわいい。"
    assert make_counter("gpt-4").count(text) > make_counter("gpt-4o").count(text)


@pytest.mark.parametrize(
    ("model", "encoding"), [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")]
)
def test_counts_equal_tiktokens_own_encoding(model: str, encoding: str):
    """hopmeter counts with its own rank table (hopmeter.core.bpe): exactly what tiktoken's
    registry encoding counts."""
    texts = [
        "Hello, world!",
        "Привет, как дела? 猫がかわいい。 مرحبا بالعالم",
        "def f(x):\n    return x ** 2  # squares\n\n\t\r\n",
        "emoji 🙂👍🏽 and a ZWJ family 👨‍👩‍👧 and é vs e\u0301",
        " ".join(f"word{i}" for i in range(500)),
        "".join(chr(c) for c in range(0x20, 0x2FF)),
    ]
    counter = make_counter(model)
    assert counter.name == encoding
    reference = tiktoken_ref.encoding(encoding)
    for text in texts:
        assert counter.count(text) == len(reference.encode_ordinary(text)), text[:40]


def test_non_openai_model_uses_proxy_tokenizer():
    """A Llama model is counted by o200k_base, marked as not its own tokenizer."""
    counter = make_counter("llama-3.3-70b")
    assert (counter.source, counter.exact) == ("tokenizer", False)


def test_shipped_files_match_pinned_hashes():
    """The shipped vocabularies decompress to exactly the bytes tiktoken pins."""
    for vocab in SHIPPED.values():
        data = gzip.decompress((DATA / vocab.file).read_bytes())
        assert hashlib.sha256(data).hexdigest() == vocab.sha256


def test_damaged_vocabulary_is_refused():
    """A vocabulary whose bytes do not match the pinned hash is never counted with."""
    fake = ShippedVocabulary("cl100k_base.tiktoken.gz", "0" * 64, "https://example.invalid/x")
    with pytest.raises(TokenizerError, match="does not match"):
        _shipped_bytes(fake)


def test_the_table_is_built_once_then_mapped(offline: Path, monkeypatch: pytest.MonkeyPatch):
    """The first load writes the table to the cache; later loads map it without building."""
    first = make_counter("gpt-4o").count("Streaming, finally!")
    (table,) = offline.glob("o200k_base-*.bpe")
    _load.cache_clear()

    def no_build(*args: object) -> bytes:
        raise AssertionError("the cached table was built again")

    monkeypatch.setattr(tokenizers, "build_table", no_build)
    assert make_counter("gpt-4o").count("Streaming, finally!") == first == 4
    assert table.stat().st_size < 5 * 2**20  # o200k_base: ~4 MiB, shared by every process


@pytest.mark.parametrize("damage", ["truncated", "other vocabulary", "empty"])
def test_a_damaged_cached_table_is_rebuilt(offline: Path, damage: str):
    """A table file cut short, built from another vocabulary or empty is built again."""
    expected = make_counter("gpt-4o").count("Привет, world: 12345!")
    (table,) = offline.glob("o200k_base-*.bpe")
    image = table.read_bytes()
    if damage == "truncated":
        table.write_bytes(image[:-100])
    elif damage == "other vocabulary":
        table.write_bytes(image[:8] + bytes(32) + image[40:])
    else:
        table.write_bytes(b"")
    _load.cache_clear()
    assert make_counter("gpt-4o").count("Привет, world: 12345!") == expected
    assert table.read_bytes() == image


def test_an_unwritable_cache_keeps_the_table_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A cache directory that cannot be created (a read-only file system) costs sharing, not
    counting: the table is kept in memory and counts the same."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HOPMETER_CACHE_DIR", str(blocker / "cache"))
    counter = make_counter("gpt-4o")
    assert (counter.source, counter.count("Hello, world!")) == ("tokenizer", 4)


def test_a_flow_start_compiles_the_full_pattern_in_the_background():
    """Once traffic has started, every counter's non-ASCII pattern is compiled in a thread, so
    the first non-ASCII text does not wait for it (hopmeter.core.bpe.Splitter)."""
    counter = make_counter("gpt-4")
    split = counter._count.split  # type: ignore[attr-defined]
    tokenizers.traffic_started()  # the proxy calls it at its first flow; once is enough
    wait_for(lambda: split.prepared, 30, "the pattern compiled in the background")
    assert counter.count("Grüße, 世界") == 8  # cl100k_base splits them more than o200k


def test_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """$HOPMETER_CACHE_DIR, else $XDG_CACHE_HOME/hopmeter, else ~/.cache/hopmeter."""
    monkeypatch.setenv("HOPMETER_CACHE_DIR", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("HOPMETER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "hopmeter"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "hopmeter"


def test_without_a_home_the_table_is_kept_in_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No cache directory and no home (a bare container user): counting works from memory, and
    nothing is written relative to the working directory (no "~" folder)."""
    for name in ("HOPMETER_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # as with no $HOME, no passwd
    monkeypatch.chdir(tmp_path)
    assert cache_dir() is None
    counter = make_counter("gpt-4o")
    assert (counter.source, counter.count("Hello, world!")) == ("tokenizer", 4)
    assert list(tmp_path.iterdir()) == []


def test_unshipped_encoding_falls_back_or_raises_when_strict():
    """An encoding hopmeter does not ship gives the estimate, or a one-line error when strict."""
    counter = make_counter(None, "r50k_base")
    assert counter.source == "estimate"
    assert counter.fallback_reason is not None and "--tokenizer PATH" in counter.fallback_reason
    with pytest.raises(TokenizerError) as err:
        check_tokenizer("r50k_base")
    assert isinstance(err.value, HopmeterError) and "\n" not in str(err.value)


def test_tokenizer_name_forces_encoding():
    """--tokenizer NAME counts every model's text with that encoding."""
    counter = make_counter("claude-3-opus", "cl100k_base")
    assert (counter.name, counter.exact) == ("cl100k_base", True)
    assert make_counter(None, "o200k_harmony").count("Hello, world!") == 4


def test_tiktoken_file_path(tmp_path: Path):
    """--tokenizer PATH reads a .tiktoken file: the shipped one is recognised by its hash."""
    path = tmp_path / "mine.tiktoken"
    path.write_bytes(gzip.decompress((DATA / "o200k_base.tiktoken.gz").read_bytes()))
    counter = make_counter(None, str(path))
    assert (counter.name, counter.count("Hello, world!")) == ("mine.tiktoken", 4)


def test_custom_tiktoken_file(tmp_path: Path):
    """A small custom BPE file counts with its own merges (GPT-2's pre-tokenizer for its size)."""
    ranks = [bytes([b]) for b in range(256)] + [b"ab", b"abab", b" ab"]
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for rank, tok in enumerate(ranks)]
    path = tmp_path / "tiny.tiktoken"
    path.write_text("\n".join(lines) + "\n")
    counter = make_counter(None, str(path))
    assert counter.count("abab") == 1
    assert counter.count("abab ab") == 2
    assert counter.count("xyz") == 3


def test_bad_tokenizer_files_are_clear_errors(tmp_path: Path):
    """Missing and malformed tokenizer files raise a one-line TokenizerError when strict."""
    with pytest.raises(TokenizerError, match="cannot read"):
        check_tokenizer(str(tmp_path / "missing.tiktoken"))
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not base64 and no rank\n")
    with pytest.raises(TokenizerError, match=r"not a \.tiktoken file"):
        check_tokenizer(str(bad))
    with pytest.raises(TokenizerError, match="does not exist"):
        check_tokenizer(str(tmp_path / "tokenizer.json"))


@pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is not None, reason="the tokenizers package is installed"
)
def test_hf_tokenizer_json_needs_tokenizers_package(tmp_path: Path):
    """A tokenizer.json without the optional tokenizers package says how to install it."""
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    with pytest.raises(TokenizerError, match="pip install tokenizers"):
        check_tokenizer(str(path))
    assert make_counter("m", str(path)).source == "estimate"


def test_estimate_counter():
    """The estimate counter says it is one, and counts like estimate_tokens."""
    counter = make_counter(None, "no-such-encoding")
    assert (counter.source, counter.name, counter.exact) == ("estimate", "estimate", False)
    assert counter.count("Hello there") == estimate_tokens("Hello there") == 2


def test_estimate_is_close_to_o200k_on_prose():
    """On English prose the estimate stays within 15% of o200k_base."""
    text = (
        "Streaming puts the first words on screen long before the last ones, because every hop "
        "forwards each token as it arrives instead of waiting for the whole reply. A buffering "
        "proxy, a compressing gateway or a misconfigured CDN can hold those tokens back for "
        "seconds, and the user sees nothing until the very end."
    )
    real = make_counter("gpt-4o").count(text)
    assert abs(estimate_tokens(text) - real) <= 0.15 * real


def test_memo_of_short_texts_is_exact_and_bounded():
    """Counts of short texts are remembered: the same answer as the tokenizer, a bounded memo."""
    counter = make_counter("gpt-4o")
    calls: list[str] = []
    tokenizer = counter._count

    def counting(text: str) -> int:
        calls.append(text)
        return tokenizer(text)

    counter._count = counting
    texts = [" the", " hello", "你好", "🙂", ",", "", "x" * (MEMO_MAX_CHARS + 1)]
    first = [counter.count(t) for t in texts]
    again = [counter.count(t) for t in texts]
    expected = [0 if not t else 1 if t in {",", "x"} else tokenizer(t) for t in texts]
    assert first == again == expected
    # each short text went to the tokenizer once; the long one each time
    assert calls.count(" the") == 1 and calls.count("x" * (MEMO_MAX_CHARS + 1)) == 2
    for i in range(MEMO_ENTRIES * 2):
        counter.count(f"w{i}")
    assert len(counter._memo) <= MEMO_ENTRIES


def mapped_kib(path: Path) -> int:
    """How much of the file at `path` is resident in this process's mappings, KiB."""
    resident, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                resident += int(fields[1])
    return resident


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
def test_counting_a_few_words_maps_a_few_pages_of_the_table(offline: Path):
    """A fresh table file, mapped, has only the pages its lookups touched (and the kernel's
    fault-around) resident in the process, not the whole ~4 MiB: the file is written by the
    page, so the page cache holds no large piece of it that a fault would map whole."""
    counter = make_counter("gpt-4o")  # builds the table, writes it, maps it
    (table,) = offline.glob("o200k_base-*.bpe")
    assert counter.count("Hello, world!") == 4
    assert 0 < mapped_kib(table) <= 1024
