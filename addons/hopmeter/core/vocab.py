"""hopmeter's closed sets of names, spelled once for every layer.

Each value is what a record (docs/design.md §4) and a metric label (§8) carry; the members are
`str`s, so they compare, hash and serialise as their values. A new API, ending, token source or
finding is added here first; the record, the metrics' allow-lists, the report and the dashboards
all read these tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

# The browser and screen lanes' names (hopmeter.core.browser), also their segments'
# ("browser>edge", "screen>browser") and the record's sections: here, so that what writes and
# shows records needs no browser measuring loaded.
BROWSER: Final = "browser"
SCREEN: Final = "screen"


class Api(StrEnum):
    """The wire format a response speaks (not the vendor: vLLM and Groq speak `openai.chat`)."""

    OPENAI_CHAT = "openai.chat"
    OPENAI_RESPONSES = "openai.responses"
    ANTHROPIC_MESSAGES = "anthropic.messages"
    GEMINI = "gemini"
    TGI = "tgi"
    OLLAMA = "ollama"
    TOKEN_IDS = "token_ids"
    SSE = "sse"  # an event stream of no known API
    NDJSON = "ndjson"  # a JSON-lines stream of no known API
    OTHER = "other"  # neither: a document, or a body that is timed and counted only


# Media-type names for a stream whose payloads have not said which API they speak yet.
UNKNOWN_APIS: Final = frozenset({Api.SSE, Api.NDJSON, Api.OTHER})
# APIs whose streams end with a terminal event; for the rest, "no terminal event" means nothing.
TERMINATED_APIS: Final = frozenset(
    {
        Api.OPENAI_CHAT,
        Api.OPENAI_RESPONSES,
        Api.ANTHROPIC_MESSAGES,
        Api.OLLAMA,
        Api.GEMINI,
        Api.TGI,
    }
)


class Ended(StrEnum):
    """How a flow ended (`ended` in the record, the `ended` label of flows_total)."""

    COMPLETE = "complete"  # the response finished as HTTP says it should
    UPSTREAM_RESET = "upstream_reset"  # the upstream closed or reset the connection mid-body
    CLIENT_GONE = "client_gone"  # the client hung up before the end
    ERROR = "error"  # any other failure mitmproxy reported
    SHUTDOWN = "shutdown"  # still in flight when the proxy stopped
    # The upstream could not be reached: the proxy answered 502 (504 for connect_timeout).
    CONNECT_REFUSED = "connect_refused"  # nothing listens on the upstream port
    DNS_FAILED = "dns_failed"  # the upstream host name does not resolve
    TLS_FAILED = "tls_failed"  # the TLS handshake with the upstream failed
    CONNECT_FAILED = "connect_failed"  # any other connect error (no route, host down, ...)
    CONNECT_TIMEOUT = "connect_timeout"  # no connection (TCP and TLS) within the connect timeout
    # The upstream was reached and went silent past the read timeout.
    UPSTREAM_TIMEOUT = "upstream_timeout"  # no response headers in time: answered 504
    UPSTREAM_IDLE = "upstream_idle"  # silent mid-body after the headers: the stream was cut


# Endings where the upstream could not be reached or went silent: the proxy answered (or cut the
# stream) itself, and the record says why in `upstream_error`.
UPSTREAM_FAILURES: Final = frozenset(
    {
        Ended.CONNECT_REFUSED,
        Ended.DNS_FAILED,
        Ended.TLS_FAILED,
        Ended.CONNECT_FAILED,
        Ended.CONNECT_TIMEOUT,
        Ended.UPSTREAM_TIMEOUT,
        Ended.UPSTREAM_IDLE,
    }
)


class TokenSource(StrEnum):
    """Where a flow's token counts come from, best first (docs/design.md §6)."""

    STREAM = "stream"  # the stream's own counts: token ids, logprobs, TGI's token
    USAGE = "usage"  # the stream's usage total, per-event counts scaled to it
    TOKENIZER = "tokenizer"  # a tokenizer on each event's text
    ESTIMATE = "estimate"  # the text-shape estimate


