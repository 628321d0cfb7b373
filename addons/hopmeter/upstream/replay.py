"""Recorded transcripts replayed on the token clock, byte for byte."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hopmeter.errors import TranscriptError
from hopmeter.upstream.formats import Planned

# An SSE event ends at a blank line: two line endings in a row, in any of the three spellings.
_SSE_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
# Transcripts are test fixtures and captures; anything bigger is a mistake.
MAX_TRANSCRIPT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Transcript:
    """A recorded response body cut at event boundaries; the pieces join back to the exact bytes."""

    name: str
    content_type: str
    pieces: tuple[bytes, ...]

    @classmethod
    def load(cls, path: str) -> Transcript:
        """Read a `.sse` or `.ndjson` transcript; named after the file (without extension)."""
        p = Path(path)
        try:
            if p.stat().st_size > MAX_TRANSCRIPT_BYTES:
                raise TranscriptError(f"transcript {path} is larger than 64 MiB")
            data = p.read_bytes()
        except OSError as exc:
            raise TranscriptError(f"cannot read transcript {path}: {exc.strerror}") from exc
        ndjson = p.suffix in (".ndjson", ".jsonl")
        return cls(
            name=p.stem,
            content_type="application/x-ndjson" if ndjson else "text/event-stream",
            pieces=tuple(split_events(data, ndjson=ndjson)),
        )

    def plan(self) -> list[Planned]:
        """One planned send per event, one token-clock tick each."""
        return [Planned(piece, i, 1) for i, piece in enumerate(self.pieces)]


def split_events(data: bytes, *, ndjson: bool) -> list[bytes]:
    """Cut a body after each event's terminating blank line (or each NDJSON line)."""
    pieces: list[bytes] = []
    start = 0
    if ndjson:
        while (end := data.find(b"\n", start)) != -1:
            pieces.append(data[start : end + 1])
            start = end + 1
    else:
        for m in _SSE_EVENT_END.finditer(data):
            pieces.append(data[start : m.end()])
            start = m.end()
    if start < len(data):
        pieces.append(data[start:])
    return pieces
