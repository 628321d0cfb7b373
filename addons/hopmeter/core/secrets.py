"""What a secret looks like in text hopmeter did not write: an upstream's error message, an
exception's text that quotes a URL. `scrub` takes out API keys and bearer tokens by their shape,
and a URL's password and query values; what a request itself carried is taken out by value where
it is known (core.wire.credential_values).
"""

from __future__ import annotations

import re
from typing import Final

REDACTED: Final = "[redacted]"

# API keys by their vendors' prefixes (OpenAI, Anthropic, Groq, xAI, Hugging Face, Replicate,
# NVIDIA, Cerebras, Google) and credentials after an HTTP auth scheme's name.
_KEY: Final = re.compile(
    r"\b(?:sk|pk|rk|gsk|xai|hf|r8|nvapi|csk)[-_][A-Za-z0-9_-]{8,}"
    r"|\bAIza[0-9A-Za-z_-]{20,}"
    r"|(?P<scheme>(?i:\b(?:bearer|basic)\s+))[A-Za-z0-9._~+/=-]{8,}"
)
# A URL's user:password@ and each query value (a `?key=` or `?token=` is a credential). Not a
# user alone, nor, in one of mitmproxy's modes, the HOST:PORT@ before the listen address
# (reverse:http://HOST:PORT@LISTEN): a numeric password elsewhere is still one.
_USERINFO: Final = re.compile(
    r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)"
    r"(?!(?<=reverse:http://)[^/\s@?#:]*:\d{1,5}@)"
    r"(?!(?<=reverse:https://)[^/\s@?#:]*:\d{1,5}@)"
    r"(?!(?<=upstream:http://)[^/\s@?#:]*:\d{1,5}@)"
    r"(?!(?<=upstream:https://)[^/\s@?#:]*:\d{1,5}@)"
    r"[^/\s@?#:]*:[^/\s@?#]+@",
    re.IGNORECASE,
)
_QUERY_VALUE: Final = re.compile(r"(?P<name>[?&][^=\s&#?]+=)[^&\s#'\")\]]+")


def has_key(text: str) -> bool:
    """Whether `text` holds something shaped like an API key or a bearer token."""
    return _KEY.search(text) is not None


def scrub(text: str) -> str:
    """`text` without key-shaped strings, bearer tokens, URL passwords and query values."""
    if "://" in text:
        text = _USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    if "=" in text:
        text = _QUERY_VALUE.sub(lambda m: m.group("name") + REDACTED, text)
    return _KEY.sub(lambda m: (m.group("scheme") or "") + REDACTED, text)
