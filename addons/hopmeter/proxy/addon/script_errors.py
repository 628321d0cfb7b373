"""A bad hopmeter option in plain mitmproxy said in one line, as `hopmeter run` says it.

mitmproxy logs an exception from a script's first `configure` with its traceback ("error in
script .../script.py", then the frames), an OptionsError too, whose message alone is the error
a user needs (`hopmeter_stall_threshold 'abc': expected a positive number of seconds, ...`).
`install()` (the script, `mitmdump -s "$(hopmeter --addon-path)"`) puts a filter on mitmproxy's
script logger that writes such a record as its line and the error's message, without the
frames; the record stays an error, so mitmproxy still exits at start ("Error logged during
startup"). Other exceptions keep their traceback: they are hopmeter's bugs, and the frames are
what a report needs.
"""

from __future__ import annotations

import logging

from mitmproxy import exceptions

SCRIPT_LOGGER = "mitmproxy.addons.script"  # mitmproxy.addons.script's `logging.getLogger(__name__)`


class OptionErrorsInOneLine(logging.Filter):
    """Writes a logged OptionsError as one line: the record's message and the error's."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, exceptions.OptionsError):
            record.msg, record.args = f"{record.getMessage()}: {exc}", ()
            record.exc_info = record.exc_text = None
        return True


def install() -> None:
    """Put the filter on mitmproxy's script logger, once (a script reloaded imports this again)."""
    logger = logging.getLogger(SCRIPT_LOGGER)
    if not any(isinstance(f, OptionErrorsInOneLine) for f in logger.filters):
        logger.addFilter(OptionErrorsInOneLine())
