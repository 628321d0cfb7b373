"""Counting byte-level BPE tokens from a rank table that can live in a memory-mapped file.

A `.tiktoken` vocabulary (o200k_base, cl100k_base, or a user's file) is a list of byte strings by
rank. Counting the tokens of a text takes the encoding's pre-tokenizer (a regular expression that
splits the text into pieces) and, for each piece that is not itself a token, the BPE merges: the
adjacent pair of parts whose concatenation has the lowest rank is merged, leftmost first, until no
pair is a token. The count is the number of parts left. This is the algorithm tiktoken runs, and
tests hold the two to the same counts on the shipped vocabularies.

Why not tiktoken's encoder: it keeps three copies of the vocabulary in Rust maps (~47 MiB for
o200k_base, a third of an idle proxy) and builds them holding the GIL for 0.1-1 s, a stall of
every stream in flight if it happens after start-up. A `RankTable` is one flat image, ~4 MiB for
o200k_base: an open-addressing hash table of ranks, an offset per rank and the token bytes. Built
once (~0.3 s) and written to a file, it is mapped read-only: opening it costs nothing, pages come
in as counting touches them, and every process on the host that maps the file shares them.

The table's layout (little-endian; `HEADER` then three arrays):
- header: magic, the SHA-256 of the vocabulary it was built from, the number of ranks, the
  log2 of the slot count, the length of the token bytes;
- slots: uint32 per slot, rank + 1 (0 = empty), at `crc32(token) & mask`, linear probing; the
  slot count is the power of two at least twice the ranks, so a probe is ~1.3 reads;
- offsets: uint32 per rank plus one, where each rank's bytes start (a missing rank is empty);
- the token bytes, by rank.

The pre-tokenizer runs on the standard library's `re`: tiktoken's patterns name Unicode's
classes (`\\p{L}`, `\\p{N}`, `\\p{Lu}` ...), which `re` lacks, so `stdlib_pattern` writes each
out as ranges of code points, from hopmeter.core.unicode_categories (Unicode 16.0, the version
of tiktoken's own tables) for any text, and as their ASCII part for pure-ASCII text, most of
a reply (`Splitter`). Counting a short text costs ~1.3 us where tiktoken's took ~1.0;
hopmeter.core.tokens and `BpeCounter` remember the counts of recurring texts and pieces, so an
event costs ~0.1-0.3 us more on varied text and nothing on a reply's common words
(bench/micro_tokens.py).
"""

from __future__ import annotations

import base64
import heapq
import re
import struct
import sys
import threading
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from hopmeter.core import unicode_categories

if TYPE_CHECKING:
    import mmap

MAGIC: Final = b"HMBPE\x00\x01\x00"  # format version 1
HEADER: Final = struct.Struct("<8s32sIII4x")  # magic, vocabulary sha256, ranks, slot bits, bytes
# Pieces longer than this are merged with a heap (n log n) instead of rescanning the parts (n^2):
# a reply of 5,000 CJK characters with no space is one piece of 15,000 bytes.
HEAP_MERGE_BYTES: Final = 64


class TableError(ValueError):
    """A rank table or vocabulary file that cannot be used, with the reason."""


def parse_tiktoken(raw: bytes) -> list[bytes]:
    """The tokens of a `.tiktoken` file (`base64-token rank` per line), by rank; a rank the file
    skips is b"" (it never matches a piece). Raises TableError on a malformed line."""
    by_rank: dict[int, bytes] = {}
    for number, line in enumerate(raw.splitlines(), 1):
        if not line:
            continue
        try:
            encoded, rank_text = line.split()
            by_rank[int(rank_text)] = base64.b64decode(encoded, validate=True)
        except ValueError as exc:
            raise TableError(f"line {number} is not `base64-token rank`") from exc
    if not by_rank:
        raise TableError("no tokens")
    if min(by_rank) < 0 or max(by_rank) >= 2 * len(by_rank) + 1024:
        raise TableError("its ranks are not 0, 1, 2 ... (negative, or mostly missing)")
    tokens = [b""] * (max(by_rank) + 1)
    for rank, token in by_rank.items():
        tokens[rank] = token
    return tokens


