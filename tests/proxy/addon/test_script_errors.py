"""Tests for hopmeter.proxy.addon.script_errors: an OptionsError logged by mitmproxy's script
loader is one line; any other exception keeps its traceback; installed once."""

from __future__ import annotations

import logging

import pytest
from mitmproxy import exceptions

from hopmeter.proxy.addon import script_errors


def _logged(exc: Exception, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    logger = logging.getLogger(script_errors.SCRIPT_LOGGER)
    try:
        raise exc
    except Exception as caught:
        logger.error("error in script %s", "/x/script.py", exc_info=caught)
    return caplog.records[-1]


def test_an_options_error_is_one_line_and_other_errors_keep_their_frames(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script_errors.install()
    script_errors.install()  # a reloaded script installs again: one filter
    logger = logging.getLogger(script_errors.SCRIPT_LOGGER)
    try:
        filters = [f for f in logger.filters if isinstance(f, script_errors.OptionErrorsInOneLine)]
        assert len(filters) == 1
        record = _logged(exceptions.OptionsError("hopmeter_hop: 'a b' is not a hop's name"), caplog)
        assert record.levelno == logging.ERROR  # mitmproxy still exits at start
        assert record.getMessage() == (
            "error in script /x/script.py: hopmeter_hop: 'a b' is not a hop's name"
        )
        assert record.exc_info is None
        bug = _logged(ZeroDivisionError("division by zero"), caplog)
        assert bug.exc_info is not None and bug.getMessage() == "error in script /x/script.py"
    finally:
        for f in filters:
            logger.removeFilter(f)
