"""Structured logs through the standard library (so mitmproxy's console shows them), redacted.

Nothing hopmeter logs should carry a secret or a prompt, but a redaction processor makes sure:
any field whose name looks like a credential or like content is replaced before rendering.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

import structlog

# Field names that may carry keys, cookies or user text. Matched against the key, not the value.
_SECRET_KEYS = re.compile(
    r"authori[sz]ation|cookie|api[_-]?key|secret|password|passwd|bearer|session|"
    r"prompt|content|body|text|messages",
    re.IGNORECASE,
)
REDACTED = "[redacted]"


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of every field whose name looks like a secret or content."""
    for key in list(event):
        if key != "event" and _SECRET_KEYS.search(key):
            event[key] = REDACTED
    return event


def render(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
    """`message key=value ...`, the message first, for a console a person reads."""
    message = str(event.pop("event", ""))
    rest = " ".join(f"{k}={v}" for k, v in event.items())
    return f"{message} {rest}".rstrip()


def configure() -> None:
    """Route structlog through stdlib logging with redaction; safe to call more than once."""
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, redact, render],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def get_logger() -> Any:
    """hopmeter's logger."""
    configure()
    return structlog.stdlib.get_logger("hopmeter")
