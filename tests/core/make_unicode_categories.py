"""Writes addons/hopmeter/core/unicode_categories.py from a Unicode 16.0.0 character database.

    pip install unicodedata2==16.0.0 && python tests/core/make_unicode_categories.py

(Python 3.14's own `unicodedata` is 16.0.0 as well, and serves without the package.) 16.0.0 is
the version of the tables tiktoken's pre-tokenizer runs on (its Rust `regex` crate's),
which hopmeter's counts are held to; tests/core/test_unicode_categories.py says how that was
found and checks the module against `regex`'s (18.0.0) and the running Python's tables.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

VERSION = "16.0.0"
# the general categories the patterns name: \p{L} (its five), \p{M} (three), \p{N} (three)
CATEGORIES = ("Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No")
MODULE = Path(__file__).resolve().parents[2] / "addons/hopmeter/core/unicode_categories.py"

HEAD = '''\
"""The Unicode {version} general categories of letters, marks and numbers, and White_Space: the
classes tiktoken's pre-tokenizer patterns name (\\\\p{{L}}, \\\\p{{N}}, \\\\p{{M}}, \\\\s), which
hopmeter.core.bpe writes out for the standard library's `re`.

{version} is the version of tiktoken's own tables (its Rust `regex` crate's), not the running
Python's `unicodedata` (15.0.0 on 3.12) nor the `regex` module's (18.0.0 in 2026.11): a code
point assigned in a later version is split as tiktoken splits it, as an unassigned one.
Written by tests/core/make_unicode_categories.py from the Unicode Character Database {version};
do not edit.
"""

from typing import Final

VERSION: Final = "{version}"
# One run of code points of one category a line: `first..last category`, or `code category`.
# Every code point not listed is none of these eleven categories.
CATEGORIES: Final = """\\
'''

TAIL = '''\
"""
# White_Space (PropList.txt): what `\\s` matches in tiktoken's patterns; the same code points
# since Unicode 6.3. Not the standard library's `\\s`, which adds U+001C..U+001F.
WHITE_SPACE: Final = "{white_space}"
'''


def runs(codes: list[int]) -> list[tuple[int, int]]:
    """`codes` (ascending) as runs of consecutive code points, first and last."""
    out: list[tuple[int, int]] = []
    for code in codes:
        if out and out[-1][1] == code - 1:
            out[-1] = (out[-1][0], code)
        else:
            out.append((code, code))
    return out


def span(first: int, last: int) -> str:
    return f"{first:04X}" if first == last else f"{first:04X}..{last:04X}"


def module_text(category: Callable[[str], str], version: str) -> str:
    """The module's text from a database's `category` function."""
    by_code = [(code, category(chr(code))) for code in range(sys.maxunicode + 1)]
    lines = []
    for name in CATEGORIES:
        codes = [code for code, c in by_code if c == name]
        lines += [(first, f"{span(first, last)} {name}") for first, last in runs(codes)]
    # White_Space: the separators (Zs, Zl, Zp), and the controls TAB..CR and NEL
    white = [c for c, name in by_code if name in {"Zs", "Zl", "Zp"}] + [*range(9, 14), 0x85]
    white_space = " ".join(span(a, b) for a, b in runs(sorted(white)))
    body = "".join(line + "\n" for _, line in sorted(lines))
    return HEAD.format(version=version) + body + TAIL.format(white_space=white_space)


def database() -> ModuleType | None:
    """A Unicode character database of VERSION: unicodedata2's, or the running Python's."""
    try:
        import unicodedata2 as ucd
    except ImportError:
        import unicodedata as ucd
    return ucd if ucd.unidata_version == VERSION else None


def main() -> int:
    ucd = database()
    if ucd is None:
        print(f"needs Unicode {VERSION}: pip install unicodedata2=={VERSION}", file=sys.stderr)
        return 1
    MODULE.write_text(module_text(ucd.category, VERSION))
    print(f"wrote {MODULE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
