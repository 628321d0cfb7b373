"""Content decoding on the side copy: one small decoder per Content-Encoding, composed into a chain.

Modelled on the shape of httpx's `_decoders.py`: every decoder has `decode(data) -> bytes` and
`flush() -> bytes`. Unlike a client, a measuring proxy must survive hostile bodies, so every decoder
produces output in bounded steps and stops with `DecodedSizeError` past a per-stream cap.
`steps(data)` hands those steps out one at a time, so a caller that handles each before asking for
the next never holds more than one step of a bomb (`decode` joins them). Library errors are
translated here, at the boundary, into `DecodingError`.
"""

from __future__ import annotations

import codecs
import zlib
from collections.abc import Iterator
from typing import IO, Any, Protocol, cast

from hopmeter.errors import DecodedSizeError, DecodingError

# The most a decoder hands back from one library call; bigger outputs are produced in a loop of
# these steps, so the cap below is checked every 64 KiB instead of after a bomb has gone off.
DECODE_STEP_BYTES = 64 * 1024
# The most one stream may decode to, per stage of the chain. The longest recorded LLM stream in
# the corpus is ~285 KB; 64 MiB leaves two orders of magnitude for long reasoning streams while a
# gzip bomb (1000:1) or zstd RLE (30000:1) stops at a size a proxy can hold for a few streams.
MAX_DECODED_BYTES = 64 * 1024 * 1024
# RFC 9659: zstd decoders for HTTP must support windows up to 8 MB and may refuse larger ones;
# without this cap zstandard accepts 128 MiB windows, i.e. 128 MiB of memory per stream.
ZSTD_MAX_WINDOW_BYTES = 8 * 1024 * 1024
# zstandard cannot limit one call's output, and a zstd RLE block turns 4 bytes into 128 KiB, so the
# input is written in slices this small: one slice makes at most 64 such blocks, 8 MiB.
ZSTD_SLICE_BYTES = 256

_LITERAL_FFFD = "\ufffd".encode()  # EF BF BD: a U+FFFD the server sent on purpose


class Decoder(Protocol):
    """One stage of content decoding: bytes in, bytes out, `flush()` at the end of the body."""

    def decode(self, data: bytes) -> bytes: ...

    def steps(self, data: bytes) -> Iterator[bytes]: ...

    def flush(self) -> bytes: ...


class _Budget:
    """Counts a stage's output and raises once it passes the cap."""

    def __init__(self, encoding: str, max_bytes: int) -> None:
        self.encoding = encoding
        self.max_bytes = max_bytes
        self.decoded_bytes = 0

    def spend(self, size: int) -> None:
        self.decoded_bytes += size
        if self.decoded_bytes > self.max_bytes:
            raise DecodedSizeError(
                f"{self.encoding} body decodes to more than {self.max_bytes} bytes;"
                " stopped measuring it"
            )


