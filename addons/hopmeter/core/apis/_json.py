"""Small typed readers for decoded JSON values, shared by every format's parser.

Each reader takes whatever a payload holds at a key and returns the type the parser needs, or an
empty value of it: a parser reads a malformed or unexpected field as absent, never raises on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import orjson

from hopmeter.core.secrets import REDACTED, has_key, scrub

MAX_ERROR_CHARS: Final = 500  # an error message is evidence, not a payload store
MAX_SHOWN_ERROR_CHARS: Final = 200
# An error's kind (its type, code and status) is shown where its message is not: a word or a
# number ("overloaded_error", 429, "RESOURCE_EXHAUSTED"); anything else, a phrase included (a
# `code` may be free text, the user's own), is dropped.
_KIND_PART = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# A count a payload says (tokens, usage) above this is no count: records keep counts in 32-bit
# columns and as JSON integers, and no reply is two billion tokens long.
MAX_COUNT: Final = 2**31 - 1


def _int(value: object) -> int | None:
    """A count: a non-negative integer up to MAX_COUNT, else absent."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _int_list(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(_is_int(x) for x in value):
        return tuple(value)
    return None


# A model name is an id (the longest in the corpus: ~60 characters); a longer one is clipped
# where a flow's model is set (`clip_model`), and the record says by how much.
MAX_MODEL_CHARS: Final = 256


def _model(value: object) -> str | None:
    """A model id a payload names (a non-empty string), as named: `clip_model` bounds it."""
    return value if isinstance(value, str) and value else None


def clip_model(model: str) -> tuple[str, int]:
    """`model` within MAX_MODEL_CHARS, and how many characters were clipped off it (it goes
    into every record and the console line)."""
    extra = len(model) - MAX_MODEL_CHARS
    return (model, 0) if extra <= 0 else (model[:MAX_MODEL_CHARS], extra)


def _dumps(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return ""


def _error_text(value: object) -> str | None:
    """An error object or string as hopmeter keeps it, or None when there is none: its kind
    (type, code and status, each a short word or number) and, after a newline, its message (the
    upstream's own text, which may quote the prompt or a key: `shown_error` says it only when
    asked to). A string is all message; an object with no kind and no message is its JSON."""
    if value is None or value is False or value in ("", {}):
        return None
    if isinstance(value, str):
        return "\n" + value[:MAX_ERROR_CHARS]
    err = _dict(value)
    parts = [_kind_part(err[k]) for k in ("type", "code", "status") if err.get(k) is not None]
    if parts[:1] == ["error"] and len(parts) > 1:
        parts = parts[1:]  # a whole event {"type": "error", ...}: its type says nothing more
    kind = ": ".join(p for p in parts if p)
    message = err.get("message")
    if message is None and not parts:
        message = _dumps(value)
    if message is None or message == "":
        return kind or "\n" + _dumps(value)[:MAX_ERROR_CHARS]
    return f"{kind}\n{str(message)[:MAX_ERROR_CHARS]}"


def _kind_part(value: object) -> str:
    """One part of an error's kind as shown: a short word, number or phrase, else ''."""
    text = str(value)
    if not _KIND_PART.fullmatch(text) or has_key(text):
        return ""
    return text


def shown_error(kept: str, *, with_message: bool, hidden: Iterable[str] = ()) -> str:
    """An error as a record shows it: its kind ("error" when it has none), and with
    `with_message` (--log-content) its message too, without the `hidden` values (the request's
    own credentials) and anything shaped like a key, a bearer token or a URL's credentials."""
    kind, _, message = kept.partition("\n")
    if not with_message or not message:
        return kind or "error"
    text = f"{kind}: {message}" if kind else message
    for value in sorted(hidden, key=len, reverse=True):  # a value that holds another: first
        text = text.replace(value, REDACTED)
    return scrub(text)[:MAX_SHOWN_ERROR_CHARS]


def _json_object(raw: bytes) -> dict[str, object] | None:
    """An event payload's bytes read as a JSON object, else None (the plain paths' reader).

    orjson reads the bytes and rejects invalid UTF-8, so a payload this accepts decodes without
    a replacement character or an unfinished sequence, and needs no decoded copy.
    """
    if raw[:1] != b"{":
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return doc if type(doc) is dict else None