def build_table(tokens: Iterable[bytes], source_sha256: bytes) -> bytes:
    """The table image of `tokens` (by rank; b"" for a missing rank), in this machine's byte
    order, which `RankTable` reads only on a little-endian one."""
    offsets = array("I", [0])
    blob = bytearray()
    for token in tokens:
        blob += token
        offsets.append(len(blob))
    ranks = len(offsets) - 1
    bits = max(1, (2 * ranks - 1).bit_length())
    mask = (1 << bits) - 1
    slots = array("I", bytes(4 << bits))
    for rank in range(ranks):
        start, end = offsets[rank], offsets[rank + 1]
        if start == end:
            continue
        i = zlib.crc32(blob[start:end]) & mask
        while slots[i]:
            i = (i + 1) & mask
        slots[i] = rank + 1
    header = HEADER.pack(MAGIC, source_sha256, ranks, bits, len(blob))
    return header + slots.tobytes() + offsets.tobytes() + bytes(blob)


class RankTable:
    """Token bytes -> rank, read from a table image: bytes, or a file the caller mapped."""

    __slots__ = ("rank", "ranks")

    def __init__(
        self,
        image: bytes | mmap.mmap,
        source_sha256: bytes | None = None,
        *,
        header: bytes | None = None,
    ) -> None:
        """Raises TableError when `image` is not a whole table (of `source_sha256`, if given).
        `header`: the image's first HEADER.size bytes, read by the caller so that a mapped
        file's pages stay unread until a lookup needs them."""
        if len(image) < HEADER.size:
            raise TableError("shorter than its header")
        magic, sha, ranks, bits, blob_len = HEADER.unpack_from(header or image)
        if magic != MAGIC:
            raise TableError("not a hopmeter rank table of this version")
        if source_sha256 is not None and sha != source_sha256:
            raise TableError("built from another vocabulary")
        slots_end = HEADER.size + (4 << bits)
        offsets_end = slots_end + 4 * (ranks + 1)
        if bits > 31 or len(image) != offsets_end + blob_len:
            raise TableError("truncated or padded")
        if sys.byteorder != "little":
            raise TableError("this machine is big-endian; the table is little-endian")
        view = memoryview(image)
        self.ranks: int = ranks
        # the lookup holds the image (a mapping stays open as long as the table lives)
        self.rank: Callable[[bytes], int | None] = _lookup(
            view[HEADER.size : slots_end].cast("I"),
            view[slots_end:offsets_end].cast("I"),
            image,
            offsets_end,
            (1 << bits) - 1,
        )

    def merged_parts(self, piece: bytes) -> int:
        """How many tokens the BPE merges leave of `piece` (a piece of the pre-tokenizer)."""
        if len(piece) > HEAP_MERGE_BYTES:
            return self._merged_parts_heap(piece)
        rank = self.rank
        never = self.ranks  # above every rank: "no merge"
        starts = list(range(len(piece) + 1))  # where each part starts, then the end
        # pair_ranks[i]: the rank of parts i and i + 1 merged (never: not a token)
        pair_ranks = [
            r if (r := rank(piece[i : i + 2])) is not None else never for i in starts[:-2]
        ]
        while pair_ranks:
            best = min(pair_ranks)
            if best == never:
                break
            i = pair_ranks.index(best)  # the leftmost of the lowest rank
            del starts[i + 1]
            del pair_ranks[i]
            if i + 2 < len(starts):
                r = rank(piece[starts[i] : starts[i + 2]])
                pair_ranks[i] = never if r is None else r
            if i:
                r = rank(piece[starts[i - 1] : starts[i + 1]])
                pair_ranks[i - 1] = never if r is None else r
        return len(starts) - 1

    def _merged_parts_heap(self, piece: bytes) -> int:
        """`merged_parts` for a long piece: candidate merges in a heap, stale ones skipped."""
        rank = self.rank
        n = len(piece)
        after = list(range(1, n + 1))  # after[i]: where the part starting at i ends
        before = list(range(-1, n - 1))  # before[i]: where the part before the one at i starts
        alive = [True] * n
        heap: list[tuple[int, int, int]] = []  # (rank, start, end of the pair)
        for i in range(n - 1):
            r = rank(piece[i : i + 2])
            if r is not None:
                heap.append((r, i, i + 2))
        heapq.heapify(heap)
        parts = n
        while heap:
            _, i, end = heapq.heappop(heap)
            j = after[i] if alive[i] else n
            if j >= n or after[j] != end:
                continue  # stale: one of the two parts was merged since
            alive[j] = False  # the part at j joins the one at i
            after[i] = end
            if end < n:
                before[end] = i
            parts -= 1
            if end < n:
                r = rank(piece[i : after[end]])
                if r is not None:
                    heapq.heappush(heap, (r, i, after[end]))
            k = before[i]
            if k >= 0:
                r = rank(piece[k:end])
                if r is not None:
                    heapq.heappush(heap, (r, k, end))
        return parts


