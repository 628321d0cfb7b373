"""Flow records as JSON lines: written as flows finish (`RecordSink`), read back (`read_records`).

A record is one line, flushed as it is written, so a reader (or a crash) loses nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from hopmeter.core.record import SCHEMA
from hopmeter.errors import HopmeterError


class RecordSink:
    """Appends one JSON line per record and flushes it, so a reader (or a crash) loses nothing."""

    def __init__(self, stream: BinaryIO, *, owned: bool) -> None:
        self._stream = stream
        self._owned = owned

    @classmethod
    def open(cls, path: str) -> RecordSink:
        """Open `path` for appending ("-" means stdout); raises OSError if it cannot be written."""
        if path == "-":
            return cls(sys.stdout.buffer, owned=False)
        return cls(open(path, "ab"), owned=True)

    def write(self, line: bytes) -> None:
        """Write one record line and flush it; raises OSError when the file cannot take it."""
        self._stream.write(line)
        self._stream.flush()

    def close(self) -> None:
        """Flush and close (stdout is only flushed)."""
        try:
            self._stream.flush()
        finally:
            if self._owned:
                self._stream.close()


def read_records(paths: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Every `hopmeter.flow/1` record in the given JSON-lines files ("-" = stdin)."""
    for path in paths:
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise HopmeterError(f"cannot read records from {path}: {exc.strerror}") from None
        yield from record_lines(data, path)


def record_lines(data: bytes, path: str) -> Iterator[dict[str, Any]]:
    """Every `hopmeter.flow/1` record in `data`, JSON lines read from `path` (named in errors);
    blank lines and objects of other schemas are passed over."""
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise HopmeterError(f"{path}:{n} is not a JSON record") from None
        if isinstance(rec, dict) and rec.get("schema") == SCHEMA:
            yield rec
