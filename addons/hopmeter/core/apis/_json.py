"""Small typed readers for decoded JSON values, shared by every format's parser.

Each reader takes whatever a payload holds at a key and returns the type the parser needs, or an
empty value of it: a parser reads a malformed or unexpected field as absent, never raises on it.
"""

from __future__ import annotations

from typing import Final

import orjson

MAX_ERROR_CHARS: Final = 500  # an error message is evidence, not a payload store


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


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


def _model(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _dumps(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return ""


def _error_text(value: object) -> str | None:
    """A one-line description of an error object or string, or None when there is none."""
    if value is None or value is False or value in ("", {}):
        return None
    if isinstance(value, str):
        return value[:MAX_ERROR_CHARS]
    err = _dict(value)
    parts = [str(err[k]) for k in ("type", "code", "status", "message") if err.get(k) is not None]
    if parts[:1] == ["error"] and len(parts) > 1:
        parts = parts[1:]  # a whole event {"type": "error", ...}: its type says nothing more
    text = ": ".join(parts) if parts else _dumps(value)
    return text[:MAX_ERROR_CHARS]


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