def _lookup(
    slots: memoryview, offsets: memoryview, image: bytes | mmap.mmap, base: int, mask: int
) -> Callable[[bytes], int | None]:
    """`RankTable.rank`: a closure, as its names are read faster than attributes."""
    crc32 = zlib.crc32

    def rank(token: bytes) -> int | None:
        """The rank of `token`, or None when it is not in the vocabulary."""
        size = len(token)
        i = crc32(token) & mask
        while entry := slots[i]:
            at = base + offsets[entry - 1]
            if base + offsets[entry] - at == size and image[at : at + size] == token:
                return entry - 1
            i = (i + 1) & mask
        return None

    return rank


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """An encoding's pre-tokenizer: its name and tiktoken's pattern."""

    name: str
    # in `regex`'s syntax, as tiktoken writes it (with `$` as `\Z`: end of text only, as in
    # Rust); `stdlib_pattern` writes it out for the standard library's `re`
    pattern: str


# Runs of code points (first, last): what a class of the patterns is made of
Runs = tuple[tuple[int, int], ...]
# The patterns' classes on ASCII text: \p{L} is [A-Za-z], \s is [\t-\r ] ...
ASCII_CLASSES: Final[dict[str, Runs]] = {
    "L": ((0x41, 0x5A), (0x61, 0x7A)),
    "Lu": ((0x41, 0x5A),),
    "Ll": ((0x61, 0x7A),),
    "Lt": (),
    "Lm": (),
    "Lo": (),
    "M": (),
    "N": ((0x30, 0x39),),
    "s": ((0x09, 0x0D), (0x20, 0x20)),  # White_Space (\s in `re` adds \x1c-\x1f)
}
# A pattern's class syntax: \p{X}, \s and \S, another escape, a class's opening and closing
_CLASS_SYNTAX: Final = re.compile(r"\\p\{(\w+)\}|\\([sS])|(\\.)|(\[\^?)|(\])")


def stdlib_pattern(pattern: str, classes: dict[str, Runs]) -> str:
    """`pattern` (tiktoken's syntax) for the standard library's `re`: each \\p{X} and \\s
    written out as the code points `classes` gives it, \\S as their complement; the items of a
    [...] joined into one set of ranges. The syntax of tiktoken's patterns only: a `]` first
    in a class, or \\S inside one, is refused."""
    out = []
    within: list[tuple[int, int]] | None = None  # inside [...]: the runs its items name
    at = 0
    for match in _CLASS_SYNTAX.finditer(pattern):
        prop, space, escape, opening, closing = match.groups()
        out.append(pattern[at : match.start()])
        at = match.end()
        name = prop or ("s" if space == "s" else "")
        if name and within is not None:
            within += classes[name]
        elif name:
            out.append(f"[{_ranges(classes[name])}]")
        elif space == "S" and within is None:
            out.append(f"[^{_ranges(classes['s'])}]")
        elif opening and within is None:
            within = []
            out.append(opening)
        elif closing and within is not None:
            out.append(_ranges(within) + closing)
            within = None
        elif escape:
            out.append(escape)
        else:
            raise ValueError(f"cannot write out {match[0]!r} at {match.start()} of {pattern!r}")
    return "".join(out) + pattern[at:]


def _ranges(runs: Iterable[tuple[int, int]]) -> str:
    """Runs of code points as the inside of a `re` class, overlapping and adjacent runs joined:
    ASCII letters and digits as themselves, other ASCII as \\xNN, the rest as themselves."""
    joined: list[list[int]] = []
    for first, last in sorted(runs):
        if joined and joined[-1][1] + 1 >= first:
            joined[-1][1] = max(joined[-1][1], last)
        else:
            joined.append([first, last])
    return "".join(
        _char(first) if first == last else f"{_char(first)}-{_char(last)}" for first, last in joined
    )


