"""Tests for hopmeter.core.passage: the findings about how the proxy itself moved a flow."""

from __future__ import annotations

from hopmeter.core.detectors import FIXES
from hopmeter.core.passage import (
    H2_PRIOR_KNOWLEDGE,
    INFORMATIONAL,
    PassageSeen,
    edited_after_streaming,
    proxy_failed,
)
from hopmeter.core.vocab import FindingKind, Severity


def test_a_proxy_failure_is_an_error_naming_its_cause() -> None:
    """mitmproxy failing on a flow is an error finding whose evidence and fix name the cause:
    a 1xx taken for the final response, a clear-text HTTP/2 client, or a crash of its layers."""
    early = proxy_failed("HTTP/1 103 Early Hints taken for the final response", INFORMATIONAL)
    crash = proxy_failed("NotImplementedError: trailers")
    h2c = proxy_failed("HTTP/2 connection preface", H2_PRIOR_KNOWLEDGE)
    assert early.kind == crash.kind == h2c.kind == FindingKind.PROXY_FAILED
    assert early.severity == crash.severity == h2c.severity == Severity.ERROR
    assert h2c.evidence["cause"] == "h2_prior_knowledge" and "HTTP/1.1" in h2c.fix
    assert early.evidence["cause"] == INFORMATIONAL and "HTTP/2" in early.fix
    assert crash.evidence == {"cause": "mitmproxy_error", "detail": "NotImplementedError: trailers"}
    assert "trailers" in crash.fix


def test_an_edit_after_streaming_is_a_warning_with_the_fix() -> None:
    """A hook's edit of a body already streamed is a warning that says how to buffer it."""
    finding = edited_after_streaming(1234).as_dict()
    assert finding["kind"] == "edited_after_streaming" and finding["severity"] == "warning"
    assert finding["evidence"] == {"streamed_bytes": 1234}
    assert finding["fix"] == FIXES[FindingKind.EDITED_AFTER_STREAMING]
    assert "hopmeter_buffer" in finding["fix"]


def test_how_mitmproxy_moved_a_flow_gives_its_findings() -> None:
    """A failure is a proxy_failed finding (a 1xx named as such), an edit after streaming a
    warning with the bytes that went out; the failure comes first."""
    seen = PassageSeen(
        section={"stream": "hopmeter"},
        error="HTTP/1 103 Early Hints taken for the final response",
        cause=INFORMATIONAL,
        edited_after_streaming=True,
        streamed_bytes=7,
    )
    failed, edited = seen.findings()
    assert failed.kind == FindingKind.PROXY_FAILED and failed.evidence["cause"] == INFORMATIONAL
    assert edited.kind == FindingKind.EDITED_AFTER_STREAMING
    assert edited.evidence == {"streamed_bytes": 7}
    quiet = PassageSeen(
        section={"stream": "chained"},
        error=None,
        cause="mitmproxy_error",
        edited_after_streaming=False,
        streamed_bytes=None,
    )
    assert quiet.findings() == []