class Severity(StrEnum):
    """How bad a finding is."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


# Worst first: findings are listed in this order.
SEVERITY_ORDER: Final[Mapping[str, int]] = {
    Severity.ERROR: 0,
    Severity.WARNING: 1,
    Severity.INFO: 2,
}


class FindingKind(StrEnum):
    """What a detector can say about a flow, or `hops` about a segment (docs/design.md §7)."""

    WHOLE_BODY_HOLD = "whole_body_hold"
    BURST_GAPS = "burst_gaps"
    COMPRESSION_ON_STREAM = "compression_on_stream"
    BUFFERING_HEADERS = "buffering_headers"
    REPLACEMENT_CHAR = "replacement_char"
    SPLIT_UTF8 = "split_utf8"
    LINE_ENDINGS = "line_endings"
    TRUNCATED = "truncated"
    NOT_STREAMED = "not_streamed"
    STALL = "stall"
    SLOW_FIRST_TOKEN = "slow_first_token"
    SLOW_CLIENT = "slow_client"  # the client, not the path, set the pace (core.delivery)
    PROXY_HOLD = "proxy_hold"  # this hop's own process held bytes (core.delivery)
    SEGMENT_BATCHING = "segment_batching"  # a segment's tell, from two hops (core.hops)
    UPSTREAM_UNREACHABLE = "upstream_unreachable"  # no connection: refused, DNS, TLS, timeout
    UPSTREAM_SILENT = "upstream_silent"  # connected, then no headers or no bytes in time
    # a segment whose two hops saw different trace ids: paired by content (core.matching)
    TRACE_CONTEXT_DROPPED = "trace_context_dropped"
    # the proxy itself could not forward the response whole (core.passage)
    PROXY_FAILED = "proxy_failed"
    # a hook edited a body that had already been streamed to the client (core.passage)
    EDITED_AFTER_STREAMING = "edited_after_streaming"
    # a pair of hops whose order (which is outer) nothing told: reported, its holds not observed
    SEGMENT_UNORDERED = "segment_unordered"
    # negative durations (core.hops): two clocks disagree beyond their causal bounds, or two
    # views read from one clock were aligned wrong; counted, never observed
    CLOCK_SKEW_SUSPECT = "clock_skew_suspect"
    ALIGNMENT_SUSPECT = "alignment_suspect"
    # the page, from its beacon (core.client)
    CLIENT_DECODES_CHUNKS_ALONE = "client_decodes_chunks_alone"
    CLIENT_MISSED_EVENTS = "client_missed_events"
    CLIENT_RENDER_GROWS = "client_render_grows"
    CLIENT_WRITES_PER_TOKEN = "client_writes_per_token"
    CLIENT_REVEALS_AFTER_END = "client_reveals_after_end"
    CLIENT_SMOOTHING_BUFFER = "client_smoothing_buffer"


class BodyClip(StrEnum):
    """Why the copy of a streamed body kept for mitmproxy was cut (`mitmproxy.body_clipped` in
    a record, the `reason` label of hopmeter_bodies_clipped_total)."""

    FLOW_CAP = "flow_cap"  # the flow's body is longer than hopmeter_keep_body
    TOTAL_CAP = "total_cap"  # the open streams' copies together reached hopmeter_keep_body_total


class TraceReceived(StrEnum):
    """What a request's `traceparent` was as it came (`traceparent_received` in a record): the
    flow's trace is the client's (valid) or one hopmeter started (absent, malformed)."""

    VALID = "valid"
    ABSENT = "absent"  # no traceparent came
    MALFORMED = "malformed"  # one came that is not W3C trace context: the client's trace is lost


class PairedBy(StrEnum):
    """How two flows of one request at two hops were found (`paired_by` in records and hops)."""

    TRACE = "trace"  # the same W3C trace id at both hops
    CONTENT = "content"  # different trace ids: the same reply text, in nested time windows


class SegmentOrder(StrEnum):
    """How a segment's direction (which hop is the outer one) was known: never from a clock
    (`order` in a `hops` entry; docs/design.md §5)."""

    LINK = "link"  # the inner hop's span is the outer hop's child (traceparent)
    LEARNED = "learned"  # the same two hops were linked that way in other traces
    DECLARED = "declared"  # the listeners' order in one process, or `hopmeter join --order`
    UNKNOWN = "unknown"  # none of these: reported unordered, its holds not observed


class SkewBasis(StrEnum):
    """Where a segment's clock skew estimate comes from (`skew_basis` in a `hops` entry)."""

    ONE_CLOCK = "one_clock"  # both sides read one clock (one process, one page): skew 0
    CLOCKS_AGREE = "clocks_agree"  # the causal bounds allow agreeing clocks: taken as 0
    # the bounds exclude agreement: the skew at which the segment's fastest token had no hold
    FASTEST_TOKEN = "fastest_token"
    REQUEST_ORDER = "request_order"  # the bounds contradict (a clock stepped): the request's


