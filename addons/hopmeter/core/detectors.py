"""Detectors: what broke a stream, each a pure function of one flow's timeline, with the fix.

Streaming faults never raise an error: a hop that forwards the body in one piece at the end has
produced a correct HTTP response. These detectors read timing and content evidence instead. The
"where to look first" table of the seed article "GPU to pixel" and the "five places a token can be
held" of "Streaming responses and buffering" are their specification (docs/design.md §7).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hopmeter.core.delivery import Delivery
from hopmeter.core.figures import fmean, median
from hopmeter.core.vocab import SEVERITY_ORDER, Ended, FindingKind, Severity

# -- thresholds, in one table, each with where the number comes from --------------------------
# A gap between tokens at or above this is a stall unless the run says otherwise (--stall-threshold;
# seed "Streaming responses": a 500 ms gap is what readers notice). The option's default, the
# report's for records that do not say theirs, and `Signals`' are this one number.
DEFAULT_STALL_THRESHOLD_S: float = 0.5
THRESHOLDS: dict[str, float] = {
    # whole_body_hold: share of the body's bytes that arrived in the burst after the longest
    # silence. A hop that holds the body releases all of it at once; 0.9 leaves room for bytes
    # flushed before the hold, such as a role prelude (seed "GPU to pixel": "nothing, then
    # everything").
    "hold_final_burst_share": 0.9,
    # ... and that burst must start late enough to matter to a reader: 0.5 s is the stall
    # threshold below (seed "Streaming responses": a 500 ms gap is what readers notice).
    "hold_min_wait_s": 0.5,
    # ... and be short next to the silence before it (span x this <= silence): a released body
    # arrives within milliseconds of a wait of seconds, while a steady stream after a long first
    # token takes longer than a fraction of its wait (the same margin as burst_gap_ratio).
    "hold_wait_to_span": 8.0,
    # Events closer than this (median gap) arrive at wire speed, not on a token clock: a clock
    # faster than 200 tokens/s (5 ms) is rare, and most events of a released body share a read
    # (gap 0; measured: an nginx gzip release of 300 events came in 1-4 reads, up to 6 ms apart).
    "burst_join_s": 0.005,
    # Fewer events than this say nothing about pacing.
    "min_events": 8,
    # burst_gaps: Ashman's D between the two clusters of log-gaps; D > 2 is the textbook condition
    # for a clean separation of a two-component mixture (Ashman, Bird & Zucker 1994).
    "burst_ashman_d": 2.0,
    # ... and the stall cluster's typical gap at least this many times the burst cluster's: natural
    # jitter of ±30% spans a ratio of 1.3/0.7 ≈ 1.9, coalescing has one cluster only.
    "burst_gap_ratio": 8.0,
    # ... and the stall cluster's typical gap at least one display frame (1/60 s; seed "GPU to
    # pixel": the screen draws a frame every 16.7 ms): bursts closer than that reach the screen
    # in the same or the next frame, so no reader sees them as stalls (measured: one nginx
    # release written in several reads a few ms apart).
    "burst_min_stall_s": 1 / 60,
    # ... and at least this many stalls: one stall is a scheduler hiccup (a `stall` finding), a
    # repeated stall-then-burst pattern is a buffer releasing windows.
    "burst_min_stalls": 2,
    # ... and each stall must be followed by several events on average: a buffer releases a
    # window of events at once (nginx gzip_bursts: 60-100 events a burst, buffer_bursts: ~22,
    # 1 KiB proxy buffers: 5-6; docs/nginx-holds.md), while a steady stream whose reads now and
    # then carry two events averages 1.00-1.02 (measured in tests/integration/test_scenarios.py).
    # Counted in events, not tokens, so that origin coalescing (k tokens per event) is not a burst.
    "burst_min_events": 3.0,
    # fixed byte window vs fixed token count: burst sizes whose spread (mean absolute deviation
    # from the median, over the median) is below this count as "fixed" (gzip and proxy buffers
    # release windows of equal bytes). Not the coefficient of variation: on a loaded host two
    # 4 KiB releases now and then land in one read (measured: one 8 KiB burst among twelve of
    # 4 KiB), and squaring lets that one burst dominate (CV 0.26, spread 0.08). The spread of
    # bytes and of tokens is then compared: a merge adds the same to both, so the quantity that
    # is exact in the other bursts wins.
    "burst_fixed_spread": 0.25,
    # slow_first_token: TTFT more than this many seconds after the first byte (seed "Streaming
    # responses": preludes cost 30-100 ms; reasoning can cost seconds).
    "slow_first_token_s": 0.5,
    # not_streamed: a document reply this long (tokens) would have shown its first words earlier.
    "not_streamed_min_tokens": 20,
    # slow_client: the stream waited on the client for at least this share of its duration
    # (first to last chunk read). Measured on loopback: readers that keep up wait 0-4 ms over
    # 1 s streams (0-0.4 %), readers that sleep between reads 50-90 % (tests/integration/
    # test_delivery.py); a tenth sits far from both.
    "slow_client_share": 0.1,
    # ... and at least this long in all: 100 ms is where a wait starts to be felt (the limit for
    # "instantaneous", Nielsen, Usability Engineering 1993, ch. 5), so shorter waits are noise.
    "slow_client_min_s": 0.1,
    # proxy_hold: this hop's own hold of one chunk (read -> handed to the client's socket) at or
    # above this. Three display frames (seed "GPU to pixel": a frame is 16.7 ms), a jump a reader
    # sees; on a loaded 2-core host with load 4-8 the hold's p99 was 0.2-3.7 ms (research runs
    # of issue 17), so this is over ten times what contention alone produced.
    "proxy_hold_s": 0.05,
    # ... or one of hopmeter's own steps (measuring, building a record) used at least this much
    # CPU while the flow streamed: more than a display frame during which the loop every stream
    # shares served none of them. CPU, not wall time, so a process the OS left waiting on a busy
    # host is not taken for hopmeter's own cost (that shows as loop lag instead).
    "proxy_step_cpu_s": 1 / 60,
}

FIXES: Mapping[str, str] = {
    FindingKind.WHOLE_BODY_HOLD: (
        "A hop buffers the whole body: turn off buffering and compression for event streams "
        "(nginx: proxy_buffering off; gzip off) or flush per event."
    ),
    FindingKind.BURST_GAPS: (
        "A buffer or compressor upstream releases the stream in windows: disable it for event "
        "streams, or flush after each event."
    ),
    FindingKind.COMPRESSION_ON_STREAM: (
        "Turn compression off for streaming endpoints: a compressor waits to fill its window "
        "before it writes."
    ),
    # Not every proxy honours these headers (measured, docs/gateways.md: Traffic Server 9.2.9 and
    # h2o 2.2.5, Debian's builds, against an upstream that sent both): Traffic Server's compress
    # plugin held the stream whole (2 reads, the body at the end), h2o compressed it anyway,
    # flushing each chunk. Both decide by content type, h2o also by x-compress-hint.
    FindingKind.BUFFERING_HEADERS: (
        "Send X-Accel-Buffering: no and Cache-Control: no-cache, no-transform, and no "
        "Content-Length or ETag: nginx and caches that honour them then stream the response. "
        "Compressors that decide by content type ignore them: for Apache Traffic Server's "
        "compress plugin leave text/event-stream out of compressible-content-type; for h2o send "
        "x-compress-hint: off (or leave compress off on that path)."
    ),
    FindingKind.REPLACEMENT_CHAR: (
        "The server decodes token bytes one at a time: hold bytes until they form valid UTF-8 "
        "before sending them."
    ),
    FindingKind.SPLIT_UTF8: (
        "Characters are split across events or reads: clients must use one streaming UTF-8 "
        "decoder per stream, never one per chunk."
    ),
    FindingKind.LINE_ENDINGS: (
        'Events end in CR or CRLF: clients that split on "\\n\\n" render nothing; accept all '
        "three line endings."
    ),
    FindingKind.TRUNCATED: (
        "The stream ended without its terminal event: treat the reply as failed and retry, "
        "even though the status was 200."
    ),
    FindingKind.NOT_STREAMED: (
        "Stream this reply: its first words could have appeared long before the last."
    ),
    FindingKind.STALL: (
        "A gap above the stall threshold: look for a scheduler admitting prefills or an "
        "upstream pause."
    ),
    FindingKind.SLOW_FIRST_TOKEN: (
        "The first visible token came well after the first byte (role prelude or reasoning): "
        "promise first-word times on TTFT, not TTFB."
    ),
    FindingKind.SLOW_CLIENT: (
        "The client, not the path, set the pace: it took the bytes slower than they came. Read "
        "the stream in a loop that does no per-chunk work (render or parse elsewhere), give it a "
        "larger receive buffer or HTTP/2 window; upstream and the hops are not the cause."
    ),
    FindingKind.PROXY_HOLD: (
        "This hop's own process held bytes: when own_step_max_cpu_s is high, hopmeter's "
        "measuring blocked its event loop (run --workers N, or report it); when loop lag and "
        "involuntary switches are high, the host starved the proxy of CPU."
    ),
    # The two upstream kinds carry a fix per cause (core.upstream.CAUSE_FIXES); these are the
    # kinds' summaries.
    FindingKind.UPSTREAM_UNREACHABLE: (
        "The proxy could not reach the upstream and answered 502 (504 on a connect timeout) "
        "itself: the evidence names the cause; send traffic only when /readyz passes."
    ),
    FindingKind.UPSTREAM_SILENT: (
        "The upstream went silent past --read-timeout: before its headers (answered 504) or "
        "mid-stream (cut); look for a stuck or overloaded model server."
    ),
    # core.passage: a fix per cause; these are the kinds' summaries
    FindingKind.PROXY_FAILED: (
        "mitmproxy could not forward this response whole and the client's connection was "
        "closed: the evidence names what it failed on."
    ),
    FindingKind.EDITED_AFTER_STREAMING: (
        "A response hook changed a body that had already been streamed: the client did not get "
        "the change. To edit it, have mitmproxy buffer it: --set hopmeter_buffer='FILTER'."
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One diagnosis: what, how bad, the numbers behind it, and the fix."""

    kind: FindingKind
    severity: Severity
    evidence: Mapping[str, Any]
    fix: str

    def as_dict(self) -> dict[str, Any]:
        """The record's JSON form."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "evidence": dict(self.evidence),
            "fix": self.fix,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamView:
    """What detectors read: one flow's timeline and content evidence, times in seconds."""

    status: int
    api: str
    event_stream: bool  # SSE or NDJSON framing
    headers: Mapping[str, str]
    ended: str
    chunk_times_s: Sequence[float]
    chunk_bytes: Sequence[int]
    event_times_s: Sequence[float]
    event_tokens: Sequence[int]
    ttfb_s: float | None = None
    ttft_s: float | None = None
    ttft_content_s: float | None = None
    max_gap_s: float | None = None
    stalls: int = 0
    stall_threshold_s: float = DEFAULT_STALL_THRESHOLD_S
    terminal_seen: bool = False
    errors: Sequence[str] = ()
    replacement_chars: int = 0  # U+FFFD in the visible text, however it got there
    invalid_utf8: int = 0  # U+FFFD produced by invalid bytes in the decoded body
    events_incomplete_utf8: int = 0
    chunks_split_utf8: int = 0
    line_endings: Mapping[str, int] = field(default_factory=dict)
    unterminated_bytes: int = 0
    read_in_part: bool = False  # the meter stopped reading (its read budget): no end to look for
    document_tokens: int = 0  # visible tokens of a reply that came as one JSON document
    stream_requested: bool | None = None
    has_terminal: bool = True  # whether this API defines a terminal event
    delivery: Delivery | None = None  # the bytes' way to the client, when it was followed
    # the gaps between the token-carrying events, each 0.0 unless above it, when measuring
    # computed them (core.figures.Gaps.event_gaps_s): spares detect_burst_gaps its own pass
    event_gaps_s: Sequence[float] | None = None


