"""Hops: one stream seen at several vantage points, and how long each segment held each token.

Two flow records that share a trace id saw the same stream at two points of its path. Their events
carry `content_offset` (visible characters so far), which is the same at both points whatever the
framing, chunking or compression in between; aligning them by it gives, for every token, the time
the segment between the two points held it: `hold = t_outer - t_inner` (docs/design.md §5).
Where the inner hop followed its bytes out (`chunks_out`), that hold splits in two: the inner
hop's own (read -> left its process) and the wire between the hops (left the inner hop -> read
by the outer one), reported apart.

The same function serves the live case (two listeners of one process, one clock: the skew is
known to be 0) and `hopmeter join` on records from separate hosts, where the clocks may disagree:
the skew between them is bounded by causality (the request reaches the outer hop first; a token
leaves the inner hop before the outer one sees it) and estimated within those bounds, and every
hold says how far the bounds leave it open (`hold_uncertainty_s`). Which hop is the outer one is
never read from a clock (hopmeter.core.order). A hold that comes out negative all the same (two
clocks that moved against each other, two views of one clock aligned wrong) is kept in the record
with a finding that says so and counted, never observed as a hold.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hopmeter.core.figures import median, weighted_quantile, weighted_quantiles
from hopmeter.core.order import Chain, HopOrder, Link, Node, chains
from hopmeter.core.vocab import FindingKind, PairedBy, SegmentOrder, SkewBasis

# A segment that released its first token after this share of the inner hop's token span had
# passed held the whole body: nothing, then everything (seed "GPU to pixel").
WHOLE_BODY_SHARE = 0.9
# ... and only when that span is long enough for a reader to notice (the stall threshold's 0.5 s).
WHOLE_BODY_MIN_SPAN_S = 0.5
# The tell of a batching segment: inter-token latency fell to under half while the first token
# came this much later (seed "Streaming responses": bursts after stalls look fast per token).
BATCHING_ITL_RATIO = 0.5
BATCHING_TTFT_RISE_S = 0.25
# Finding kinds that describe pacing, and so can be attributed to the segment that introduced them.
PACING_KINDS = (
    FindingKind.WHOLE_BODY_HOLD,
    FindingKind.BURST_GAPS,
    FindingKind.COMPRESSION_ON_STREAM,
    FindingKind.STALL,
    FindingKind.LINE_ENDINGS,
    FindingKind.SPLIT_UTF8,
    FindingKind.REPLACEMENT_CHAR,
)

SEGMENT_FIXES = {
    FindingKind.SEGMENT_BATCHING: (
        "This segment turned a steady stream into bursts: inter-token latency fell while the "
        "first token came later; look for buffering or compression between these two hops."
    ),
    # LiteLLM 1.108.7, measured (docs/gateways.md); Kong's OpenTelemetry plugin documents its
    # `propagation` settings; for the rest, only their own docs can say.
    FindingKind.TRACE_CONTEXT_DROPPED: (
        "A hop on this segment does not pass the W3C traceparent header on, so its two sides were "
        "paired by their reply text (identical replies at once cannot be): make it forward "
        'traceparent. LiteLLM: litellm_settings callbacks: ["otel"] and '
        "forward_traceparent_to_llm_provider: true, both (with opentelemetry-sdk installed); "
        "Kong: the OpenTelemetry plugin's propagation (inject w3c); Portkey and other gateways: "
        "check their docs; a proxy of your own: copy traceparent onto the upstream request."
    ),
    FindingKind.SEGMENT_UNORDERED: (
        "Nothing said which of these two hops is in front of the other: no parent link joined "
        "their spans (a proxy between them adds a span of its own, or drops traceparent), no "
        "linked trace showed their order, none was declared. Declare it: `hopmeter join "
        "--order OUTER,INNER`; in one process, list the listeners outermost first. Until then "
        "its holds are not observed."
    ),
    FindingKind.CLOCK_SKEW_SUSPECT: (
        "Durations of this segment came out negative, or its two hosts' clocks differ by more "
        "than a second: the clocks moved against each other during the request (a step, not a "
        "slew) or a host's time is wrong. Check NTP or chrony on both; negative values are "
        "counted in hopmeter_negative_durations_total, not observed as holds."
    ),
    FindingKind.ALIGNMENT_SUSPECT: (
        "Durations of this segment came out negative although both sides read one clock: its "
        "two views were aligned by content offsets that do not count the same characters (a "
        "screen showing text the stream did not carry). They are counted in "
        "hopmeter_negative_durations_total, not observed."
    ),
}
# Segment findings that are not a segment's pacing: their severity (a segment finding names none).
SUSPECT_SEVERITY = "warning"
# Two hosts kept by NTP or chrony agree within milliseconds: a skew estimate past this is a
# host's time gone wrong (clock_skew_suspect), though the holds, corrected by it, stay sound.
SKEW_SUSPECT_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HopFlow:
    """What alignment needs of one flow record."""

    hop: str
    t_start: float  # wall clock, epoch seconds
    t_first_byte: float | None
    events: Sequence[Sequence[float]]  # [t_offset_s, tokens, content_offset]
    ttft_s: float | None
    itl_p50_s: float | None
    finding_kinds: frozenset[str]
    out_s: Sequence[float | None] = ()  # per event: when it left this hop's process, if known
    # First to last token of the whole stream, when `events` lists only its head (a capped
    # timeline); None: the span of `events` is the stream's.
    token_span_s: float | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> HopFlow:
        """The view of a `hopmeter.flow/1` record."""
        fig = rec.get("figures") or {}
        resp = rec.get("response") or {}
        events = rec.get("events") or []
        return cls(
            hop=str(rec.get("hop", "")),
            t_start=float(rec["request"]["t_start"]),
            t_first_byte=resp.get("t_first_byte"),
            events=events,
            ttft_s=fig.get("ttft_s"),
            itl_p50_s=fig.get("itl_p50_s"),
            finding_kinds=frozenset(f["kind"] for f in rec.get("findings") or []),
            # per event from a span (core.spans.span_record), else from the chunks it ended in
            out_s=rec.get("events_out")
            or events_out(events, rec.get("chunks") or [], rec.get("chunks_out") or []),
            token_span_s=fig.get("token_span_s"),
        )


def events_out(
    events: Sequence[Sequence[Any]],
    chunks: Sequence[Sequence[Any]],
    chunks_out: Sequence[Sequence[Any]],
) -> list[float | None]:
    """When each event left the hop's process: the out time of the chunk that completed it.

    An event's time is the read time of the chunk that ended it, to the same microsecond in the
    record, so the match is exact; an event past the listed chunks (or in a record without
    `chunks_out`) has none.
    """
    if not chunks_out or len(chunks_out) != len(chunks):
        return []
    times = [float(c[0]) for c in chunks]
    out: list[float | None] = []
    for ev in events:
        t = float(ev[0])
        i = bisect_right(times, t) - 1
        row = chunks_out[i] if i >= 0 and times[i] == t else None
        out.append(float(row[0]) if row and row[0] is not None else None)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """The hold one segment added, token by token."""

    segment: str  # "outer>inner"
    inner_hop: str
    holds_s: tuple[float, ...]  # one per token
    first_token_hold_s: float | None
    whole_body: bool
    skew_s: float  # inner clock minus outer clock, as estimated
    skew_bounds_s: tuple[float | None, float | None]
    findings: tuple[dict[str, Any], ...]
    inner_holds_s: tuple[float, ...] = ()  # per token the inner hop followed out: read -> out
    wire_holds_s: tuple[float, ...] = ()  # ... and left the inner hop -> read by the outer one
    paired_by: PairedBy = PairedBy.TRACE
    inner_flow_id: str | None = None  # the inner hop's record, when known
    order: SegmentOrder = SegmentOrder.LINK  # how `outer>inner` was known (UNKNOWN: unordered)
    skew_basis: SkewBasis = SkewBasis.CLOCKS_AGREE
    wire_clipped: int = 0  # wire holds a late out time made negative, counted as 0
    # inner request start - outer request start, on their own clocks (narrowed by the caller's
    # upper limit); None: the upper skew bound
    request_gap_s: float | None = None

    @property
    def outer_hop(self) -> str:
        """The outer hop's name ("" for an unordered pair)."""
        return self.segment.removesuffix(f">{self.inner_hop}") if self.ordered else ""

    @property
    def ordered(self) -> bool:
        """Whether the direction is known (an unordered pair has no holds to observe)."""
        return self.order != SegmentOrder.UNKNOWN

    @property
    def request_delay_s(self) -> float | None:
        """From the outer hop seeing the request to the inner hop seeing it, on one clock.

        The upper skew bound is the raw difference of the two request starts; the estimated skew
        takes its share back, so the delay lies between 0 (causality) and upper - lower. Below
        0 only where the clocks contradict the request's way (counted, `negatives`).
        """
        gap = self.skew_bounds_s[1] if self.request_gap_s is None else self.request_gap_s
        return None if gap is None or not self.ordered else gap - self.skew_s

    @property
    def hold_uncertainty_s(self) -> tuple[float | None, float | None]:
        """How far the causal bounds leave each hold open: the true hold lies between hold + lo
        and hold + hi (0 and 0 on one clock; None: unbounded on that side, both where the bounds
        contradict each other: a clock stepped, and nothing bounds the holds)."""
        lower, upper = self.skew_bounds_s
        if self.skew_basis == SkewBasis.ONE_CLOCK:
            return (0.0, 0.0)
        if lower is not None and upper is not None and lower > upper:
            return (None, None)
        return (
            None if lower is None else min(0.0, lower - self.skew_s),
            None if upper is None else max(0.0, upper - self.skew_s),
        )

    def negatives(self) -> dict[str, int]:
        """Durations of this segment below zero, by what they are: never observed, counted (the
        finding's evidence and hopmeter_negative_durations_total both read this)."""
        out = {"hold": sum(1 for h in self.holds_s if h < 0)}
        delay, added = self.request_delay_s, self.added_ttft_s
        out["request_delay"] = int(delay is not None and delay < 0)
        out["added_ttft"] = int(added is not None and added < 0)
        return {k: n for k, n in out.items() if n}

    @property
    def request_delay_bounds_s(self) -> tuple[float | None, float | None]:
        """What causality allows the request delay to be, whatever the clocks' skew."""
        lower, upper = self.skew_bounds_s
        if self.skew_basis == SkewBasis.ONE_CLOCK:
            delay = self.request_delay_s
            return (delay, delay)
        if upper is None or (lower is not None and lower > upper):
            return (None, None)  # no bound, or bounds that contradict each other (a clock stepped)
        return (0.0, None if lower is None else max(0.0, upper - lower))

    @property
    def added_ttft_s(self) -> float | None:
        """What this segment added to the time to first token: the request's way in plus the
        first token's hold on its way out (the skew cancels out of the sum)."""
        delay = self.request_delay_s
        if delay is None or self.first_token_hold_s is None:
            return None
        return delay + self.first_token_hold_s

    def as_dict(self) -> dict[str, Any]:
        """The `hops` entry of the outer record (docs/design.md §4)."""
        w = [1] * len(self.holds_s)

        def q(p: float) -> float | None:
            v = weighted_quantile(self.holds_s, w, p)
            return None if v is None else round(v, 6)

        lo, hi = self.hold_uncertainty_s
        out: dict[str, Any] = {
            "segment": self.segment,
            "inner_hop": self.inner_hop,
            "order": self.order,
            "first_token_hold_s": _r(self.first_token_hold_s),
            "hold_p50_s": _r(median_or_none(self.holds_s)),
            "hold_p99_s": q(0.99),
            "hold_max_s": round(max(self.holds_s), 6) if self.holds_s else None,
            "whole_body": self.whole_body,
            "tokens_aligned": len(self.holds_s),
            "skew_s": round(self.skew_s, 6),
            "skew_bounds_s": [None if b is None else round(b, 6) for b in self.skew_bounds_s],
            "skew_basis": self.skew_basis,
            "hold_uncertainty_s": [_r(lo), _r(hi)],
            "findings": list(self.findings),
            "paired_by": self.paired_by,
            "inner_flow_id": self.inner_flow_id,
            "request_delay_s": _r(self.request_delay_s),
            "request_delay_bounds_s": [_r(b) for b in self.request_delay_bounds_s],
            "added_ttft_s": _r(self.added_ttft_s),
        }
        # the hold split where the inner hop followed its bytes out: its own, and the wire's
        out.update(_quantiles("inner_hold", self.inner_holds_s))
        out.update(_quantiles("wire_hold", self.wire_holds_s))
        out["tokens_out"] = len(self.wire_holds_s)
        if self.wire_clipped:
            out["wire_holds_clipped"] = self.wire_clipped
        return out


