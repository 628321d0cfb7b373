"""The fingerprint of a reply's visible text: what two hops share when a gateway drops the trace.

An LLM gateway that re-emits every event (LiteLLM, docs/gateways.md) rewrites everything about a
stream except its visible text: the JSON, the key order, the `model` and `created` fields, the line
endings, the event count, the compression. The text the meter already keeps for counting tokens
(answer, reasoning and tool arguments, decoded) is the same at both ends, so a digest of its first
characters, with its length in characters, names the reply at every hop it passed.

Privacy (docs/gateways.md has the longer version): a record never carries the text without
`--log-content`, only this digest: 64 bits of BLAKE2b over the first FINGERPRINT_CHARS
characters. The text cannot be read back from it; someone holding records who can guess a reply's
exact opening and length could confirm the guess (a canned refusal, say). With a key (`hopmeter
run --fingerprint-key-env VAR`, the same secret on every host) nobody without the key can test a
guess, and records from hosts with the same key still pair.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Characters of the reply's opening that go into the digest: replies that open alike (a greeting,
# a refusal template, a system-prompted preamble of a sentence or two) still differ within 512
# characters, and hashing them costs about a microsecond once per flow.
FINGERPRINT_CHARS = 512
# 8 bytes: two different openings collide with odds of 2**-64 per pair, and the length must
# match as well.
DIGEST_BYTES = 8
# BLAKE2b's personalisation: this digest is not any other BLAKE2b use's digest of the same text.
_PERSON = b"hopmeter.fp/1"
MAX_KEY_BYTES = 64  # BLAKE2b's key limit

# A dated snapshot suffix (gpt-4o-2024-08-06, claude-3-5-sonnet-20241022) and a provider prefix
# (openai/gpt-4o, as gateways route) name the same model family.
_DATE_SUFFIX = re.compile(r"[-@](?:\d{4}-\d{2}-\d{2}|\d{8})$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprint:
    """A reply's digest and visible length: equal at every hop the reply passed unchanged."""

    digest: str  # hex, DIGEST_BYTES bytes
    chars: int  # visible characters in the whole reply (not only the digested opening)
    keyed: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The record's `fingerprint` field (docs/design.md §4)."""
        out: dict[str, Any] = {"digest": self.digest, "chars": self.chars}
        if self.keyed:
            out["keyed"] = True
        return out

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Fingerprint | None:
        """The fingerprint a record carries, or None (no text, or an older record)."""
        fp = rec.get("fingerprint")
        if not isinstance(fp, Mapping):
            return None
        digest, chars = fp.get("digest"), fp.get("chars")
        if not isinstance(digest, str) or isinstance(chars, bool) or not isinstance(chars, int):
            return None
        return cls(digest=digest, chars=chars, keyed=bool(fp.get("keyed")))

    @property
    def key(self) -> tuple[str, int]:
        """What two flows must share to be the same reply."""
        return (self.digest, self.chars)


def fingerprint(opening: str, chars: int, key: bytes | None = None) -> Fingerprint | None:
    """The fingerprint of a reply whose text starts with `opening` and has `chars` characters.

    None for a reply without visible text (a token-id stream has a length but no text: nothing to
    tell two such replies apart by).
    """
    head = opening[:FINGERPRINT_CHARS]
    if not head or chars <= 0:
        return None
    h = hashlib.blake2b(
        head.encode("utf-8", "surrogatepass"),
        digest_size=DIGEST_BYTES,
        key=(key or b"")[:MAX_KEY_BYTES],
        person=_PERSON,
    )
    return Fingerprint(digest=h.hexdigest(), chars=chars, keyed=bool(key))


def normalise_model(name: object) -> str | None:
    """A model name as a weak signal: lower case, no provider prefix, no dated snapshot suffix."""
    if not isinstance(name, str) or not name.strip():
        return None
    base = name.strip().lower().rsplit("/", 1)[-1]
    return _DATE_SUFFIX.sub("", base) or base