def _finding(kind: FindingKind, severity: Severity, **evidence: Any) -> Finding:
    return Finding(kind=kind, severity=severity, evidence=evidence, fix=FIXES[kind])


def detect_whole_body_hold(v: StreamView) -> Finding | None:
    """Nearly all bytes arrived in one burst at the end of a long wait.

    The burst is whatever came after the longest silence (counting from the request's start to
    the first byte), so no fixed "same burst" gap is needed: a released body may come in several
    reads a few milliseconds apart on a loaded host (measured: nginx gzip writing 256-byte
    buffers), and that must not split it. The burst must carry `hold_final_burst_share` of the
    bytes, start after `hold_min_wait_s`, be short next to the silence (`hold_wait_to_span`), and
    arrive at wire speed (median gap between its events under `burst_join_s`); the last test
    keeps a short reply on a steady clock after a long hidden-reasoning wait from passing as a
    held body.
    """
    if not v.event_stream or len(v.event_times_s) < THRESHOLDS["min_events"]:
        return None
    times, sizes = v.chunk_times_s, v.chunk_bytes
    total = sum(sizes)
    if total <= 0 or not times:
        return None
    # the longest silence: from the start (t = 0) or from an arrival to the next one
    waits = list(map(operator.sub, times, [0.0, *times[:-1]]))
    wait = max(waits)
    i = waits.index(wait)  # the first of the longest
    start, size = times[i], sum(sizes[i:])
    share = size / total
    span = times[-1] - start
    if (
        share < THRESHOLDS["hold_final_burst_share"]
        or start < THRESHOLDS["hold_min_wait_s"]
        or span * THRESHOLDS["hold_wait_to_span"] > wait
    ):
        return None
    at_or_after = map(operator.le, itertools.repeat(start), v.event_times_s)
    inside = list(itertools.compress(v.event_times_s, at_or_after))
    gaps = sorted(map(operator.sub, inside[1:], inside))
    if not gaps or gaps[len(gaps) // 2] < THRESHOLDS["burst_join_s"]:  # at wire speed
        return _finding(
            FindingKind.WHOLE_BODY_HOLD,
            Severity.ERROR,
            final_burst_share=round(share, 3),
            final_burst_at_s=round(start, 4),
            final_burst_bytes=size,
            final_burst_span_s=round(span, 4),
            events=len(v.event_times_s),
            wait_before_burst_s=round(wait, 4),
        )
    return None


# Gaps are clamped to this before their logarithm (two events in one read have a gap of 0).
_LOG_FLOOR_S = 1e-4


def _two_means_log(gaps: Sequence[float]) -> tuple[list[float], list[float]] | None:
    """Split log-gaps into two clusters at the threshold that minimises within-cluster variance.

    This is Otsu's method / 1-D two-means, exact by scanning every split of the sorted values.
    """
    if len(gaps) < 4:
        return None
    floor = _LOG_FLOOR_S
    xs = sorted([math.log(g if g > floor else floor) for g in gaps])
    n = len(xs)
    # running sums, added in the same order as a loop would: the same floats
    prefix = list(itertools.accumulate(xs, initial=0.0))
    prefix_sq = list(itertools.accumulate([x * x for x in xs], initial=0.0))
    total, total_sq = prefix[n], prefix_sq[n]
    best, best_i = math.inf, -1
    for i in range(1, n):
        lo_s = prefix[i]
        hi_s = total - lo_s
        sq = prefix_sq[i]
        sse = (sq - lo_s * lo_s / i) + (total_sq - sq - hi_s * hi_s / (n - i))
        if sse < best:
            best, best_i = sse, i
    return xs[:best_i], xs[best_i:]


def _variance(xs: Sequence[float]) -> float:
    """Population variance in floats (statistics.pvariance works in exact fractions: 7x slower,
    and the same to the last digits for gaps)."""
    mean = math.fsum(xs) / len(xs)
    return math.fsum((x - mean) ** 2 for x in xs) / len(xs)


def detect_burst_gaps(v: StreamView) -> Finding | None:
    """Inter-arrival gaps are bimodal: stalls separated by bursts.

    Statistic: the event gaps' logarithms are split in two by exact 1-D two-means (Otsu), and the
    split is accepted only if Ashman's D between the clusters exceeds 2 (a clean separation), the
    stall cluster's geometric mean is at least 8x the burst cluster's and at least one display
    frame, there are at least two stalls, and each stall is followed by several events. Log space
    because gaps are multiplicative (a 5 ms and a 500 ms mode). The tests reject, in turn:
    unimodal jitter (D small or ratio < 8), steady coalescing (one cluster), stalls too short to
    see (one release arriving in reads a few ms apart), a single long scheduler stall (one
    stall), and a steady stream with a few collapsed gaps (too few events per burst). Sarle's
    bimodality coefficient was not used: it rises for any strongly skewed sample, which a single
    stall produces.

    The last test comes from real streams (tests/integration/test_scenarios.py). On a loaded
    loopback path a steady 100 tokens/s stream has a handful of near-zero gaps: two events in one
    read, or a token clock catching up after a late wake-up. In log space these lie far below the
    10 ms mode, so two-means cuts them off as the "burst" cluster and the other tests pass (D 5 to
    58, ratio 40 to 100, hundreds of "stalls"). A buffer releasing windows looks the other way
    round: short gaps outnumber stalls, because each release carries many events. So the split
    must leave at least `burst_min_events` events per burst on average. Counting tokens instead
    would let coalescing (4 tokens in one event) pass as a burst.
    """
    if not v.event_stream or _no_bursts_by_figures(v):
        return None
    times, tokens = _carrying(v.event_times_s, v.event_tokens)
    if len(times) < THRESHOLDS["min_events"]:
        return None
    gaps = list(map(operator.sub, times[1:], times))  # mapped in C: no bytecode per gap
    # Necessary for the tests below, and cheap: the stall cluster's mean is at most the largest
    # gap and the burst cluster's at least the smallest, so a stream whose widest gap is under
    # one frame, or under `burst_gap_ratio` times its narrowest, has no bursts to find. Most
    # streams end here, before the two-means scan.
    widest = max(gaps)
    if widest < THRESHOLDS["burst_min_stall_s"] or widest < THRESHOLDS["burst_gap_ratio"] * max(
        min(gaps), _LOG_FLOOR_S
    ):
        return None
    split = _two_means_log(gaps)
    if split is None:
        return None
    lo, hi = split
    sd = math.sqrt(_variance(lo) + _variance(hi))
    d = math.inf if sd == 0 else math.sqrt(2) * abs(fmean(hi) - fmean(lo)) / sd
    ratio = math.exp(fmean(hi) - fmean(lo))
    if d < THRESHOLDS["burst_ashman_d"] or ratio < THRESHOLDS["burst_gap_ratio"]:
        return None
    if math.exp(fmean(hi)) < THRESHOLDS["burst_min_stall_s"]:
        return None
    if len(hi) < THRESHOLDS["burst_min_stalls"]:
        return None
    events_per_burst = len(times) / (len(hi) + 1)
    if events_per_burst < THRESHOLDS["burst_min_events"]:
        return None
    # the cut between the clusters, in seconds: a gap at or above it starts a new burst
    cut = math.exp((max(lo) + min(hi)) / 2)
    tokens_per_burst = _burst_sums(times, tokens, cut)
    bytes_per_burst = _burst_sums(v.chunk_times_s, v.chunk_bytes, cut)
    # the last burst is whatever was left when the stream ended: not a full window
    inner_bytes = bytes_per_burst[:-1] if len(bytes_per_burst) > 2 else bytes_per_burst
    inner_tokens = tokens_per_burst[:-1] if len(tokens_per_burst) > 2 else tokens_per_burst
    spread_bytes = _spread(inner_bytes)
    spread_tokens = _spread(inner_tokens)
    fixed = THRESHOLDS["burst_fixed_spread"]
    if spread_bytes <= fixed and spread_bytes < spread_tokens:
        pattern = "byte_window"  # a compressor or proxy buffer
    elif spread_tokens <= fixed:
        pattern = "token_count"  # origin coalescing (batching k tokens per release)
    else:
        pattern = "irregular"
    return _finding(
        FindingKind.BURST_GAPS,
        Severity.WARNING,
        bursts=len(tokens_per_burst),
        events_per_burst=round(events_per_burst, 1),
        tokens_per_burst=round(fmean(tokens_per_burst), 2),
        bytes_per_burst=median(inner_bytes) if inner_bytes else None,  # the typical window
        stall_period_s=round(fmean(g for g in gaps if g >= cut), 4),
        burst_gap_s=round(math.exp(fmean(lo)), 5),
        ashman_d=round(d, 2) if d != math.inf else None,
        gap_ratio=round(ratio, 1),
        pattern=pattern,
    )


def _no_bursts_by_figures(v: StreamView) -> bool:
    """detect_burst_gaps' first tests (too few events, or gaps too even to hold a stall) from the
    figures' gaps, when the view has them: True where those tests end it, False where they do not
    or cannot be told here (then it selects the events and takes their gaps itself).

    The figures' gap is the raw one where that is above 0, else 0.0. With every time finite no
    raw gap is NaN, and 0.0 in place of a gap at or below 0 changes neither test: the widest
    gap decides only when above 0 (the one-frame floor is), and the narrowest one is raised to
    _LOG_FLOOR_S anyway (tests/core/test_detectors.py holds the two ways together)."""
    gaps = v.event_gaps_s
    if (
        gaps is None
        or len(v.event_times_s) != len(v.event_tokens)  # (the selection's error, raised there)
        or not math.isfinite(sum(v.event_times_s))  # a NaN or infinite time
    ):
        return False
    if len(gaps) + 1 < THRESHOLDS["min_events"]:  # the token-carrying events, when any
        return True
    widest = max(gaps)
    return widest < THRESHOLDS["burst_min_stall_s"] or widest < THRESHOLDS["burst_gap_ratio"] * max(
        min(gaps), _LOG_FLOOR_S
    )


def _carrying(
    times: Sequence[float], tokens: Sequence[int]
) -> tuple[Sequence[float], Sequence[int]]:
    """The times and token counts of the events that carry tokens (selected in C)."""
    if len(times) != len(tokens):
        raise ValueError("event times and tokens differ in length")
    if min(tokens, default=1) > 0:  # every event carries tokens (the usual stream): as given
        return times, tokens
    keep = list(map(operator.lt, itertools.repeat(0), tokens))  # k > 0
    return list(itertools.compress(times, keep)), list(itertools.compress(tokens, keep))


def _burst_sums(times: Sequence[float], sizes: Sequence[int], cut_s: float) -> list[int]:
    """Sum `sizes` over runs of arrivals separated by gaps shorter than `cut_s`."""
    out: list[int] = []
    last: float | None = None
    for t, n in zip(times, sizes, strict=True):
        if last is None or t - last >= cut_s:
            out.append(n)
        else:
            out[-1] += n
        last = t
    return out


def _spread(xs: Sequence[int]) -> float:
    """Mean absolute deviation from the median, over the median: how unequal the sizes are."""
    mid = median(xs) if len(xs) >= 2 else 0
    if mid <= 0:
        return math.inf
    return fmean(abs(x - mid) for x in xs) / mid


def detect_compression(v: StreamView) -> Finding | None:
    """Content-Encoding on an event stream."""
    enc = v.headers.get("content-encoding", "").strip().lower()
    if v.event_stream and enc and enc != "identity":
        return _finding(FindingKind.COMPRESSION_ON_STREAM, Severity.WARNING, content_encoding=enc)
    return None


def detect_buffering_headers(v: StreamView) -> Finding | None:
    """Headers that make proxies buffer an event stream, or no header that tells them not to.

    A stream is flagged when it carries Content-Length or ETag (a proxy may buffer a body whose
    length it knows, and an ETag means something hashed the whole body first), or when it carries
    none of the signals that the response is live: `X-Accel-Buffering: no` (nginx's switch) or
    `Cache-Control` with no-cache, no-store or no-transform (RFC 9111 5.2.2.4-5.2.2.6: do not
    serve it from a cache, do not store it, do not transform it). One signal is enough, because
    proxies strip some of them: nginx never forwards X-Accel-Buffering (`proxy_hide_header` hides
    X-Accel-* by default), so behind an nginx the origin's header is gone while its Cache-Control
    remains (measured: every stream at the edge in tests/integration/test_scenarios.py). A header
    that a downstream proxy removed is not the origin's fault, and listing it at every edge would
    teach readers to ignore this finding.
    """
    if not v.event_stream or v.status != 200:
        return None
    h = v.headers
    cache = h.get("cache-control", "").lower()
    signals = h.get("x-accel-buffering", "").strip().lower() == "no" or any(
        directive in cache for directive in ("no-cache", "no-store", "no-transform")
    )
    problems = []
    if not signals:
        problems.append("no X-Accel-Buffering: no, no Cache-Control: no-cache or no-transform")
    if "content-length" in h:
        problems.append("Content-Length on a stream")
    if "etag" in h:
        problems.append("ETag on a stream")
    if not problems:
        return None
    severe = "content-length" in h or "etag" in h
    return _finding(
        FindingKind.BUFFERING_HEADERS,
        Severity.WARNING if severe else Severity.INFO,
        problems=problems,
    )


def detect_replacement_char(v: StreamView) -> Finding | None:
    """U+FFFD in the payload."""
    if v.replacement_chars or v.invalid_utf8:
        return _finding(
            FindingKind.REPLACEMENT_CHAR,
            Severity.ERROR,
            in_text=v.replacement_chars,
            from_invalid_bytes=v.invalid_utf8,
        )
    return None


def detect_split_utf8(v: StreamView) -> Finding | None:
    """Events (or reads) whose bytes end inside a UTF-8 sequence."""
    if v.events_incomplete_utf8:
        return _finding(
            FindingKind.SPLIT_UTF8,
            Severity.WARNING,
            events=v.events_incomplete_utf8,
            chunks=v.chunks_split_utf8,
        )
    if v.chunks_split_utf8:
        return _finding(FindingKind.SPLIT_UTF8, Severity.INFO, events=0, chunks=v.chunks_split_utf8)
    return None


def detect_line_endings(v: StreamView) -> Finding | None:
    """CR or CRLF line endings in an event stream."""
    cr, crlf = v.line_endings.get("cr", 0), v.line_endings.get("crlf", 0)
    if cr or crlf:
        return _finding(
            FindingKind.LINE_ENDINGS,
            Severity.INFO,
            cr=cr,
            crlf=crlf,
            lf=v.line_endings.get("lf", 0),
        )
    return None


def detect_truncated(v: StreamView) -> Finding | None:
    """No terminal event, a reset, a cut last event, or an error event inside a 200."""
    if not v.event_stream or v.status != 200:
        return None
    reasons = []
    if v.ended == Ended.UPSTREAM_RESET:
        reasons.append("upstream reset the connection")
    if v.errors:
        reasons.append("error event in a 200 stream")
    if v.unterminated_bytes and not v.read_in_part:
        reasons.append("last event not terminated")
    if v.has_terminal and not v.terminal_seen and v.ended == Ended.COMPLETE and not v.read_in_part:
        reasons.append("no terminal event")  # (unread, its end may well have been there)
    if not reasons:
        return None
    return _finding(
        FindingKind.TRUNCATED,
        Severity.ERROR,
        reasons=reasons,
        errors=list(v.errors[:3]),
        ended=v.ended,
        unterminated_bytes=v.unterminated_bytes,
    )


def detect_not_streamed(v: StreamView) -> Finding | None:
    """A chat reply delivered as one JSON document."""
    if v.event_stream or v.document_tokens < THRESHOLDS["not_streamed_min_tokens"]:
        return None
    severity = Severity.ERROR if v.stream_requested else Severity.WARNING
    return _finding(
        FindingKind.NOT_STREAMED,
        severity,
        tokens=v.document_tokens,
        first_visible_at_s=_round(v.ttft_s),
        stream_requested=v.stream_requested,
    )


def detect_stall(v: StreamView) -> Finding | None:
    """Gaps at or above the stall threshold."""
    if v.stalls:
        return _finding(
            FindingKind.STALL,
            Severity.WARNING,
            stalls=v.stalls,
            max_gap_s=v.max_gap_s,
            threshold_s=v.stall_threshold_s,
        )
    return None


def detect_slow_first_token(v: StreamView) -> Finding | None:
    """The first visible token far after the first byte."""
    if v.ttft_s is None or v.ttfb_s is None or not v.event_stream:
        return None
    lag = v.ttft_s - v.ttfb_s
    if lag < THRESHOLDS["slow_first_token_s"]:
        return None
    reasoning = None
    if v.ttft_content_s is not None:
        reasoning = round(v.ttft_content_s - v.ttft_s, 4)
    return _finding(
        FindingKind.SLOW_FIRST_TOKEN,
        Severity.INFO,
        ttfb_s=v.ttfb_s,
        ttft_s=v.ttft_s,
        lag_s=round(lag, 4),
        reasoning_before_content_s=reasoning,
    )


def detect_slow_client(v: StreamView) -> Finding | None:
    """The stream waited on the client for a good share of its duration.

    Client wait is the time some chunk of the flow was seen waiting to be taken by the client's
    side: in mitmproxy's HTTP/2 stream buffer (the client's window closed), in the transport's
    user-space buffer, or in the kernel's queue unsent (the client's receive window closed). Event
    streams only: a download always goes at the pace of one side, and that is no fault.
    """
    d = v.delivery
    if d is None or not v.event_stream or d.client_wait_s is None or len(v.chunk_times_s) < 2:
        return None
    span = v.chunk_times_s[-1] - v.chunk_times_s[0]
    wait = d.client_wait_s
    if wait < THRESHOLDS["slow_client_min_s"] or wait < THRESHOLDS["slow_client_share"] * span:
        return None
    return _finding(
        FindingKind.SLOW_CLIENT,
        Severity.WARNING,
        client_wait_s=round(wait, 4),
        stream_s=round(span, 4),  # first to last chunk read; the wait can outlast it
        wait_to_stream=round(wait / span, 3) if span > 0 else None,
        client_wait_is_lower_bound=d.client_wait_is_lower_bound,
        queued_bytes_max=d.queued_bytes_max,
        rwnd_limited_s=None if d.rwnd_limited_s is None else round(d.rwnd_limited_s, 4),
        http_version=d.http_version,
    )


def detect_proxy_hold(v: StreamView) -> Finding | None:
    """This hop's own process held bytes: a chunk held between read and write, or one of
    hopmeter's own steps blocking the loop while the flow streamed.

    A slow measuring step holds no chunk already written; it delays reading the next ones, which
    would pass for a slow upstream. So the step's CPU counts on its own, and the evidence carries
    the loop's lag and the involuntary context switches to tell a busy hopmeter from a starved
    host.
    """
    d = v.delivery
    if d is None:
        return None
    hold = d.hold_max_s or 0.0
    cpu = d.own_step_max_cpu_s or 0.0
    if hold < THRESHOLDS["proxy_hold_s"] and cpu < THRESHOLDS["proxy_step_cpu_s"]:
        return None
    return _finding(
        FindingKind.PROXY_HOLD,
        Severity.WARNING,
        hold_max_s=_round(d.hold_max_s),
        hold_p99_s=_round(d.hold_p99_s),
        own_steps=d.own_steps,
        own_step_max_s=_round(d.own_step_max_s),
        own_step_max_cpu_s=_round(d.own_step_max_cpu_s),
        loop_lag_max_s=_round(d.loop_lag_max_s),
        involuntary_switches=d.involuntary_switches,
    )


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


DETECTORS: tuple[Callable[[StreamView], Finding | None], ...] = (
    detect_whole_body_hold,
    detect_burst_gaps,
    detect_compression,
    detect_buffering_headers,
    detect_replacement_char,
    detect_split_utf8,
    detect_line_endings,
    detect_truncated,
    detect_not_streamed,
    detect_stall,
    detect_slow_first_token,
    detect_slow_client,
    detect_proxy_hold,
)

_INSIDE_A_HOLD = (FindingKind.BURST_GAPS, FindingKind.STALL, FindingKind.SLOW_FIRST_TOKEN)
_BETWEEN_BURSTS = (FindingKind.STALL, FindingKind.SLOW_FIRST_TOKEN)
_BACKPRESSURE = (FindingKind.STALL, FindingKind.BURST_GAPS)


def diagnose(v: StreamView) -> list[Finding]:
    """Every finding for one flow, worst first."""
    found = [f for d in DETECTORS if (f := d(v)) is not None]
    kinds = {f.kind for f in found}
    if FindingKind.WHOLE_BODY_HOLD in kinds:
        # a held body is one burst; the gaps inside it are not a separate finding
        # nor is the late first token: the hold is why it was late
        found = [f for f in found if f.kind not in _INSIDE_A_HOLD]
    elif FindingKind.BURST_GAPS in kinds:
        # the stalls between bursts are the buffer's windows (burst_gaps reports their period),
        # not a scheduler pause: the stall finding's fix would send the reader the wrong way
        found = [f for f in found if f.kind not in _BETWEEN_BURSTS]
    wait = v.delivery.client_wait_s if v.delivery is not None else None
    if FindingKind.SLOW_CLIENT in kinds and wait is not None and (v.max_gap_s or 0.0) <= wait:
        # a proxy reads no faster than its client takes the bytes (mitmproxy stops reading the
        # upstream while the client's side is full): gaps no longer than the client's wait are
        # its, and the stall and burst fixes would send the reader to the upstream; a longer
        # gap the client cannot explain stays reported
        found = [f for f in found if f.kind not in _BACKPRESSURE]
    return sorted(found, key=lambda f: SEVERITY_ORDER[f.severity])
