"""Tests for hopmeter.core.bpe: rank tables and BPE counts, held to tiktoken's on the same text."""

from __future__ import annotations

import base64
import gzip
import hashlib
import random
import re
import sys
from bisect import bisect_right
from functools import cache
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from hopmeter.core import bpe
from hopmeter.core.bpe import (
    ASCII_CLASSES,
    PRE_TOKENIZERS,
    BpeCounter,
    PreTokenizer,
    RankTable,
    Splitter,
    TableError,
    build_table,
    parse_tiktoken,
    pre_tokenizer_for,
    stdlib_pattern,
    unicode_classes,
)
from hopmeter.core.meter import FlowMeter
from hopmeter.core.vocab import Api
from tests.core.unicode_tables import same_in_both
from tests.harness import tiktoken_ref
from tests.harness.corpus import CASES, CORPUS, needs_corpus

DATA = Path(__file__).resolve().parents[2] / "addons" / "hopmeter" / "data"
SHIPPED = ("o200k_base", "cl100k_base")


@cache
def shipped_table(name: str) -> RankTable:
    raw = gzip.decompress((DATA / f"{name}.tiktoken.gz").read_bytes())
    sha = hashlib.sha256(raw).digest()
    return RankTable(build_table(parse_tiktoken(raw), sha), sha)


def meter_texts(name: str) -> list[str]:
    """What the proxy counts of one recording: each event's kept text (FlowMeter.event_texts)."""
    ndjson = name.endswith(".ndjson")
    meter = FlowMeter(
        api=Api(CASES[name].api),
        content_type="application/x-ndjson" if ndjson else "text/event-stream",
        content_encoding=None,
    )
    meter.feed((CORPUS / name).read_bytes(), 0.0)
    meter.close(1.0)
    return [text for text in meter.event_texts() if text]


@cache
def corpus_texts() -> list[str]:
    """Every event text of the recorded provider streams, and each stream line by line and whole
    (payload JSON: ids, names, escapes, long pieces)."""
    texts = []
    for name in sorted(CASES):
        texts += meter_texts(name)
        body = (CORPUS / name).read_text(encoding="utf-8", errors="replace")
        texts += [body, *body.splitlines(keepends=True)]
    return texts


# What the corpus lacks: scripts, emoji sequences, combining marks, exotic spaces and digits,
# case-folding traps of the `'s` suffixes (long s, Kelvin sign), control characters.
_ALPHABET = (
    [chr(c) for c in range(0x250)] * 2
    + [chr(c) for c in range(0x370, 0x530)]
    + [chr(c) for c in range(0x3040, 0x3100)]
    + [chr(c) for c in range(0x4E00, 0x4E60)]
    + [chr(c) for c in range(0xAC00, 0xAC30)]
    + list("\u0301\u0308\u200d\ufe0f\u00a0\u3000\u2028\u2029\u0085\u00b2\u00bd\u2160\u017f\u212a")
    + list("\u0660\u0967\U0001f600\U0001f44d\U0001f3fd\U0001f468\U0001f469\u05d0\u0627\ufeff")
)


def fuzz_texts(seed: int, n: int) -> list[str]:
    rnd = random.Random(seed)
    return ["".join(rnd.choices(_ALPHABET, k=rnd.randint(1, 40))) for _ in range(n)]


LONG_PIECES = [
    "中文字符" * 400,  # one piece of 4,800 bytes: CJK has no spaces
    "ab" * 600,
    "a" * 1000,
    " " * 900 + "x",
    "\n" * 300,
    "0123456789" * 50,
    "".join(random.Random(3).choices("abcdefghij", k=2000)),
    base64.b64encode(random.Random(4).randbytes(3000)).decode(),
    "https://example.com/" + "a1b2c3d4" * 80,
]


@needs_corpus
@pytest.mark.parametrize("name", SHIPPED)
def test_counts_equal_tiktoken_on_the_corpus(name: str) -> None:
    """Every event text of 17 providers' recorded streams, as the proxy keeps it, and each
    stream line by line and whole."""
    reference = tiktoken_ref.encoding(name)
    count = BpeCounter(shipped_table(name), PRE_TOKENIZERS[name])
    texts = corpus_texts()
    assert len(texts) > 2000
    wrong = [t for t in texts if count(t) != len(reference.encode_ordinary(t))]
    assert wrong == []


