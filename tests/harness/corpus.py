"""The recorded provider streams under tests/corpus/ (see tests/corpus/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
