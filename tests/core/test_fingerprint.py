"""A reply's fingerprint: the same wherever its visible text is the same, never the text itself."""

from __future__ import annotations

import gzip
import json

from hopmeter.core.fingerprint import FINGERPRINT_CHARS, Fingerprint, fingerprint, normalise_model
from hopmeter.core.meter import FlowMeter
from hopmeter.core.vocab import Api

WORDS = ["Café", " naïve", " 🦙", " 流式", " “quoted”", "\t", " end"]


def _openai(words: list[str], *, spaced: bool, ending: bytes, model: str) -> bytes:
    """An OpenAI chat stream of `words`: compact JSON, or spaced with \\u escapes (json's)."""
    out = []
    for w in words:
        doc = {"model": model, "choices": [{"index": 0, "delta": {"content": w}}]}
        text = (
            json.dumps(doc)
            if spaced
            else json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
        )
        out.append(b"data: " + text.encode() + ending + ending)
    out.append(b"data: [DONE]" + ending + ending)
    return b"".join(out)


def _measured(body: bytes, *, encoding: str | None = None, step: int = 0) -> Fingerprint | None:
    meter = FlowMeter(
        api=Api.OPENAI_CHAT, content_type="text/event-stream", content_encoding=encoding
    )
    pieces = [body[i : i + step] for i in range(0, len(body), step)] if step else [body]
    for n, piece in enumerate(pieces):
        meter.feed(piece, n * 0.01)
    meter.close(1.0)
    return fingerprint(meter.text_head(FINGERPRINT_CHARS), meter.visible_chars)


def test_reframed_rewritten_and_compressed_copies_share_one_fingerprint() -> None:
    """Compact or spaced JSON with \\u escapes, LF or CRLF, gzip, one read or byte by byte, and a
    renamed model: the visible text is the same, so is the fingerprint."""
    plain = _measured(_openai(WORDS, spaced=False, ending=b"\n", model="demo"))
    assert plain is not None and plain.chars == len("".join(WORDS))
    spaced = _openai(WORDS, spaced=True, ending=b"\r\n", model="demo-1")
    assert b"\\u00ef" in spaced
    assert _measured(spaced) == plain
    assert _measured(spaced, step=1) == plain
    assert _measured(gzip.compress(spaced), encoding="gzip", step=7) == plain


def test_a_different_word_or_length_changes_it() -> None:
    """Replies that share their first words differ by a later word or by their length."""
    base = fingerprint("The answer is forty-two, as computed.", 37)
    assert base is not None
    assert fingerprint("The answer is forty-one, as computed.", 37) != base
    assert fingerprint("The answer is forty-two, as computed.", 38) != base
    assert base.key == (base.digest, 37) and len(base.digest) == 16


def test_only_the_opening_is_digested_and_the_text_never_kept() -> None:
    """Characters past FINGERPRINT_CHARS do not change the digest (the length still counts), and
    nothing of the text is in the fingerprint."""
    opening = "x" * FINGERPRINT_CHARS
    a, b = fingerprint(opening + "tail one", 600), fingerprint(opening + "other", 600)
    assert a is not None and a == b
    fp = fingerprint("a secret reply", 14)
    assert fp is not None and "secret" not in str(fp.as_dict())


def test_a_key_changes_every_digest_and_says_so() -> None:
    """A keyed fingerprint differs from the unkeyed one and from another key's, and says keyed."""
    plain, keyed = fingerprint("hello", 5), fingerprint("hello", 5, b"k1")
    assert plain is not None and keyed is not None
    assert keyed.digest not in (plain.digest, fingerprint("hello", 5, b"k2").digest)  # type: ignore[union-attr]
    assert keyed.as_dict() == {"digest": keyed.digest, "chars": 5, "keyed": True}
    assert Fingerprint.from_record({"fingerprint": keyed.as_dict()}) == keyed


def test_no_text_no_fingerprint() -> None:
    """A reply without visible text, or a record without the field, has no fingerprint."""
    assert fingerprint("", 12) is None
    assert fingerprint("abc", 0) is None
    assert Fingerprint.from_record({}) is None
    assert Fingerprint.from_record({"fingerprint": {"digest": "ab", "chars": True}}) is None


def test_model_names_are_normalised_as_a_weak_signal() -> None:
    """Provider prefixes, case and dated snapshots go; what a gateway renames stays different."""
    assert normalise_model("openai/GPT-4o-2024-08-06") == "gpt-4o"
    assert normalise_model("claude-3-5-sonnet-20241022") == "claude-3-5-sonnet"
    assert normalise_model("demo") != normalise_model("demo-1")
    assert normalise_model("") is None and normalise_model(None) is None