class IdentityDecoder:
    """No Content-Encoding: bytes pass through."""

    def decode(self, data: bytes) -> bytes:
        return data

    def steps(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

    def flush(self) -> bytes:
        return b""


class _ZlibDecoder:
    """zlib-based inflation in bounded steps (max_length + unconsumed_tail)."""

    def __init__(self, encoding: str, wbits: int, max_bytes: int) -> None:
        self._wbits = wbits
        self._budget = _Budget(encoding, max_bytes)
        self._obj: Any = zlib.decompressobj(wbits)

    def steps(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        while True:
            try:
                piece = self._obj.decompress(data, DECODE_STEP_BYTES)
            except zlib.error as exc:
                raise DecodingError(f"{self._budget.encoding} body is corrupt: {exc}") from exc
            self._budget.spend(len(piece))
            if piece:
                yield piece
            data = self._obj.unconsumed_tail
            if self._obj.eof and self._obj.unused_data:
                # Another gzip member follows (RFC 1952 §2.2 allows several): start afresh.
                data = self._obj.unused_data
                self._obj = zlib.decompressobj(self._wbits)
            elif not data and len(piece) < DECODE_STEP_BYTES:
                break

    def decode(self, data: bytes) -> bytes:
        return b"".join(self.steps(data))

    def flush(self) -> bytes:
        try:
            rest: bytes = self._obj.flush()
        except zlib.error as exc:
            raise DecodingError(f"{self._budget.encoding} body is corrupt: {exc}") from exc
        self._budget.spend(len(rest))
        return rest


class GzipDecoder(_ZlibDecoder):
    """Content-Encoding gzip / x-gzip (RFC 9110 §8.4.1.3), several members allowed."""

    def __init__(self, max_bytes: int = MAX_DECODED_BYTES) -> None:
        super().__init__("gzip", zlib.MAX_WBITS | 16, max_bytes)


class DeflateDecoder:
    """Content-Encoding deflate: zlib-wrapped as RFC 9110 says, or raw deflate as some servers send.

    The two are told apart by the zlib header (RFC 1950 §2.2: method 8, header a multiple of 31),
    so the first two bytes are held until both have arrived.
    """

    def __init__(self, max_bytes: int = MAX_DECODED_BYTES) -> None:
        self._max_bytes = max_bytes
        self._head = b""
        self._inner: _ZlibDecoder | None = None

    def decode(self, data: bytes) -> bytes:
        return b"".join(self.steps(data))

    def steps(self, data: bytes) -> Iterator[bytes]:
        if self._inner is None:
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return
            self._head = b""
            zlib_wrapped = data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            wbits = zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS
            self._inner = _ZlibDecoder("deflate", wbits, self._max_bytes)
        yield from self._inner.steps(data)

    def flush(self) -> bytes:
        if self._inner is None:
            if self._head:
                raise DecodingError("deflate body ended after one byte")
            return b""
        return self._inner.flush()


class BrotliDecoder:
    """Content-Encoding br (RFC 7932), via the optional `brotli` package (1.2 or later)."""

    def __init__(self, max_bytes: int = MAX_DECODED_BYTES) -> None:
        try:
            import brotli  # type: ignore[import-untyped]  # noqa: PLC0415 (optional dependency)
        except ImportError as exc:
            raise DecodingError(
                "Content-Encoding br needs the 'brotli' package: pip install 'brotli>=1.2'"
            ) from exc
        self._obj: Any = brotli.Decompressor()
        if not hasattr(self._obj, "can_accept_more_data"):
            # Older releases cannot limit the output of one call: a bomb would be decoded whole.
            raise DecodingError("bounded br decoding needs brotli>=1.2: pip install -U brotli")
        self._error: type[Exception] = brotli.error
        self._budget = _Budget("br", max_bytes)

    def decode(self, data: bytes) -> bytes:
        return b"".join(self.steps(data))

    def steps(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        while True:
            try:
                piece: bytes = self._obj.process(data, output_buffer_limit=DECODE_STEP_BYTES)
            except self._error as exc:
                raise DecodingError(f"br body is corrupt: {exc}") from exc
            self._budget.spend(len(piece))
            # Output may still be pending after the input is taken in: drain until empty.
            if not piece and self._obj.can_accept_more_data():
                break
            if piece:
                yield piece
            data = b""

    def flush(self) -> bytes:
        return b""


class _BoundedSink:
    """The file zstandard's stream_writer writes into: collects output, enforcing the budget."""

    def __init__(self, budget: _Budget) -> None:
        self._budget = budget
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._budget.spend(len(data))
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out

    def pieces(self) -> list[bytes]:
        """What was written since, as written (each at most the writer's write_size)."""
        out, self.parts = self.parts, []
        return out


class ZstdDecoder:
    """Content-Encoding zstd (RFC 8878), via the optional `zstandard` package.

    zstandard's decompressobj cannot limit one call's output, so the body goes through a
    stream_writer whose sink receives output in DECODE_STEP_BYTES pieces and raises past the cap.
    """

    def __init__(self, max_bytes: int = MAX_DECODED_BYTES) -> None:
        try:
            import zstandard  # noqa: PLC0415 (optional dependency)
        except ImportError as exc:
            raise DecodingError(
                "Content-Encoding zstd needs the 'zstandard' package: pip install zstandard"
            ) from exc
        self._error: type[Exception] = zstandard.ZstdError
        self._sink = _BoundedSink(_Budget("zstd", max_bytes))
        decompressor = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW_BYTES)
        # The writer only ever calls the sink's write(); the cast states what it is typed to take.
        self._writer: Any = decompressor.stream_writer(
            cast("IO[bytes]", self._sink), write_size=DECODE_STEP_BYTES, closefd=False
        )

    def decode(self, data: bytes) -> bytes:
        return b"".join(self.steps(data))

    def steps(self, data: bytes) -> Iterator[bytes]:
        for start in range(0, len(data), ZSTD_SLICE_BYTES):
            try:
                self._writer.write(data[start : start + ZSTD_SLICE_BYTES])
            except self._error as exc:
                raise DecodingError(f"zstd body is corrupt: {exc}") from exc
            # each piece as the writer wrote it (DECODE_STEP_BYTES at most): one slice of a
            # bomb is megabytes, never one piece for the framer to copy and split
            yield from self._sink.pieces()

    def flush(self) -> bytes:
        try:
            self._writer.flush()
        except self._error as exc:
            raise DecodingError(f"zstd body is corrupt: {exc}") from exc
        return self._sink.take()


class MultiDecoder:
    """Several encodings, given in the order they must be undone (the reverse of the header)."""

    def __init__(self, children: list[Decoder]) -> None:
        self.children = children

    def decode(self, data: bytes) -> bytes:
        return b"".join(self.steps(data))

    def steps(self, data: bytes) -> Iterator[bytes]:
        yield from self._through(0, data)

    def _through(self, stage: int, data: bytes) -> Iterator[bytes]:
        if stage == len(self.children):
            if data:
                yield data
            return
        for piece in self.children[stage].steps(data):
            yield from self._through(stage + 1, piece)

    def flush(self) -> bytes:
        data = b""
        for child in self.children:
            data = child.decode(data) + child.flush()
        return data


# Content-Encoding tokens (RFC 9110 §8.4.1, case-insensitive) and their decoders.
_DECODERS: dict[str, type[Decoder]] = {
    "identity": IdentityDecoder,
    "gzip": GzipDecoder,
    "x-gzip": GzipDecoder,
    "deflate": DeflateDecoder,
    "br": BrotliDecoder,
    "zstd": ZstdDecoder,
}


def make_decoder(content_encoding: str | None) -> Decoder:
    """The decoder chain for a Content-Encoding header value ("gzip", "deflate, br", None, ...)."""
    tokens = [t.strip().lower() for t in (content_encoding or "").split(",")]
    tokens = [t for t in tokens if t and t != "identity"]
    for token in tokens:
        if token not in _DECODERS:
            raise DecodingError(f"unknown Content-Encoding {token!r}; cannot measure this body")
    decoders = [_DECODERS[token]() for token in reversed(tokens)]
    if not decoders:
        return IdentityDecoder()
    return decoders[0] if len(decoders) == 1 else MultiDecoder(decoders)


class Utf8Decoder:
    """Incremental UTF-8 decoding of a whole stream, counting what went wrong on the way.

    `replacement_chars` counts U+FFFD produced from invalid bytes; `literal_replacement_chars`
    counts U+FFFD the input encoded validly (EF BF BD); `split_sequences` counts fed chunks that
    ended inside a multi-byte sequence (the decoder carried bytes over to the next chunk).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = 0
        self.replacement_chars = 0
        self.literal_replacement_chars = 0
        self.split_sequences = 0
        # bytes of an unfinished character held from the last chunk (FlowMeter's plain path reads
        # it: with none held, it counts an ASCII chunk itself, as `count` does)
        self.carrying = False

    def decode(self, data: bytes) -> str:
        if not self.carrying and data.isascii():
            # the common case on the per-chunk path: nothing to decode, count or carry
            self.chars += len(data)
            return data.decode("ascii")
        carried: bytes = self._decoder.getstate()[0]
        text = self._decoder.decode(data)
        self._count(text, carried + data)
        self.carrying = bool(self._decoder.getstate()[0])
        if self.carrying:
            self.split_sequences += 1
        return text

    def count(self, data: bytes) -> None:
        """decode() for its counts alone: an ASCII chunk with nothing carried is not decoded."""
        if not self.carrying and data.isascii():
            self.chars += len(data)
        else:
            self.decode(data)

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._count(text, b"")
        return text

    def _count(self, text: str, seen: bytes) -> None:
        # `seen` is this call's input plus the bytes carried in from the last call, so a literal
        # EF BF BD split across chunks is counted once, in the call that completes it. EF never
        # continues a sequence, so every EF BF BD in the bytes decodes to a literal U+FFFD.
        self.chars += len(text)
        if "\ufffd" in text:
            literal = seen.count(_LITERAL_FFFD)
            self.literal_replacement_chars += literal
            self.replacement_chars += text.count("\ufffd") - literal


def decode_payload(raw: bytes) -> tuple[str, int, bool]:
    """Decode one complete payload: (text, U+FFFD produced from invalid bytes, ends mid-sequence).

    A payload ends mid-sequence when its last bytes are the start of a multi-byte character whose
    rest never came (e.g. half an emoji per event); such a tail lies within the last three bytes.
    """
    text = raw.decode("utf-8", "replace")
    produced = 0
    if "\ufffd" in text:
        produced = text.count("\ufffd") - raw.count(_LITERAL_FFFD)
    incomplete = False
    if raw and raw[-1] >= 0x80:
        tail = raw[-3:]
        incomplete = codecs.utf_8_decode(tail, "replace", False)[1] < len(tail)
    return text, produced, incomplete
