"""Structured logs: secrets and content never reach a log line; lines read `message key=value`."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from hopmeter.log import REDACTED, get_logger, plain, redact, render


def test_credentials_and_content_are_redacted_by_field_name() -> None:
    """Fields named like a credential or like user content are replaced, whatever their case."""
    event: dict[str, Any] = {
        "event": "flow",
        "Authorization": "Bearer sk-live",
        "cookie": "sid=1",
        "x-api-key": "k",
        "api_key": "k",
        "client_secret": "s",
        "password": "p",
        "session_id": "s1",
        "prompt": "hello",
        "messages": [{"role": "user"}],
        "response_body": b"{}",
        "reply_text": "hi",
    }
    out = redact(None, "info", event)
    assert out["event"] == "flow"
    assert {k for k, v in out.items() if v == REDACTED} == set(event) - {"event"}


def test_measurements_are_left_as_they_are() -> None:
    """Fields that carry measurements and names keep their values, and the message is never
    redacted even when it mentions a secret."""
    event = {"event": "the cookie jar", "hop": "edge", "ttft_s": 0.25, "status": 200, "model": "x"}
    assert redact(None, "info", dict(event)) == event


def test_text_values_are_scrubbed_of_keys_and_url_credentials() -> None:
    """A field that is no credential by its name may still quote one (an exception's text with
    the URL it failed on): its keys, bearer tokens, URL password and query values go."""
    event = {
        "event": "export failed",
        "reason": "ConnectionError: url /v1/traces?token=S3cret (http://u:pw@h/)",
        "detail": "401: bad key sk-live-abcdefgh123",
        "hop": "edge",
    }
    assert redact(None, "warning", event) == {
        "event": "export failed",
        "reason": "ConnectionError: url /v1/traces?token=[redacted] (http://[redacted]@h/)",
        "detail": "401: bad key [redacted]",
        "hop": "edge",
    }


def test_render_puts_the_message_first() -> None:
    """A line is the message, then key=value in the order given; nothing trails a bare message."""
    assert render(None, "info", {"event": "flow", "hop": "edge", "n": 3}) == "flow hop=edge n=3"
    assert render(None, "info", {"event": "started"}) == "started"


def test_a_log_call_reaches_the_standard_library_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """hopmeter's logger writes through stdlib logging (mitmproxy shows it), already redacted."""
    caplog.set_level(logging.INFO, logger="hopmeter")
    get_logger().info("flow finished", authorization="Bearer sk-live-123", hop="edge")
    (record,) = [r for r in caplog.records if r.name == "hopmeter"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == "flow finished authorization=[redacted] hop=edge"
    assert "sk-live" not in caplog.text


def test_levels_below_the_loggers_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """A debug line is not even rendered when the hopmeter logger is at INFO."""
    caplog.set_level(logging.INFO, logger="hopmeter")
    get_logger().debug("noisy", hop="edge")
    assert [r for r in caplog.records if r.name == "hopmeter"] == []


def test_a_plain_line_reads_as_the_structured_logger_writes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A line without fields reaches the hopmeter logger as structlog's chain renders it, and
    not below the logger's level."""
    caplog.set_level(logging.INFO, logger="hopmeter")
    get_logger().info("edge openai 200 ttft 0.2s ")
    plain("edge openai 200 ttft 0.2s ")
    plain("noisy", logging.DEBUG)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "hopmeter"]
    assert lines == [(logging.INFO, "edge openai 200 ttft 0.2s")] * 2


@pytest.mark.integration
def test_structlog_is_imported_at_the_first_structured_line() -> None:
    """Making loggers and writing plain lines leave structlog unimported (an idle proxy's
    memory); the first call of a logger imports it."""
    code = (
        "import sys\n"
        "from hopmeter.log import get_logger, plain\n"
        "log = get_logger()\n"
        "plain('a flow')\n"
        "print('structlog' in sys.modules)\n"
        "log.warning('a fault', hop='edge')\n"
        "print('structlog' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    assert "a fault hop=edge" in done.stderr
