"""Packed token-ID bodies: token ids as raw little-endian integers instead of text.

The format (after the seed "Stream tokens, not text", which streams one answer as text, as JSON
token ids and as packed ids):

- The body is the token ids one after another, each an unsigned little-endian integer of `width`
  bytes; no header, no separators, no length prefix.
- `X-Tokenizer` (response header) names the vocabulary the ids index, e.g. `r50k_base`.
- The width, first that applies: the `X-Token-Id-Width: 16|32` response header; a `width=16|32`
  parameter of the Content-Type (`application/x-token-ids; width=16`); 16 bits when `X-Tokenizer`
  names a vocabulary of at most 65,536 tokens (`SIXTEEN_BIT_VOCABULARIES`: every id fits, as the
  seed notes for r50k_base); else 32 bits, which fits every vocabulary.
- The format has no frames of its own (the seed: "a real protocol needs a length or a sequence
  number"), so an event is the ids that one `feed` completes: the server flushes per token and
  the proxy sees one chunk per flush. An id split across chunks waits for its last byte; bytes
  left at `close` are a truncated id, counted in `trailing_bytes`.

Each event is a Frame of kind "packed_ids" whose data is the ids as a JSON array (`[15496,11]`),
so the "token_ids" parser (apis/token_ids.py) reads it like a JSON token-ID event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hopmeter.core.frames import Frame
from hopmeter.errors import HopmeterError

WIDTHS_BYTES: Final = {16: 2, 32: 4}
DEFAULT_WIDTH_BITS: Final = 32
# tiktoken's encodings with at most 65,536 tokens (gpt2 and r50k: 50,257; p50k: 50,281).
SIXTEEN_BIT_VOCABULARIES: Final = frozenset({"gpt2", "r50k_base", "p50k_base", "p50k_edit"})
FRAME_KIND: Final = "packed_ids"


def width_bits(headers: Mapping[str, str], content_type: str = "") -> int:
    """The id width of a packed body, from its response headers (see the module doc).

    `headers` has lower-cased names, as wire.lower_headers gives them.
    """
    given = headers.get("x-token-id-width")
    if given is not None:
        given = given.strip()
    else:
        for param in content_type.split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "width":
                given = value.strip().strip('"')
    if given is not None:
        if given not in ("16", "32"):
            raise HopmeterError(f"token id width {given!r} is not 16 or 32")
        return int(given)
    if headers.get("x-tokenizer", "").strip().lower() in SIXTEEN_BIT_VOCABULARIES:
        return 16
    return DEFAULT_WIDTH_BITS


class PackedIdDecoder:
    """Bytes of a packed body in, one Frame per feed that completes at least one id out."""

    def __init__(self, width: int = DEFAULT_WIDTH_BITS) -> None:
        if width not in WIDTHS_BYTES:
            raise HopmeterError(f"token id width {width} is not 16 or 32")
        self.width = width
        self._size = WIDTHS_BYTES[width]
        self._pending = b""  # at most size - 1 bytes: the start of an id split across chunks
        self.ids_total = 0
        self.trailing_bytes = 0

    def feed(self, data: bytes, now: float) -> list[Frame]:
        """The ids completed by `data`, as one event (none when no id completed)."""
        buf = self._pending + data
        whole = len(buf) - len(buf) % self._size
        self._pending = buf[whole:]
        if whole == 0:
            return []
        ids = [
            int.from_bytes(buf[i : i + self._size], "little") for i in range(0, whole, self._size)
        ]
        self.ids_total += len(ids)
        text = "[" + ",".join(map(str, ids)) + "]"
        return [Frame(t_s=now, kind=FRAME_KIND, data=text, wire_bytes=whole, data_bytes=whole)]

    def close(self, now: float) -> list[Frame]:
        """End of body: a partial id cannot complete; it is counted, not dispatched."""
        del now
        self.trailing_bytes = len(self._pending)
        self._pending = b""
        return []


def pack_ids(ids: list[int], width: int = DEFAULT_WIDTH_BITS) -> bytes:
    """The packed bytes of `ids` (what a token-id stream sends; for tests)."""
    size = WIDTHS_BYTES[width]
    return b"".join(i.to_bytes(size, "little") for i in ids)
