"""Chaos re-chunks, splits characters and rewrites line endings, and nothing else."""

from __future__ import annotations

import pytest

from hopmeter.core.sse import SseDecoder
from hopmeter.errors import ChaosError
from hopmeter.proxy.addon.chaos import Chaos, parse_actions
from hopmeter.testing import feed_all

STREAM = 'data: {"t": "🦙 猫"}\r\n\r\ndata: two\n\ndata: three\r\r'.encode()


def run(chaos: Chaos, chunks: list[bytes]) -> list[bytes]:
    out = [p for c in chunks for p in chaos.feed(c)]
    return out + chaos.flush()


def test_rechunk_and_split_keep_the_bytes() -> None:
    """Re-chunking and splitting characters change the pieces, never the bytes."""
    for seed in range(50):
        out = run(
            Chaos(["rechunk", "split_utf8"], seed, rewrite_ok=True), [STREAM[:30], STREAM[30:]]
        )
        assert b"".join(out) == STREAM
        assert all(out)


def test_split_utf8_cuts_inside_a_character() -> None:
    """split_utf8 leaves a piece ending inside a multi-byte sequence."""
    out = Chaos(["split_utf8"], 1, rewrite_ok=True).feed("a🦙b".encode())
    assert len(out) == 2 and out[0][-1] >= 0x80


@pytest.mark.parametrize(("action", "ending"), [("crlf", b"\r\n"), ("cr", b"\r")])
def test_line_endings_rewritten_events_unchanged(action: str, ending: bytes) -> None:
    """Rewriting endings, even a CRLF split across chunks, keeps every SSE event the same."""
    chunks = [STREAM[: STREAM.index(b"\r\n") + 1], STREAM[STREAM.index(b"\r\n") + 1 :]]
    out = run(Chaos([action], 3, rewrite_ok=True), chunks)
    body = b"".join(out)
    assert b"\n" not in body.replace(b"\r\n", b"") if action == "crlf" else b"\n" not in body
    assert [f.data for f in feed_all(SseDecoder(), [body])] == [
        f.data for f in feed_all(SseDecoder(), [STREAM])
    ]
    assert ending in body


def test_no_rewrite_when_the_body_length_is_fixed() -> None:
    """With rewrite_ok False (Content-Length or encoding), endings are left alone, and the
    actions applied (what the record says) leave the rewrite out."""
    chaos = Chaos(["crlf", "rechunk"], 1, rewrite_ok=False)
    assert b"".join(run(chaos, [STREAM])) == STREAM
    assert chaos.applied == {"rechunk"}
    assert Chaos(["cr"], 1, rewrite_ok=False).applied == frozenset()
    assert Chaos(["cr"], 1, rewrite_ok=True).applied == {"cr"}


def test_unknown_action_is_named() -> None:
    """A typo names the known actions."""
    with pytest.raises(ChaosError, match="unknown chaos action 'rechunck'"):
        parse_actions("rechunck")
    with pytest.raises(ChaosError):
        parse_actions("cr,crlf")
    with pytest.raises(ChaosError, match="chaos ',' names no action; known: "):
        parse_actions(",")
    assert parse_actions("") == () and parse_actions(" rechunk, ") == ("rechunk",)
