"""Why the upstream failed a flow: the cause, what the client got instead, and the fix.

A reverse proxy whose upstream cannot be reached answers for it, as nginx and Envoy do: 502 when
the connection fails (refused, DNS, TLS), 504 when the upstream does not connect or does not
answer in time. The proxy layer (hopmeter.proxy.addon.guard) names the cause; this module
turns it into the record's `upstream_error` and a finding with the fix (docs/design.md §4, §7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from hopmeter.core.detectors import Finding
from hopmeter.core.vocab import Ended, FindingKind, Severity

# What the client got in place of the upstream's answer. 502 for a connection that failed and
# 504 for one that timed out are what nginx answers (ngx_http_upstream.c: NGX_HTTP_BAD_GATEWAY,
# NGX_HTTP_GATEWAY_TIME_OUT for "upstream timed out ... while connecting"); a stream that went
# silent after its headers cannot be answered any more: it is cut (None).
STATUS_SENT: Final[Mapping[Ended, int | None]] = {
    Ended.CONNECT_REFUSED: 502,
    Ended.DNS_FAILED: 502,
    Ended.TLS_FAILED: 502,
    Ended.CONNECT_FAILED: 502,
    Ended.CONNECT_TIMEOUT: 504,
    Ended.UPSTREAM_TIMEOUT: 504,
    Ended.UPSTREAM_IDLE: None,
}

# Causes where the upstream was reached and then said nothing in time.
SILENT: Final = frozenset({Ended.UPSTREAM_TIMEOUT, Ended.UPSTREAM_IDLE})

CAUSE_FIXES: Final[Mapping[Ended, str]] = {
    Ended.CONNECT_REFUSED: (
        "Nothing listens on the upstream's port: the model server is down, still loading, or "
        "listening on another port. Check the port in the upstream URL and the server's logs, "
        "and send traffic only when /readyz passes (a readiness probe), so clients wait while "
        "the model loads."
    ),
    Ended.DNS_FAILED: (
        "The upstream's host name does not resolve: check its spelling in the upstream URL and "
        "the DNS the proxy uses (a Kubernetes Service in another namespace needs NAME.NAMESPACE)."
    ),
    Ended.TLS_FAILED: (
        "TLS to the upstream failed: an https:// upstream URL for a plain-HTTP port (use "
        "http://), or a certificate the proxy does not trust (--set "
        "ssl_verify_upstream_trusted_ca=FILE; --set ssl_insecure=true only in staging)."
    ),
    Ended.CONNECT_FAILED: (
        "The connection to the upstream failed (no route to the host, host down, or reset while "
        "connecting): check the network path and the upstream URL."
    ),
    Ended.CONNECT_TIMEOUT: (
        "The upstream did not accept the connection within --connect-timeout: a host that is "
        "down, a firewall dropping packets, or a server whose accept queue is full. Check the "
        "address; raise --connect-timeout only for a slow network path."
    ),
    Ended.UPSTREAM_TIMEOUT: (
        "The upstream accepted the request but sent no response headers within --read-timeout: "
        "it is overloaded or stuck, or it answers a non-streamed request only when done. Raise "
        "--read-timeout for long non-streamed replies, or ask for a stream."
    ),
    Ended.UPSTREAM_IDLE: (
        "The upstream sent nothing for longer than --read-timeout in the middle of a reply, so "
        "the stream was cut: a stuck generation or a dead upstream. Raise --read-timeout if "
        "pauses that long are normal (long reasoning with no keep-alive events)."
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamFailure:
    """Why the upstream failed a flow, and what the proxy did about it."""

    cause: Ended  # one of vocab.UPSTREAM_FAILURES
    detail: str  # e.g. "ECONNREFUSED 127.0.0.1:8000": an errno name and an address, no payload
    # the status the client got instead of the upstream's: STATUS_SENT[cause] when it was
    # answered, None when it was not (a stream cut after its headers, an HTTP/2 client)
    status_sent: int | None
    timeout_s: float | None = None  # the timeout that expired, for the timeout causes

    def as_dict(self) -> dict[str, Any]:
        """The record's `upstream_error`."""
        out: dict[str, Any] = {
            "cause": self.cause,
            "detail": self.detail,
            "status_sent": self.status_sent,
        }
        if self.timeout_s is not None:
            out["timeout_s"] = self.timeout_s
        return out


def upstream_finding(failure: UpstreamFailure) -> Finding:
    """The finding for a flow the upstream failed: its cause, and the fix for that cause."""
    kind = (
        FindingKind.UPSTREAM_SILENT if failure.cause in SILENT else FindingKind.UPSTREAM_UNREACHABLE
    )
    return Finding(
        kind=kind,
        severity=Severity.ERROR,
        evidence=failure.as_dict(),
        fix=CAUSE_FIXES.get(failure.cause, ""),
    )
