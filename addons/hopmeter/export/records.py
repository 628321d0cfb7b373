"""Where finished flow records go: a JSON-lines file, or stdout."""

from __future__ import annotations

import sys
from typing import BinaryIO


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