@pytest.mark.parametrize("name", SHIPPED)
def test_counts_equal_tiktoken_on_random_unicode(name: str) -> None:
    """Mixed scripts, marks, emoji, exotic spaces and digits, control characters."""
    reference = tiktoken_ref.encoding(name)
    count = BpeCounter(shipped_table(name), PRE_TOKENIZERS[name])
    wrong = [t for t in fuzz_texts(1, 6000) if count(t) != len(reference.encode_ordinary(t))]
    assert wrong == []


@pytest.mark.parametrize("name", SHIPPED)
def test_long_pieces_merge_like_tiktoken(name: str) -> None:
    """Pieces past HEAP_MERGE_BYTES go through the heap; both ways agree with tiktoken."""
    reference = tiktoken_ref.encoding(name)
    table = shipped_table(name)
    count = BpeCounter(table, PRE_TOKENIZERS[name])
    for text in LONG_PIECES:
        assert count(text) == len(reference.encode_ordinary(text)), text[:20]
    for text in LONG_PIECES + fuzz_texts(5, 300):
        data = text.encode()[: bpe.HEAP_MERGE_BYTES * 3]
        assert table.merged_parts(data[: bpe.HEAP_MERGE_BYTES]) == table._merged_parts_heap(
            data[: bpe.HEAP_MERGE_BYTES]
        )
        assert table.merged_parts(data) == _merged_by_rescanning(table, data)


def _merged_by_rescanning(table: RankTable, piece: bytes) -> int:
    """The textbook loop, for comparison: merge the lowest-ranked pair, leftmost, until none."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        ranks = [table.rank(parts[i] + parts[i + 1]) for i in range(len(parts) - 1)]
        known = [(r, i) for i, r in enumerate(ranks) if r is not None]
        if not known:
            break
        _, i = min(known)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return len(parts)


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_ascii_pattern_splits_like_the_full_one(name: str) -> None:
    """Pure-ASCII text is split with the pattern's ASCII classes: the same pieces as `regex`
    with the encoding's own pattern, on every ASCII character including controls."""
    pre = PRE_TOKENIZERS[name]
    full = regex.compile(pre.pattern).findall
    ascii_only = re.compile(stdlib_pattern(pre.pattern, ASCII_CLASSES)).findall
    rnd = random.Random(7)
    chars = [chr(c) for c in range(128)] + list(" \n\tabcABC'sS019.,") * 8
    texts = ["".join(rnd.choices(chars, k=rnd.randint(1, 30))) for _ in range(20_000)]
    texts += ["it's", "IT'S", "I'M", "x  \n", "  ", "a\r\n\r\nb", "12345", "//\n", "\x1c \x1f"]
    texts += [t for t in corpus_texts() if t.isascii()]
    assert [t for t in texts if full(t) != ascii_only(t)] == []


def test_classes_are_regexs_on_every_code_point() -> None:
    """Each class the patterns name, as written out within the Basic Multilingual Plane and
    as the stand-ins of the code points beyond it, holds what `regex`'s holds, on every code
    point both tables class alike."""
    classes, starts, stand_ins = unicode_classes()
    chars = same_in_both()
    within = "".join(c for c in chars if ord(c) < bpe.BMP_END)
    beyond = "".join(c for c in chars if ord(c) >= bpe.BMP_END)
    as_stand_ins = "".join(stand_ins[bisect_right(starts, ord(c)) - 1] for c in beyond)
    assert len(within) + len(beyond) > 1_000_000
    for name in classes:
        pattern = r"\s" if name == "s" else rf"\p{{{name}}}"
        ours = re.compile(stdlib_pattern(pattern, classes))
        theirs = regex.compile(pattern)
        assert _starts(ours, within) == _starts(theirs, within), name
        assert _starts(ours, as_stand_ins) == _starts(theirs, beyond), name


