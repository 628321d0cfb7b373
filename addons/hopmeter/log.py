"""Structured logs through the standard library (so mitmproxy's console shows them), redacted.

Nothing hopmeter logs should carry a secret or a prompt, but a redaction processor makes sure:
any field whose name looks like a credential or like content is replaced before rendering, and
every other text value is scrubbed of what looks like a key, a bearer token or a URL's password
and query values (an exception's text that quotes the URL it failed on: hopmeter.core.secrets).

structlog is imported at the first call of a logger `get_logger` gave, not before: ~0.7 MiB of
an idle proxy's memory (bench/idle_memory.py) for lines that come with a fault, a signal or a
rare event. The lines of an ordinary flow carry no fields (the console's line per flow and its
summary per window): `plain` writes them through the standard library's logger, as the
structlog chain renders them (no field to redact, the message alone), and never imports it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import MutableMapping
from typing import Any

from hopmeter.core.secrets import scrub

NAME = "hopmeter"  # the standard library's logger every hopmeter line goes through

# Field names that may carry keys, cookies or user text. Matched against the key, not the value.
_SECRET_KEYS = re.compile(
    r"authori[sz]ation|cookie|api[_-]?key|secret|password|passwd|bearer|session|"
    r"prompt|content|body|text|messages",
    re.IGNORECASE,
)
REDACTED = "[redacted]"


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of every field whose name looks like a secret or content; scrub the
    others' text."""
    for key, value in list(event.items()):
        if key != "event" and _SECRET_KEYS.search(key):
            event[key] = REDACTED
        elif isinstance(value, str):
            event[key] = scrub(value)
    return event


def render(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
    """`message key=value ...`, the message first, for a console a person reads."""
    message = str(event.pop("event", ""))
    rest = " ".join(f"{k}={v}" for k, v in event.items())
    return f"{message} {rest}".rstrip()


def configure() -> None:
    """Route structlog through stdlib logging with redaction; safe to call more than once."""
    import structlog  # noqa: PLC0415 - at the first log call (module doc)

    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, redact, render],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


class _Logger:
    """structlog's logger for hopmeter, made (and structlog imported) at its first use."""

    __slots__ = ("_bound",)

    def __init__(self) -> None:
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            import structlog  # noqa: PLC0415 - at the first log call (module doc)

            configure()
            self._bound = structlog.stdlib.get_logger(NAME)
        return getattr(self._bound, name)


def get_logger() -> Any:
    """hopmeter's logger: structlog's (`log.warning("message", key=value)`), made at first use."""
    return _Logger()


def plain(message: str, level: int = logging.INFO) -> None:
    """Log a line with no fields: what hopmeter's structlog logger writes for it, without
    importing structlog (module doc)."""
    logger = logging.getLogger(NAME)
    if logger.isEnabledFor(level):
        logger.log(level, message.rstrip())  # as `render` ends a line