def _quantiles(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """`{name}_p50_s` (a median), `{name}_p99_s` and `{name}_max_s` of per-token values (None
    when none)."""
    (p99,) = weighted_quantiles(values, [1] * len(values), (0.99,))
    p50 = median_or_none(values)
    top = max(values) if values else None
    return {
        f"{name}_p50_s": None if p50 is None else round(p50, 6),
        f"{name}_p99_s": None if p99 is None else round(p99, 6),
        f"{name}_max_s": None if top is None else round(top, 6),
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def median_or_none(values: Sequence[float]) -> float | None:
    """The median (hopmeter.core.figures.median) of some values, or None of none."""
    return median(values) if values else None


def _token_times(v: HopFlow) -> list[tuple[float, int, int]]:
    """(absolute time, tokens, content offset) of each token-carrying event (indexed, not
    unpacked with a starred target: that builds a list per event, twice as slow)."""
    t0 = v.t_start
    return [(t0 + float(e[0]), int(e[1]), int(e[2])) for e in v.events if e[1] > 0]


def _token_outs(v: HopFlow) -> list[float | None]:
    """When each token-carrying event left the hop (absolute), aligned with `_token_times`."""
    if not v.out_s:
        return []
    return [
        None if out is None else v.t_start + out
        for (_, k, *_), out in zip(v.events, v.out_s, strict=True)
        if k > 0
    ]


def _first_reaching(offsets: Sequence[int], times: Sequence[float], target: int) -> float | None:
    """When a hop's visible content first reached `target` characters (offsets are sorted)."""
    i = bisect_left(offsets, target)
    return times[i] if i < len(times) else None


def _reaching(
    outer_tokens: Sequence[tuple[float, int, int]], inner_tokens: Sequence[tuple[float, int, int]]
) -> list[tuple[float, float, int, int]]:
    """(inner time, outer time, tokens, index in `inner_tokens`) of each inner token event the
    outer hop also saw."""
    out_offsets = [c for _, _, c in outer_tokens]
    out_times = [t for t, _, _ in outer_tokens]
    out = []
    for i, (t_in, k, c) in enumerate(inner_tokens):
        t_out = _first_reaching(out_offsets, out_times, c)
        if t_out is not None:
            out.append((t_in, t_out, k, i))
    return out


def _bounds(
    outer: HopFlow, inner: HopFlow, reached: Sequence[tuple[float, float, int, int]]
) -> tuple[float | None, float | None]:
    lower = max((t_in - t_out for t_in, t_out, _, _ in reached), default=None)
    return lower, inner.t_start - outer.t_start


def skew_bounds(outer: HopFlow, inner: HopFlow) -> tuple[float | None, float | None]:
    """Bounds on (inner clock - outer clock) that causality allows.

    Upper: the request reached the outer hop first, so inner.t_start - skew >= outer.t_start.
    Lower: each token left the inner hop before the outer hop saw it, so for every aligned token
    inner_t - skew <= outer_t.
    """
    return _bounds(outer, inner, _reaching(_token_times(outer), _token_times(inner)))


def estimate_skew(lower: float | None, upper: float | None) -> tuple[float, SkewBasis]:
    """The skew (inner clock - outer clock) taken within causal bounds, and why that one.

    Agreeing clocks when the bounds allow them (hosts kept by NTP, two processes of one host).
    Bounds that exclude 0 say the clocks disagree for sure: the skew is then the lower bound, at
    which the segment's fastest token passed without a hold, so every hold is short of the truth
    by that token's hold alone (a pass-through's tenth of a millisecond), whichever clock is
    ahead; the request delay carries the rest of the bounds' width. Bounds that contradict each
    other (a clock stepped during the request): the request's order, as before.
    """
    if lower is not None and upper is not None and lower > upper:
        return upper, SkewBasis.REQUEST_ORDER
    if (lower is None or lower <= 0.0) and (upper is None or upper >= 0.0):
        return 0.0, SkewBasis.CLOCKS_AGREE
    if lower is not None:
        return lower, SkewBasis.FASTEST_TOKEN
    assert upper is not None  # upper < 0 and no token aligned: the request's bound
    return upper, SkewBasis.REQUEST_ORDER


def align(
    outer: HopFlow,
    inner: HopFlow,
    skew_limits: tuple[float | None, float | None] = (None, None),
) -> Segment:
    """Per-token holds of the segment between `outer` and `inner` (outer saw the stream later).

    `skew_limits` are further bounds on the skew that the caller knows from causality too (the
    browser's beacon left the page before the edge received it), or (0, 0) for two views read
    from one clock; they narrow the bounds computed here.
    """
    out = _token_times(outer)
    inner_tokens = _token_times(inner)
    reached = _reaching(out, inner_tokens)  # once, for the bounds and the holds
    lower, upper = _bounds(outer, inner, reached)
    lo, hi = skew_limits
    one_clock = lo is not None and lo == hi
    gap = upper  # the request starts' difference
    if one_clock:  # one clock: the skew is known, whatever the events say
        lower = upper = lo
    else:
        if lo is not None:
            lower = lo if lower is None else max(lower, lo)
        if hi is not None:
            upper = hi if upper is None else min(upper, hi)
        gap = upper
    if one_clock:
        skew, basis = float(lo or 0.0), SkewBasis.ONE_CLOCK
    else:
        skew, basis = estimate_skew(lower, upper)
    holds: list[float] = []
    own: list[float] = []
    wire: list[float] = []
    clipped = 0
    inner_outs = _token_outs(inner)
    for t_in, t_out, k, i in reached:
        holds.extend([t_out - (t_in - skew)] * k)
        left = inner_outs[i] if inner_outs else None
        if left is not None:
            own.extend([left - t_in] * k)
            # a left time seen by a poll may be late by its interval: counted as 0, and counted
            w = t_out - (left - skew)
            clipped += k if w < 0 else 0
            wire.extend([max(0.0, w)] * k)
    first = holds[0] if holds else None
    whole = False
    if inner_tokens and out and first is not None:
        span = inner.token_span_s
        if span is None:
            span = inner_tokens[-1][0] - inner_tokens[0][0]
        whole = span >= WHOLE_BODY_MIN_SPAN_S and first >= WHOLE_BODY_SHARE * span
    seg = Segment(
        segment=f"{outer.hop}>{inner.hop}",
        inner_hop=inner.hop,
        holds_s=tuple(holds),
        first_token_hold_s=first,
        inner_holds_s=tuple(own),
        wire_holds_s=tuple(wire),
        whole_body=whole,
        skew_s=skew,
        skew_bounds_s=(lower, upper),
        findings=tuple(_segment_findings(outer, inner, whole, first)),
        skew_basis=basis,
        wire_clipped=clipped,
        request_gap_s=gap,
    )
    return with_suspects(seg)


def with_suspects(seg: Segment) -> Segment:
    """`seg` with a finding for its negative durations, if it has any (replacing an earlier one):
    clock_skew_suspect across clocks, alignment_suspect on one clock; and clock_skew_suspect for
    two clocks that differ by more than SKEW_SUSPECT_S (`evidence.skew_s`)."""
    suspect = (FindingKind.CLOCK_SKEW_SUSPECT, FindingKind.ALIGNMENT_SUSPECT)
    kept = tuple(f for f in seg.findings if f.get("kind") not in suspect)
    negatives = seg.negatives()
    skewed = seg.skew_basis != SkewBasis.ONE_CLOCK and abs(seg.skew_s) > SKEW_SUSPECT_S
    if negatives or skewed:
        kind = suspect[1] if seg.skew_basis == SkewBasis.ONE_CLOCK else suspect[0]
        evidence: dict[str, Any] = {"negative": negatives}
        if negatives.get("hold"):
            evidence["hold_min_s"] = round(min(seg.holds_s), 6)
        if skewed:
            evidence["skew_s"] = round(seg.skew_s, 6)
        kept += (
            {
                "kind": kind,
                "severity": SUSPECT_SEVERITY,
                "introduced_by": seg.segment,
                "evidence": evidence,
                "fix": SEGMENT_FIXES[kind],
            },
        )
    return dataclasses.replace(seg, findings=kept)


def unordered(a: HopFlow, b: HopFlow) -> Segment:
    """Two neighbouring hops whose order nothing told: named `a~b` by hop name, no holds, a
    `segment_unordered` finding."""
    first, second = sorted((a.hop, b.hop))
    name = f"{first}~{second}"
    finding = {
        "kind": FindingKind.SEGMENT_UNORDERED,
        "severity": SUSPECT_SEVERITY,
        "introduced_by": name,
        "evidence": {"hops": [first, second]},
        "fix": SEGMENT_FIXES[FindingKind.SEGMENT_UNORDERED],
    }
    return Segment(
        segment=name,
        inner_hop="",
        holds_s=(),
        first_token_hold_s=None,
        whole_body=False,
        skew_s=0.0,
        skew_bounds_s=(None, None),
        findings=(finding,),
        order=SegmentOrder.UNKNOWN,
    )


def _segment_findings(
    outer: HopFlow, inner: HopFlow, whole: bool, first_hold: float | None
) -> Iterable[dict[str, Any]]:
    """Findings present at the outer hop but not the inner one belong to this segment."""
    for kind in PACING_KINDS:
        if kind in outer.finding_kinds and kind not in inner.finding_kinds:
            yield {"kind": kind, "introduced_by": f"{outer.hop}>{inner.hop}"}
    if whole and FindingKind.WHOLE_BODY_HOLD not in outer.finding_kinds:
        yield {
            "kind": FindingKind.WHOLE_BODY_HOLD,
            "introduced_by": f"{outer.hop}>{inner.hop}",
            "first_token_hold_s": first_hold,
        }
    if (
        outer.itl_p50_s is not None
        and inner.itl_p50_s
        and outer.ttft_s is not None
        and inner.ttft_s is not None
        and outer.itl_p50_s < BATCHING_ITL_RATIO * inner.itl_p50_s
        and outer.ttft_s - inner.ttft_s >= BATCHING_TTFT_RISE_S
    ):
        yield {
            "kind": FindingKind.SEGMENT_BATCHING,
            "introduced_by": f"{outer.hop}>{inner.hop}",
            "evidence": {
                "itl_p50_inner_s": inner.itl_p50_s,
                "itl_p50_outer_s": outer.itl_p50_s,
                "ttft_rise_s": round(outer.ttft_s - inner.ttft_s, 6),
            },
            "fix": SEGMENT_FIXES[FindingKind.SEGMENT_BATCHING],
        }


def node(rec: Mapping[str, Any]) -> Node:
    """What ordering needs of a record: its hop, span and parent span."""
    return Node(
        hop=str(rec.get("hop", "")),
        span_id=rec.get("span_id") or None,
        parent_span_id=rec.get("parent_span_id") or None,
    )


def chained(
    records: Sequence[Mapping[str, Any]],
    order: HopOrder | None = None,
    *,
    one_clock: bool = False,
) -> list[tuple[Chain, list[tuple[Link, Segment]]]]:
    """The records of one trace (or one request paired by content) as chains (indexes into
    `records`), each with its links' segments outermost first: by parent link, else by `order`
    (hopmeter.core.order). A link to a record without events has no segment. `one_clock`: the
    records were written by one process, so the skew between them is known to be 0."""
    views = [HopFlow.from_record(r) if r.get("events") is not None else None for r in records]
    limits = (0.0, 0.0) if one_clock else (None, None)
    out = []
    for c in chains([node(r) for r in records], order):
        segs = []
        for link in c.links:
            outer, inner = views[link.outer], views[link.inner]
            if outer is None or inner is None:
                continue
            if link.order == SegmentOrder.UNKNOWN:
                seg = unordered(outer, inner)
            else:
                seg = dataclasses.replace(align(outer, inner, limits), order=link.order)
            flow_id = records[link.inner].get("flow_id")
            segs.append((link, dataclasses.replace(seg, inner_flow_id=flow_id)))
        out.append((c, segs))
    return out


def chain(
    records: Sequence[Mapping[str, Any]],
    order: HopOrder | None = None,
    *,
    one_clock: bool = False,
) -> list[Segment]:
    """The segments of the records' chains, outermost first (the longest chain's first)."""
    found = sorted(chained(records, order, one_clock=one_clock), key=lambda cs: -len(cs[1]))
    return [s for _, segs in found for _, s in segs]