def _starts(pattern: re.Pattern[str] | regex.Pattern[str], text: str) -> list[int]:
    return [m.start() for m in pattern.finditer(text)]


# Every code point in these contexts: alone, after and before letters of either case, digits,
# a space, an apostrophe and the suffixes, line ends, a mark, and itself.
CONTEXTS = (
    "{c}",
    "a{c}",
    "{c}a",
    "A{c}b",
    "aB{c}",
    " {c}",
    "{c} ",
    "'{c}",
    "{c}'s",
    "{c}'LL",
    "x'{c}",
    "1{c}2",
    "12{c}3",
    "\n{c}\r",
    "{c}{c}{c}",
    "{c}\u0301",
    "\u00e9{c}A",
)


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_splits_like_regex_on_every_code_point(name: str) -> None:
    """Every code point of the Basic Multilingual Plane both tables class alike, and beyond
    it each one where the stand-in changes (and its neighbours) and 20,000 others, in every
    one of CONTEXTS (4,096 code points' contexts a text): the same pieces as `regex`."""
    split = Splitter(PRE_TOKENIZERS[name])
    full = regex.compile(PRE_TOKENIZERS[name].pattern).findall
    _, starts, _ = unicode_classes()
    same = same_in_both()
    edges = {code + step for start in starts for code in (start, start - 1) for step in (-1, 0, 1)}
    beyond = [c for c in same if ord(c) >= bpe.BMP_END]
    chars = [c for c in same if ord(c) < bpe.BMP_END or ord(c) in edges]
    chars += random.Random(12).sample(beyond, 20_000)
    wrong = []
    for at in range(0, len(chars), 4096):
        text = "".join(context.format(c=c) for c in chars[at : at + 4096] for context in CONTEXTS)
        if split(text) != full(text):
            wrong.append(hex(ord(chars[at])))
    assert wrong == []


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_splits_like_regex_on_the_corpus_and_random_unicode(name: str) -> None:
    """The recorded streams (every event text, each line, each whole), the random texts of
    the count tests and random texts of any code point both tables class alike (the
    surrogates too): the same pieces as `regex`."""
    split = Splitter(PRE_TOKENIZERS[name])
    full = regex.compile(PRE_TOKENIZERS[name].pattern).findall
    rnd = random.Random(11)
    chars = same_in_both()
    texts = corpus_texts() + fuzz_texts(2, 5000) + LONG_PIECES
    texts += ["".join(rnd.choices(chars, k=rnd.randint(1, 40))) for _ in range(20_000)]
    assert [t for t in texts if split(t) != full(t)] == []


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(_ALPHABET),
            st.integers(0, sys.maxunicode).map(chr).filter(lambda c: c in same_in_both()),
        ),
        max_size=30,
    ).map("".join)
)
def test_splits_like_regex_on_any_text(text: str) -> None:
    """Hypothesis' texts of code points from anywhere and the count tests' alphabet: o200k_base's
    and cl100k_base's pieces are `regex`'s."""
    for name in ("o200k_base", "cl100k_base"):
        pre = PRE_TOKENIZERS[name]
        assert Splitter(pre)(text) == regex.findall(pre.pattern, text)


def test_stdlib_pattern_writes_classes_out_and_refuses_what_it_cannot() -> None:
    """\\p{X} and \\s outside a class become one, inside one join its other items, \\S is
    their complement; syntax beyond tiktoken's patterns is refused, not mistranslated."""
    classes = {"L": ((0x41, 0x5A), (0x61, 0x7A)), "N": ((0x30, 0x39),), "s": ((0x20, 0x20),)}
    assert stdlib_pattern(r"\p{L}+|[^\r\p{L}\p{N}]|\s(?!\S)", classes) == (
        r"[A-Za-z]+|[^\r0-9A-Za-z]|[\x20](?![^\x20])"
    )
    for unknown in (r"[\S]", r"[]a]", r"[[a]", "a]"):
        with pytest.raises(ValueError, match="cannot write out"):
            stdlib_pattern(unknown, classes)


