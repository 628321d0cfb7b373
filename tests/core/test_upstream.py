"""Tests for hopmeter.core.upstream: a failed upstream's record entry and finding."""

from __future__ import annotations

from hopmeter.core.detectors import FIXES
from hopmeter.core.upstream import CAUSE_FIXES, STATUS_SENT, UpstreamFailure, upstream_finding
from hopmeter.core.vocab import UPSTREAM_FAILURES, Ended, FindingKind


def test_every_upstream_cause_has_a_status_and_a_fix():
    """Each upstream ending says what the client got and how to fix it; both kinds have FIXES."""
    assert STATUS_SENT.keys() == CAUSE_FIXES.keys() == UPSTREAM_FAILURES
    assert {STATUS_SENT[c] for c in (Ended.CONNECT_TIMEOUT, Ended.UPSTREAM_TIMEOUT)} == {504}
    assert STATUS_SENT[Ended.UPSTREAM_IDLE] is None
    assert {FindingKind.UPSTREAM_UNREACHABLE, FindingKind.UPSTREAM_SILENT} <= FIXES.keys()


def test_timeouts_after_connecting_are_silent_the_rest_unreachable():
    """An upstream that connected and said nothing is upstream_silent; one never reached is
    upstream_unreachable; the evidence is the record's upstream_error."""
    silent = UpstreamFailure(
        cause=Ended.UPSTREAM_TIMEOUT, detail="silent 1s h:1", status_sent=504, timeout_s=1.0
    )
    finding = upstream_finding(silent)
    assert finding.kind == FindingKind.UPSTREAM_SILENT
    assert finding.evidence == {
        "cause": "upstream_timeout",
        "detail": "silent 1s h:1",
        "status_sent": 504,
        "timeout_s": 1.0,
    }
    tls = UpstreamFailure(cause=Ended.TLS_FAILED, detail="x", status_sent=502)
    assert upstream_finding(tls).kind == FindingKind.UPSTREAM_UNREACHABLE
    assert "http://" in upstream_finding(tls).fix