class PairingMatch(StrEnum):
    """How sure a flow's pairing is (`pairing.match` in a record, the label of pairings_total)."""

    UNIQUE = "unique"  # one partner at each other hop: paired
    AMBIGUOUS = "ambiguous"  # several flows could be its partner: not paired, never guessed
    NONE = "none"  # no flow at another hop could be its partner


class BeaconOutcome(StrEnum):
    """What became of a browser beacon (the `outcome` label of hopmeter_beacons_total)."""

    JOINED = "joined"  # joined to its trace's record: the browser and screen lanes
    MISSING = "missing"  # a record waited for a beacon that did not come in time
    MALFORMED = "malformed"  # 400: not a beacon (not JSON, a field of the wrong type or size)
    WRONG_METHOD = "wrong_method"  # 405: not a POST
    UNSIZED = "unsized"  # 411: no Content-Length (a beacon always has one)
    TOO_LARGE = "too_large"  # 413: over 64 KiB, more than sendBeacon can send
    WRONG_ORIGIN = "wrong_origin"  # 403: not from the origin of the page that made the request
    UNKNOWN_TRACE = "unknown_trace"  # 404: no request of its trace announced a beacon here
    LATE = "late"  # 410: its record was written already
    DUPLICATE = "duplicate"  # 409: its trace's beacon came already
    FLOOD = "flood"  # 429: more beacons than the rate bound allows
    DROPPED = "dropped"  # accepted, then pushed out of a full wait list before its record came


class ProbeCheck(StrEnum):
    """How strictly `hopmeter probe` could judge a reply (the `check` of each probe stream)."""

    BYTES = "bytes"  # a hopmeter upstream played the canary: every byte, event and hold checked
    TEXT = "text"  # ... behind a gateway that re-frames events: text and holds, not bytes
    TIMING = "timing"  # the origin does not play the canary: the detectors on timing alone


class SpanOutcome(StrEnum):
    """What a join service did with one span it received (`hopmeter_join_spans_total{outcome}`)."""

    ACCEPTED = "accepted"  # a hopmeter span with a timeline, kept in the window
    FOREIGN = "foreign"  # not a hopmeter span (no hopmeter.hop): ignored
    NO_TIMELINE = "no_timeline"  # a hopmeter span sent with the timeline off: nothing to join
    MALFORMED = "malformed"  # a hopmeter span with absurd ids, times or timeline: rejected
    DUPLICATE = "duplicate"  # its span id is already in the window (an exporter's retry)
    LATE = "late"  # its trace already left the window
    OVERFLOW = "overflow"  # the window was full of events this span's trace alone holds


class TraceOutcome(StrEnum):
    """How a trace left a join service's window (`hopmeter_join_traces_total{outcome}`)."""

    JOINED = "joined"  # every span of it was paired with a neighbour hop
    PARTLY_JOINED = "partly_joined"  # some spans paired, some never found theirs
    UNLINKED = "unlinked"  # several spans, no parent links: ordered by hop at the end, if known
    ONE_SIDED = "one_sided"  # one span only: its other hop never arrived within the window
    EVICTED = "evicted"  # pushed out early because the window was at its bound
    LOST = "lost"  # still waiting when the service stopped


class EventLoop(StrEnum):
    """The event loop `hopmeter run` runs on (`--loop`)."""

    ASYNCIO = "asyncio"  # the standard library's selector loop (the default)
    UVLOOP = "uvloop"  # libuv's
