"""Findings about how the proxy itself moved a flow: mitmproxy failing on it, or a hook editing a
body that had already gone to the client (hopmeter.proxy.addon.passage watches for both)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hopmeter.core.detectors import FIXES, Finding
from hopmeter.core.vocab import FindingKind, Severity

# An informational response (1xx) that reached the `response` hook: mitmproxy 12's HTTP/1 client
# reads it as the final response (its body size is 0 by RFC 9112 §6.3), so the real one that
# follows is dropped as unexpected data and the client waits for a reply that never comes.
INFORMATIONAL = "informational_response"
INFORMATIONAL_FIX = (
    "mitmproxy 12 takes an HTTP/1 1xx response (103 Early Hints) for the final one: have the "
    "upstream not send 1xx responses to this proxy, or speak HTTP/2 to it (mitmproxy drops 1xx "
    "there)."
)
CRASH_FIX = (
    "mitmproxy's layers raised on this connection (the evidence says where): an HTTP/1 "
    "response with trailers is not supported by mitmproxy 12; a stream callable that raised is "
    "the addon's to fix."
)


# A client that opened HTTP/2 in clear text with prior knowledge (its connection preface, `PRI *
# HTTP/2.0`): mitmproxy speaks HTTP/2 only in TLS, so its disable_h2c addon kills the flow.
H2_PRIOR_KNOWLEDGE = "h2_prior_knowledge"
H2_PRIOR_KNOWLEDGE_FIX = (
    "The client opened HTTP/2 without TLS (prior knowledge: curl --http2-prior-knowledge, gRPC "
    "clients in plaintext), which mitmproxy does not speak; its connection was closed. Have it "
    "speak HTTP/1.1 to this listener, or HTTP/2 over TLS (mitmproxy offers it through ALPN)."
)
MITMPROXY_ERROR = "mitmproxy_error"

# A body mitmproxy buffered (hopmeter left it to mitmproxy: a JSON reply, `hopmeter_buffer`,
# `modify_body`) was larger than its body_size_limit: mitmproxy answered 502 and ended the flow.
BODY_SIZE_LIMIT = "body_size_limit"
BODY_SIZE_LIMIT_FIX = (
    "The body was larger than mitmproxy's body_size_limit, which applies to the bodies "
    "mitmproxy buffers; the client was answered 502 (a response's) or 413 (a request's). Raise "
    "body_size_limit, or let such bodies stream (stream_large_bodies; out of hopmeter_buffer)."
)
# Any other error mitmproxy ended a flow with (the evidence quotes it)
FLOW_ERROR = "mitmproxy_flow_error"
FLOW_ERROR_FIX = (
    "mitmproxy ended the flow with the error the evidence quotes, before the reply reached the "
    "client whole; what it names (a protocol error, a limit, an option) is where to look."
)
_CAUSE_FIXES = {
    INFORMATIONAL: INFORMATIONAL_FIX,
    H2_PRIOR_KNOWLEDGE: H2_PRIOR_KNOWLEDGE_FIX,
    MITMPROXY_ERROR: CRASH_FIX,
    BODY_SIZE_LIMIT: BODY_SIZE_LIMIT_FIX,
    FLOW_ERROR: FLOW_ERROR_FIX,
}


def proxy_failed(detail: str, cause: str = MITMPROXY_ERROR) -> Finding:
    """mitmproxy could not forward the flow whole: the client's connection was closed."""
    return Finding(
        kind=FindingKind.PROXY_FAILED,
        severity=Severity.ERROR,
        evidence={"cause": cause, "detail": detail},
        fix=_CAUSE_FIXES[cause],
    )


def edited_after_streaming(body_bytes: int | None) -> Finding:
    """A response hook edited a body that was already streamed: the client did not get it."""
    return Finding(
        kind=FindingKind.EDITED_AFTER_STREAMING,
        severity=Severity.WARNING,
        evidence={"streamed_bytes": body_bytes},
        fix=FIXES[FindingKind.EDITED_AFTER_STREAMING],
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PassageSeen:
    """How mitmproxy moved a flow, when that differs from `hopmeter run`'s way (the proxy layer's
    hopmeter.proxy.addon.passage.FlowPassage, taken when the flow ended)."""

    section: Mapping[str, Any]  # the record's `mitmproxy` section
    error: str | None  # mitmproxy's own failure on the flow
    cause: str  # what the failure was (MITMPROXY_ERROR, INFORMATIONAL, H2_PRIOR_KNOWLEDGE)
    edited_after_streaming: bool  # a hook edited a body that had already gone to the client
    streamed_bytes: int | None  # what of that body went out, when a copy counted it

    def findings(self) -> list[Finding]:
        """The findings about how the proxy moved the flow."""
        out = []
        if self.error is not None:
            out.append(proxy_failed(self.error, self.cause))
        if self.edited_after_streaming:
            out.append(edited_after_streaming(self.streamed_bytes))
        return out
