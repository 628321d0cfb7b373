"""Flow records as JSON lines, read back (`read_records`).

They are written one line per record as flows finish, by the records output's writer thread
(hopmeter.export.outlets), each line whole: a reader never sees half a record.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from hopmeter.core.record import SCHEMA
from hopmeter.errors import HopmeterError


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