def test_custom_file_with_gaps_and_its_pre_tokenizer() -> None:
    """A small .tiktoken file: a rank the file skips matches nothing; GPT-2's pre-tokenizer."""
    tokens = [bytes([b]) for b in range(256)] + [b"ab", b"abab", b" ab"]
    lines = [f"{base64.b64encode(t).decode()} {r}" for r, t in enumerate(tokens) if r != 200]
    parsed = parse_tiktoken("\n".join(lines).encode() + b"\n")
    assert parsed[200] == b"" and parsed[257] == b"abab"
    table = RankTable(build_table(parsed, bytes(32)))
    assert (table.ranks, table.rank(b"abab"), table.rank(b"\xc8"), table.rank(b"zz")) == (
        259,
        257,
        None,
        None,
    )
    count = BpeCounter(table, pre_tokenizer_for(table.ranks))
    assert (count("abab"), count("abab ab"), count("xyz"), count("")) == (1, 2, 3, 0)
    assert pre_tokenizer_for(100_256).name == "cl100k_base"
    assert pre_tokenizer_for(199_998).name == "o200k_base"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "no tokens"),
        (b"YWI= x\n", "line 1"),
        (b"YWI=\n", "line 1"),
        (b"!!! 0\n", "line 1"),
        (b"YWI= -1\n", "negative"),
        (b"YWI= 4000000000\n", "mostly missing"),
    ],
)
def test_malformed_vocabulary_files(raw: bytes, reason: str) -> None:
    with pytest.raises(TableError, match=reason):
        parse_tiktoken(raw)


def test_damaged_images_are_refused() -> None:
    """A table is used only whole, of this format, and built from the expected vocabulary."""
    sha = hashlib.sha256(b"v").digest()
    image = build_table([b"a", b"b", b"ab"], sha)
    assert RankTable(image, sha).rank(b"ab") == 2
    with pytest.raises(TableError, match="header"):
        RankTable(image[:10])
    with pytest.raises(TableError, match="not a hopmeter rank table"):
        RankTable(b"X" + image[1:])
    with pytest.raises(TableError, match="truncated"):
        RankTable(image[:-1])
    with pytest.raises(TableError, match="truncated"):
        RankTable(image + b"\0")
    with pytest.raises(TableError, match="another vocabulary"):
        RankTable(image, hashlib.sha256(b"w").digest())


def test_the_piece_memo_is_bounded_and_exact() -> None:
    """Pieces' counts are remembered up to PIECE_MEMO_ENTRIES; long pieces never."""
    table = shipped_table("o200k_base")
    count = BpeCounter(table, PRE_TOKENIZERS["o200k_base"])
    reference = tiktoken_ref.encoding("o200k_base")
    words = [f" w{i}x" for i in range(bpe.PIECE_MEMO_ENTRIES + 500)]
    for word in words:
        assert count(word) == len(reference.encode_ordinary(word))
        assert len(count._memo) <= bpe.PIECE_MEMO_ENTRIES
    count("y" * (bpe.PIECE_MEMO_MAX_CHARS + 1))
    assert "y" * (bpe.PIECE_MEMO_MAX_CHARS + 1) not in count._memo
    again = [count(w) for w in words]
    assert again == [len(reference.encode_ordinary(w)) for w in words]


def test_non_ascii_patterns_are_compiled_when_first_needed() -> None:
    """o200k_base's pattern for non-ASCII text comes compiled with the module; another one is
    compiled when a text first needs it (or `prepare`), once for every Splitter of it."""
    assert Splitter(PRE_TOKENIZERS["o200k_base"]).prepared
    assert Splitter(PRE_TOKENIZERS["o200k_base"])("Grüße, 世界 👋") == [
        "Grüße",
        ",",
        " 世界",
        " 👋",
    ]
    # a pattern no test compiled before: r50k_base's with a comment of its own
    fresh = PreTokenizer("fresh", PRE_TOKENIZERS["r50k_base"].pattern + f"(?#{id(object())})")
    split = Splitter(fresh)
    assert split("Hello, world!\n") == ["Hello", ",", " world", "!", "\n"]
    assert not split.prepared
    assert split("Grüße, 世界") == ["Grüße", ",", " 世界"]
    assert split.prepared
    assert Splitter(fresh).prepared
