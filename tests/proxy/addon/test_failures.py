"""Tests for hopmeter.proxy.addon.failures: naming a failed connect, the 504 body, the cause log."""

from __future__ import annotations

import orjson
import pytest

from hopmeter.core.vocab import Ended
from hopmeter.proxy.addon.failures import CauseLog, address_text, connect_cause, error_body
from hopmeter.testing import ManualClock


@pytest.mark.parametrize(
    ("message", "cause", "name"),
    [
        ("[Errno 111] Connect call failed ('127.0.0.1', 1)", Ended.CONNECT_REFUSED, "ECONNREFUSED"),
        ("[Errno -2] Name or service not known", Ended.DNS_FAILED, "EAI-2"),
        ("[Errno -3] Temporary failure in name resolution", Ended.DNS_FAILED, "EAI-3"),
        ("[Errno 113] Connect call failed ('10.0.0.9', 80)", Ended.CONNECT_FAILED, "EHOSTUNREACH"),
        ("[Errno 110] Connect call failed ('10.0.0.9', 80)", Ended.CONNECT_FAILED, "ETIMEDOUT"),
        (
            "Multiple exceptions: [Errno 111] Connect call failed ('::1', 8000, 0, 0), "
            "[Errno 111] Connect call failed ('127.0.0.1', 8000)",
            Ended.CONNECT_REFUSED,
            "ECONNREFUSED",
        ),
        ("Connection killed: blocked", Ended.CONNECT_FAILED, "-"),
    ],
)
def test_the_errno_in_mitmproxys_text_names_the_cause(
    message: str, cause: Ended, name: str
) -> None:
    """The number OSError puts first decides the cause, never the English around it."""
    assert connect_cause(message) == (cause, name)


def test_addresses_read_as_host_port() -> None:
    """IPv4 and names as host:port, IPv6 in brackets, nothing as "?"."""
    assert address_text(("127.0.0.1", 8000)) == "127.0.0.1:8000"
    assert address_text(("::1", 8000)) == "[::1]:8000"
    assert address_text(None) == "?"


def test_the_error_body_is_what_openai_clients_parse() -> None:
    """{"error": {"message", "type", "code"}}, one line of JSON."""
    body = error_body(504, "upstream_timeout", "no headers in 600s")
    assert body.endswith(b"\n")
    assert orjson.loads(body) == {
        "error": {"message": "no headers in 600s", "type": "upstream_timeout", "code": 504}
    }


def test_a_flood_of_one_cause_is_one_line_then_one_per_interval() -> None:
    """The first failure is logged at once; the rest of the interval is one summary line; a
    cause quiet for a whole interval is forgotten, so its next failure is logged at once."""
    lines: list[str] = []

    now = ManualClock()
    log = CauseLog(interval_s=60, emit=lines.append, timers=now)
    for _ in range(1000):
        log.report("connect_refused", "refused 127.0.0.1:8000")
    log.report("tls_failed", "tls")
    assert len(lines) == 2 and log.timer is not None
    now.advance(59.9)
    assert len(lines) == 2
    now.advance(0.1)  # the interval ends
    assert lines[2:] == ["hopmeter: upstream connect_refused: 999 more in the last 60s"]
    now.advance(60)  # a quiet interval: both causes forgotten, no timer left
    assert len(lines) == 3 and log.active == {} and log.timer is None
    assert now.pending() == 0
    log.report("connect_refused", "refused again")
    assert lines[3].startswith("refused again")
    log.close()
    assert now.pending() == 0
    assert log.total == 1002
