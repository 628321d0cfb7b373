"""Transcripts are cut at event boundaries and join back to the exact recorded bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hopmeter.errors import TranscriptError
from hopmeter.upstream.replay import Transcript, split_events
from tests.harness.corpus import CORPUS


def test_every_corpus_file_splits_losslessly() -> None:
    """Each recorded body splits into events whose concatenation is the file, byte for byte."""
    files = sorted(CORPUS.rglob("*.sse")) + sorted(CORPUS.rglob("*.ndjson"))
    assert files, f"no corpus at {CORPUS}"
    for path in files:
        t = Transcript.load(str(path))
        assert b"".join(t.pieces) == path.read_bytes(), path
        assert all(t.pieces), path


def test_sse_split_accepts_all_three_line_endings() -> None:
    """Blank lines made of CR, LF or CRLF all end an event."""
    data = b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d"
    assert split_events(data, ndjson=False) == [
        b"data: a\n\n",
        b"data: b\r\n\r\n",
        b"data: c\r\r",
        b"data: d",
    ]


def test_missing_transcript_is_a_clear_error(tmp_path: Path) -> None:
    """A transcript that cannot be read names the file."""
    with pytest.raises(TranscriptError, match=r"cannot read transcript .*nope\.sse"):
        Transcript.load(str(tmp_path / "nope.sse"))
