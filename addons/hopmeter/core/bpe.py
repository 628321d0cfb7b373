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

Pure-ASCII text, most of a reply, is split with the standard library's `re`; other text with
`regex` (the `\\p{...}` classes need it), compiled when first needed (`Splitter`). Counting a short
text costs ~1.3 us where tiktoken's took ~1.0; hopmeter.core.tokens and `BpeCounter` remember
the counts of recurring texts and pieces, so an event costs ~0.1-0.3 us more on varied text and
nothing on a reply's common words (bench/micro_tokens.py).
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

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
    """An encoding's pre-tokenizer: its pattern, and the same pattern for pure-ASCII text in the
    standard library's `re` (several times faster than `regex` on the short texts of events)."""

    name: str
    pattern: str  # for `regex`: tiktoken's, with `$` as `\Z` (end of text only, as in Rust)
    ascii_pattern: str  # the same splits on ASCII text: \p{L} is [A-Za-z], \s is [\t-\r ] ...


class Splitter:
    """Splits text into a pre-tokenizer's pieces.

    The full pattern is compiled only when first needed (`prepare`): importing `regex` and
    compiling o200k_base's pattern take ~80 ms and ~6 MiB, which a proxy that has seen no
    traffic, or only ASCII text, need not pay. A caller may `prepare` ahead in a thread (the
    compiler is mostly Python: the interpreter switches to other threads every few ms) so that
    a text that needs it later finds it ready; one that comes first waits for it.
    """

    __slots__ = ("_ascii", "_full", "_lock", "pattern")

    def __init__(self, pre_tokenizer: PreTokenizer) -> None:
        self.pattern = pre_tokenizer.pattern
        self._ascii = re.compile(pre_tokenizer.ascii_pattern).findall
        self._full: Callable[[str], list[str]] | None = None
        self._lock = threading.Lock()

    def __call__(self, text: str) -> list[str]:
        if text.isascii():
            return self._ascii(text)
        return (self._full or self.prepare())(text)

    @property
    def prepared(self) -> bool:
        """Whether the full pattern is compiled."""
        return self._full is not None

    def prepare(self) -> Callable[[str], list[str]]:
        """Compile the full pattern (once; a second caller waits for the first)."""
        with self._lock:
            if self._full is None:
                import regex  # noqa: PLC0415 - ~40 ms and ~3 MiB, only for non-ASCII text

                self._full = regex.compile(self.pattern).findall
            return self._full


_SUFFIXES: Final = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_WS: Final = r"\t-\r "  # ASCII White_Space: \t \n \v \f \r and space (not \x1c-\x1f, as \s in re)
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
            rf"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+{_SUFFIXES}|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*{_SUFFIXES}"
            rf"|[0-9]{{1,3}}| ?[^{_WS}A-Za-z0-9]+[\r\n/]*|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])"
            rf"|[{_WS}]+",
        ),
        PreTokenizer(
            "cl100k_base",
            r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"
            r"| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++\Z|\s*[\r\n]|\s+(?!\S)|\s",
            rf"'(?i:[sdmt]|ll|ve|re)|[^\r\nA-Za-z0-9]?+[A-Za-z]++|[0-9]{{1,3}}+"
            rf"| ?[^{_WS}A-Za-z0-9]++[\r\n]*+|[{_WS}]++\Z|[{_WS}]*[\r\n]|[{_WS}]+(?![^{_WS}])"
            rf"|[{_WS}]",
        ),
        PreTokenizer(
            "r50k_base",
            r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++\Z|\s+(?!\S)|\s",
            rf"'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]++| ?[0-9]++| ?[^{_WS}A-Za-z0-9]++|[{_WS}]++\Z"
            rf"|[{_WS}]+(?![^{_WS}])|[{_WS}]",
        ),
    )
}


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
