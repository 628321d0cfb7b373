"""tiktoken's own encodings, the reference hopmeter's counts are held to, made without a network.

`tiktoken.get_encoding` downloads each vocabulary from OpenAI's blob store unless tiktoken's
cache (TIKTOKEN_CACHE_DIR, else a folder in the system's temporary directory) already holds it,
so a suite that called it passed only on a machine that had been online once. `encoding()`
builds the same `tiktoken.Encoding`: tiktoken's own constructor (its pre-tokenizer pattern and
special tokens, from `tiktoken_ext.openai_public`) and tiktoken's own loader and hash check, on
the vocabulary file hopmeter ships (addons/hopmeter/data, the same bytes, pinned by the same
sha256). Nothing of hopmeter's is in the reference: a bug in hopmeter's parsing cannot hide in it.
"""

from __future__ import annotations

import gzip
import os
from functools import cache
from pathlib import Path
from tempfile import TemporaryDirectory
from unittest import mock

import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public

DATA = Path(__file__).resolve().parents[2] / "addons" / "hopmeter" / "data"


@cache
def encoding(name: str) -> tiktoken.Encoding:
    """tiktoken's encoding `name` (o200k_base or cl100k_base), from the shipped vocabulary."""
    shipped = DATA / f"{name}.tiktoken.gz"
    with TemporaryDirectory() as tmp:
        local = Path(tmp) / f"{name}.tiktoken"
        local.write_bytes(gzip.decompress(shipped.read_bytes()))

        def load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
            if not url.endswith(f"/{name}.tiktoken"):
                raise AssertionError(f"{name}'s constructor asked for another file: {url}")
            # tiktoken's loader, its hash check included, on the local copy; an empty cache
            # directory tells it to read the path as it is and keep no copy
            return tiktoken.load.load_tiktoken_bpe(str(local), expected_hash)

        with (
            mock.patch.object(openai_public, "load_tiktoken_bpe", load),
            mock.patch.dict(os.environ, {"TIKTOKEN_CACHE_DIR": ""}),
        ):
            return tiktoken.Encoding(**openai_public.ENCODING_CONSTRUCTORS[name]())
