"""Chaos for staging: re-chunk, split characters and rewrite line endings on the way to the client.

Networks cut streams wherever they like; a client parser that only ever saw one event per read on
a laptop breaks in production. `--chaos rechunk,split_utf8,crlf` makes a staging hop do what
networks do, so the client's parser is proven before users find out. Opt-in, off by default.
Measuring always sees the upstream's original bytes; only what is sent to the client changes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable

from hopmeter.errors import ChaosError

ACTIONS = ("rechunk", "split_utf8", "crlf", "cr")
# rechunk cuts each chunk into at most this many pieces: enough to split events and lines at
# random places without turning one event into a storm of tiny writes.
MAX_PIECES = 4


def parse_actions(spec: str) -> tuple[str, ...]:
    """`rechunk,split_utf8,crlf` as a tuple; an unknown action names the known ones."""
    actions = tuple(a.strip() for a in spec.split(",") if a.strip())
    if spec.strip() and not actions:
        raise ChaosError(f"chaos {spec!r} names no action; known: {', '.join(ACTIONS)}")
    for a in actions:
        if a not in ACTIONS:
            raise ChaosError(f"unknown chaos action {a!r}; known: {', '.join(ACTIONS)}")
    if "crlf" in actions and "cr" in actions:
        raise ChaosError("chaos: choose crlf or cr, not both")
    return actions


class Chaos:
    """One response's chaos: bytes in, the pieces to send out."""

    def __init__(self, actions: Iterable[str], seed: int, *, rewrite_ok: bool) -> None:
        self.actions = frozenset(actions)
        self.rng = random.Random(seed)  # noqa: S311 - repeatable chaos, not cryptography
        # line endings change the body's length: only for bodies without Content-Length/encoding
        self.ending = None
        if rewrite_ok:
            self.ending = (
                b"\r\n" if "crlf" in self.actions else b"\r" if "cr" in self.actions else None
            )
        self._pending_cr = False
        # what it does to this body: not the line endings of one it may not rewrite
        self.applied = self.actions - ({"crlf", "cr"} if self.ending is None else set())

    def feed(self, data: bytes) -> list[bytes]:
        """The pieces to send for one upstream chunk (never an empty piece)."""
        if self.ending is not None:
            data = self._rewrite(data)
        pieces = [data] if data else []
        if "split_utf8" in self.actions:
            pieces = [p for piece in pieces for p in self._split_inside_char(piece)]
        if "rechunk" in self.actions:
            pieces = [p for piece in pieces for p in self._rechunk(piece)]
        return [p for p in pieces if p]

    def flush(self) -> list[bytes]:
        """What is left at the end of the body (a held CR)."""
        if self._pending_cr:
            self._pending_cr = False
            return [self.ending or b"\r"]
        return []

    def _rewrite(self, data: bytes) -> bytes:
        # normalise CRLF and CR to LF, remembering a CR at the end (its LF may come next)
        if self._pending_cr:
            data = b"\r" + data
            self._pending_cr = False
        if data.endswith(b"\r"):
            data = data[:-1]
            self._pending_cr = True
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        assert self.ending is not None
        return data.replace(b"\n", self.ending)

    def _split_inside_char(self, data: bytes) -> list[bytes]:
        starts = [i for i, b in enumerate(data) if b >= 0xC0]
        if not starts:
            return [data]
        cut = self.rng.choice(starts) + 1
        return [data[:cut], data[cut:]]

    def _rechunk(self, data: bytes) -> list[bytes]:
        if len(data) < 2:
            return [data]
        n = self.rng.randint(1, min(MAX_PIECES, len(data)))
        cuts = sorted(self.rng.sample(range(1, len(data)), n - 1))
        bounds = [0, *cuts, len(data)]
        return [data[a:b] for a, b in itertools.pairwise(bounds)]