def _char(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x80 and not chr(code).isalnum() else chr(code)


class Splitter:
    """Splits text into a pre-tokenizer's pieces, with the standard library's `re`.

    Pure-ASCII text, most of a reply, is split with the pattern's classes written out for ASCII
    (`ASCII_CLASSES`). Other text takes them written out from Unicode 16.0's tables, the
    version tiktoken splits by (`unicode_split`): o200k_base's pattern is compiled with this
    module (`COMPILED_AT_IMPORT`), another one when first needed (`prepare`, ~10 ms of `re`'s
    compiler). A caller may `prepare` ahead in a thread so that a text that needs it later
    finds it ready; one that comes first waits for it.
    """

    __slots__ = ("_ascii", "_full", "pattern")

    def __init__(self, pre_tokenizer: PreTokenizer) -> None:
        self.pattern = pre_tokenizer.pattern
        self._ascii = re.compile(stdlib_pattern(self.pattern, ASCII_CLASSES)).findall
        self._full: Callable[[str], list[str]] | None = _UNICODE_SPLITS.get(self.pattern)

    def __call__(self, text: str) -> list[str]:
        if text.isascii():
            return self._ascii(text)
        return (self._full or self.prepare())(text)

    @property
    def prepared(self) -> bool:
        """Whether the pattern for non-ASCII text is compiled."""
        return self._full is not None

    def prepare(self) -> Callable[[str], list[str]]:
        """Compile the pattern for non-ASCII text (once; a second caller waits for the first)."""
        if self._full is None:
            self._full = unicode_split(self.pattern)
        return self._full


# The stand-in within the Basic Multilingual Plane for a code point beyond it, by its general
# category (the eleven the patterns name; any other is OTHER_STAND_IN). None of them is ASCII,
# White_Space, or equal to an ASCII letter ignoring case, as no code point beyond the plane is.
ASTRAL_STAND_INS: Final = {
    "Lu": "\u0391",  # GREEK CAPITAL LETTER ALPHA
    "Ll": "\u03b1",  # GREEK SMALL LETTER ALPHA
    "Lt": "\u01c5",  # LATIN CAPITAL LETTER D WITH SMALL LETTER Z WITH CARON
    "Lm": "\u02b0",  # MODIFIER LETTER SMALL H
    "Lo": "\u05d0",  # HEBREW LETTER ALEF
    "Mn": "\u0301",  # COMBINING ACUTE ACCENT
    "Mc": "\u0903",  # DEVANAGARI SIGN VISARGA
    "Me": "\u20dd",  # COMBINING ENCLOSING CIRCLE
    "Nd": "\u0660",  # ARABIC-INDIC DIGIT ZERO
    "Nl": "\u2160",  # ROMAN NUMERAL ONE
    "No": "\u00b2",  # SUPERSCRIPT TWO
}
OTHER_STAND_IN: Final = "\u00a7"  # SECTION SIGN (Po): no letter, mark, number nor space
BMP_END: Final = 0x10000
_ASTRAL: Final = re.compile("[\U00010000-\U0010ffff]")
# \p{X} by the general categories it is made of
_PROPERTIES: Final = {
    "L": ("Lu", "Ll", "Lt", "Lm", "Lo"),
    "M": ("Mn", "Mc", "Me"),
    "N": ("Nd", "Nl", "No"),
    **{name: (name,) for name in ("Lu", "Ll", "Lt", "Lm", "Lo")},
}


def unicode_classes() -> tuple[dict[str, Runs], array[int], str]:
    """From hopmeter.core.unicode_categories: the patterns' classes within the Basic
    Multilingual Plane, written out for `re` (as `ASCII_CLASSES`), and where the code points
    beyond it change stand-in: the first code point of each stretch (ascending) and its
    stand-in (`ASTRAL_STAND_INS`)."""
    within: dict[str, list[tuple[int, int]]] = {name: [] for name in ASTRAL_STAND_INS}
    starts, stand_ins = array("I", [BMP_END]), [OTHER_STAND_IN]
    for line in unicode_categories.CATEGORIES.splitlines():
        span, category = line.split()
        first, last = _span(span)
        if first < BMP_END:
            within[category].append((first, last))
            continue
        if starts[-1] == first:
            stand_ins[-1] = ASTRAL_STAND_INS[category]
        else:
            starts.append(first)
            stand_ins.append(ASTRAL_STAND_INS[category])
        starts.append(last + 1)
        stand_ins.append(OTHER_STAND_IN)
    classes = {
        prop: tuple(run for name in names for run in within[name])
        for prop, names in _PROPERTIES.items()
    }
    classes["s"] = tuple(_span(span) for span in unicode_categories.WHITE_SPACE.split())
    return classes, starts, "".join(stand_ins)


def _span(span: str) -> tuple[int, int]:
    """`first..last` or `code` (hexadecimal) as the first and the last code point."""
    first, _, last = span.partition("..")
    return int(first, 16), int(last or first, 16)


# `unicode_split`'s splits, by pattern (a handful: one per encoding), and the lock that makes
# two threads that want one compile it once
_UNICODE_SPLITS: dict[str, Callable[[str], list[str]]] = {}
_COMPILING: Final = threading.Lock()


def unicode_split(pattern: str) -> Callable[[str], list[str]]:
    """The split of any text by `pattern` (tiktoken's syntax), with `unicode_classes`: compiled
    once (for the process), then shared by every `Splitter` of the pattern.

    The classes hold the Basic Multilingual Plane only: `re` tests a code point beyond it
    against each range of a class in turn (~300 for \\p{L}), where one within it is one lookup
    in a bitmap. A text with code points beyond it (emoji, most often) is split as the same
    text with each of them replaced by a stand-in within it of the same general category
    (`ASTRAL_STAND_INS`): the pattern tells code points apart by their classes only, so the
    pieces fall at the same places, and they are cut from the text itself.
    """
    with _COMPILING:
        split = _UNICODE_SPLITS.get(pattern)
        if split is None:
            split = _UNICODE_SPLITS[pattern] = _compiled_split(pattern)
        return split


def _compiled_split(pattern: str) -> Callable[[str], list[str]]:
    """`unicode_split`'s work: the pattern compiled, and the split around it."""
    classes, starts, stand_ins = unicode_classes()
    compiled = re.compile(stdlib_pattern(pattern, classes))
    findall, finditer = compiled.findall, compiled.finditer
    beyond, replace_beyond = _ASTRAL.search, _ASTRAL.sub

    def stand_in(match: re.Match[str]) -> str:
        return stand_ins[bisect_right(starts, ord(match[0])) - 1]

    def split(text: str) -> list[str]:
        if beyond(text) is None:
            return findall(text)
        within = replace_beyond(stand_in, text)
        return [text[m.start() : m.end()] for m in finditer(within)]

    return split


_SUFFIXES: Final = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PRE_TOKENIZERS: Final = {
    p.name: p
    for p in (
        PreTokenizer(
            "o200k_base",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            + _SUFFIXES
            + r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
            + _SUFFIXES
            + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        PreTokenizer(
            "cl100k_base",
            r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"
            r"| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++\Z|\s*[\r\n]|\s+(?!\S)|\s",
        ),
        PreTokenizer(
            "r50k_base",
            r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++\Z|\s+(?!\S)|\s",
        ),
    )
}


# o200k_base's pattern for non-ASCII text is compiled with this module, early in a proxy's
# start-up: it counts every model but OpenAI's older ones, so nearly every proxy needs it, and
# `re`'s compiler allocates ~1 MiB of small objects that it frees again. Freed early, they are
# reused by the rest of start-up; freed at the first flow, they stay resident as an arena of
# Python's allocator kept in reserve (+1.1 MiB against +0.1 after one flow, bench/README.md
# "Idle memory"). The other encodings' are compiled when first needed (`Splitter.prepare`).
COMPILED_AT_IMPORT: Final = "o200k_base"
unicode_split(PRE_TOKENIZERS[COMPILED_AT_IMPORT].pattern)


def pre_tokenizer_for(ranks: int) -> PreTokenizer:
    """A `.tiktoken` file says nothing of its pre-tokenizer: the OpenAI encoding's of its size
    (GPT-2's up to 60k tokens, cl100k's up to 150k, o200k's beyond)."""
    if ranks <= 60_000:
        return PRE_TOKENIZERS["r50k_base"]
    return PRE_TOKENIZERS["cl100k_base" if ranks <= 150_000 else "o200k_base"]


# BpeCounter remembers the counts of this many pieces (words, mostly) at most: a reply's words
# recur, and a dictionary lookup is a fifth of a piece's lookup in the table.
PIECE_MEMO_ENTRIES: Final = 8192
PIECE_MEMO_MAX_CHARS: Final = 32


class BpeCounter:
    """Counts the tokens of a text with one rank table and one pre-tokenizer."""

    __slots__ = ("_memo", "split", "table")

    def __init__(self, table: RankTable, pre_tokenizer: PreTokenizer) -> None:
        self.table = table
        self.split = Splitter(pre_tokenizer)
        self._memo: dict[str, int] = {}  # piece -> tokens; cleared when full

    def __call__(self, text: str) -> int:
        memo = self._memo
        n = 0
        for piece in self.split(text):
            k = memo.get(piece)
            if k is None:
                data = piece.encode()
                if len(data) == 1 or self.table.rank(data) is not None:
                    k = 1
                else:
                    k = self.table.merged_parts(data)
                if len(piece) <= PIECE_MEMO_MAX_CHARS:
                    if len(memo) >= PIECE_MEMO_ENTRIES:
                        memo.clear()
                    memo[piece] = k
            n += k
        return n
