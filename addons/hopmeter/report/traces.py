"""Records grouped into traces, and the lanes picture's data measured from them.

A trace is every record of one request: sharing a trace id and joined by parent links (an
instrumented client's calls in one trace are separate requests), or paired by its reply's
fingerprint where a hop dropped the trace id (hopmeter.core.matching): the same stream seen at one
or more hops. Its lanes are ordered outermost first by those links, else by the order linked
traces showed for the same hops (hopmeter.core.order), never by the clocks; two lanes whose order
nothing told are drawn with an unordered band between them.
Between two neighbouring lanes lies a segment; aligning the two records' events by
`content_offset` gives, for each token event, when the inner hop saw it and when the outer hop did:
the run between is the time the segment held it (docs/design.md §5). Where the inner hop followed
its bytes out (`chunks_out`), the run also knows when the token left the inner hop's process: the
part before is that hop's own hold, the part after the wire between the hops. Inside one lane, a
gap between tokens at or above the stall threshold is a run too: the token was held somewhere
before this hop. The request's way in is drawn too: from the outer hop's request start up to the
inner hop's.

Times here are seconds since the trace's origin (the outermost request start), on the outermost
hop's clock; inner hops are shifted by the skew hopmeter.core.hops estimates. A record whose
page's beacon was joined (`browser`, `screen`: hopmeter.core.browser) adds two lanes outside
its own: the page's reader and the screen, the client's side of the stream.
"""

from __future__ import annotations

import dataclasses
import itertools
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hopmeter.core.detectors import DEFAULT_STALL_THRESHOLD_S
from hopmeter.core.hops import HopFlow, align, events_out, node, unordered
from hopmeter.core.matching import JOIN_SLACK_S, match_records
from hopmeter.core.order import HopOrder, chains
from hopmeter.core.vocab import (
    BROWSER,
    SCREEN,
    SEVERITY_ORDER,
    FindingKind,
    PairedBy,
    SegmentOrder,
    Severity,
)

Record = Mapping[str, Any]

# Marks the records `browser_lanes` makes of a record's browser and screen sections.
PAGE_LANE = "page_lane"
# A segment finding names no severity; a hold it introduced is as bad as the flow's own.
SEGMENT_SEVERITY: Mapping[str, Severity] = {
    FindingKind.WHOLE_BODY_HOLD: Severity.ERROR,
    FindingKind.SEGMENT_BATCHING: Severity.WARNING,
    FindingKind.TRACE_CONTEXT_DROPPED: Severity.WARNING,
    FindingKind.SEGMENT_UNORDERED: Severity.WARNING,
    FindingKind.CLOCK_SKEW_SUSPECT: Severity.WARNING,
    FindingKind.ALIGNMENT_SUSPECT: Severity.WARNING,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Mark:
    """One token-carrying event as one hop saw it."""

    t_s: float
    tokens: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """A stretch of time a token (or the stream) was held: t0_s to t1_s."""

    t0_s: float
    t1_s: float
    tokens: int
    label: str  # what held it, for a tooltip
    t_left_s: float | None = None  # a segment's run: when it left the inner hop's process


@dataclass(frozen=True, slots=True, kw_only=True)
class Lane:
    """One hop's view of the stream."""

    hop: str
    record: Record
    t_start_s: float
    t_first_byte_s: float | None
    t_end_s: float
    marks: tuple[Mark, ...]
    quiet_s: tuple[float, ...]  # events carrying no tokens (preludes, [DONE], pings)
    runs: tuple[Run, ...]  # stalls and whole-body waits seen at this hop


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """The segment between lane `outer` and the lane after it: one run per aligned event."""

    segment: str
    runs: tuple[Run, ...]
    summary: Mapping[str, Any]  # the `hops` entry: first_token_hold_s, hold_p50_s, ...
    live: bool  # the summary was measured live (in the record), not aligned here
    request: Run | None = None  # the request's way in: outer request start to inner one


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A stream and every hop that saw it, outermost first."""

    trace_id: str
    t0: float  # epoch seconds of the outermost request start
    lanes: tuple[Lane, ...]
    bands: tuple[Band, ...]

    @property
    def outer(self) -> Record:
        """The record nearest the client (of a flow: not a lane its page's beacon added)."""
        return next((la.record for la in self.lanes if not is_page_lane(la)), self.lanes[0].record)

    @property
    def span_s(self) -> float:
        """From the first request start to the last byte at any hop, and a little room."""
        return max(max(lane.t_end_s for lane in self.lanes) * 1.02, 1e-3)

    def findings(self) -> list[tuple[str, Mapping[str, Any]]]:
        """(where, finding) for every finding of every hop and segment, worst first."""
        out: list[tuple[str, Mapping[str, Any]]] = []
        for lane in self.lanes:
            out += [(lane.hop, f) for f in lane.record.get("findings") or []]
        for band in self.bands:
            out += [(band.segment, f) for f in band.summary.get("findings") or []]
        return sorted(out, key=lambda wf: severity_rank(wf[1]))

    def worst(self) -> Mapping[str, Any] | None:
        """The worst finding, if any."""
        found = self.findings()
        return found[0][1] if found else None


def is_page_lane(lane: Lane) -> bool:
    """True for the browser and screen lanes a record's joined beacon adds."""
    return lane.record.get(PAGE_LANE) is True


def severity(finding: Mapping[str, Any]) -> Severity:
    """A finding's severity; segment findings get one from SEGMENT_SEVERITY (else warning)."""
    sev = finding.get("severity")
    if isinstance(sev, str) and sev in SEVERITY_ORDER:
        return Severity(sev)
    return SEGMENT_SEVERITY.get(str(finding.get("kind")), Severity.WARNING)


def severity_rank(finding: Mapping[str, Any]) -> int:
    """0 for the worst severity."""
    return SEVERITY_ORDER[severity(finding)]


def stall_threshold(records: Iterable[Record]) -> float:
    """The threshold the records' stall findings were measured with, else the default."""
    for rec in records:
        for f in rec.get("findings") or []:
            value = (f.get("evidence") or {}).get("threshold_s")
            if f.get("kind") == "stall" and isinstance(value, int | float) and value > 0:
                return float(value)
    return DEFAULT_STALL_THRESHOLD_S


def group(records: Iterable[Record], order: HopOrder | None = None) -> list[list[Record]]:
    """Records of one request together, outermost first, groups by time: sharing a trace id and
    joined by parent links, or paired by their reply where a hop dropped it (a record without
    either is its own trace). Where no link says which hop is outer, `order` (default: the order
    the input's linked traces show) does."""
    recs = list(records)
    matching = match_records(recs, JOIN_SLACK_S)
    grouped = {i for refs in matching.groups for i in refs}
    by_match = [[recs[i] for i in refs] for refs in matching.groups]
    if order is None:
        order = learned_order(by_match)
    groups = [
        [g[i] for i in c.members] for g in by_match for c in chains([node(r) for r in g], order)
    ]
    groups += [[rec] for i, rec in enumerate(recs) if i not in grouped]
    return sorted(groups, key=lambda g: _t_start(g[0]))


def traces_of(records: Sequence[Record], threshold_s: float) -> list[Trace]:
    """Every request's trace in `records`, hops in the order their links (and, where none, the
    order the input's linked traces show) say."""
    order = learned_order(match_groups(records))
    return [build(g, threshold_s, order) for g in group(records, order)]


def match_groups(records: Sequence[Record]) -> list[list[Record]]:
    """The records matching puts together (a trace id, or one reply at several hops)."""
    return [[records[i] for i in refs] for refs in match_records(records, JOIN_SLACK_S).groups]


def learned_order(groups: Iterable[Sequence[Record]]) -> HopOrder:
    """The order of hops the parent links among these records show."""
    order = HopOrder()
    for g in groups:
        order.learn_links([node(r) for r in g])
    return order


def _t_start(rec: Record) -> float:
    return float((rec.get("request") or {}).get("t_start") or 0.0)


def _events(rec: Record) -> list[tuple[float, int, int]]:
    """(t_offset_s, tokens, content_offset) of each event; offset -1 when the record has none."""
    out = []
    for ev in rec.get("events") or []:
        if len(ev) >= 2:
            out.append((float(ev[0]), int(ev[1]), int(ev[2]) if len(ev) >= 3 else -1))
    return out


def browser_lanes(rec: Record) -> list[Record]:
    """The screen and browser lanes a record carries (its page's beacon was joined), as records
    of their own, outermost first: the screen, then the page's reader. Their times are on the
    record's own clock already (hopmeter.core.browser); each carries its segment's `hops` entry.
    """
    browser = rec.get("browser") or {}
    if browser.get("joined") is not True:
        return []
    hops = {h.get("segment"): h for h in rec.get("hops") or []}

    def lane(hop: str, section: Mapping[str, Any], inner: str) -> Record:
        events = section.get("events") or []
        ends = [e[0] for e in events] or [0.0]
        t_start = float(browser["t_start"])
        return {
            "hop": hop,
            PAGE_LANE: True,
            "trace_id": rec.get("trace_id"),
            "request": {"t_start": t_start, "method": "", "path": browser.get("path", "")},
            "response": {
                "t_first_byte": browser.get("t_first_byte") if hop == BROWSER else None,
                "t_last_byte": t_start + max(ends),
            },
            "events": events,
            "figures": {"ttft_s": section.get("ttft_s")},
            "findings": section.get("findings") or [],
            "hops": [hops[f"{hop}>{inner}"]] if f"{hop}>{inner}" in hops else [],
        }

    out = [lane(BROWSER, browser, str(rec.get("hop") or "?"))]
    screen = rec.get("screen")
    if isinstance(screen, Mapping):
        out.insert(0, lane(SCREEN, screen, BROWSER))
    return out


def build(records: Sequence[Record], threshold_s: float, order: HopOrder | None = None) -> Trace:
    """The trace of the records of one request (outermost first by their parent links, else by
    `order`; a page's screen and reader lanes, when its beacon was joined, outside the hop it
    talked to)."""
    found = chains([node(r) for r in records], order)
    main = max(found, key=lambda c: len(c.members))
    seq = [*main.members, *(i for i in range(len(records)) if i not in main.members)]
    known = {(link.outer, link.inner) for link in main.links if link.order != SegmentOrder.UNKNOWN}
    ordered = [(a, b) in known for a, b in itertools.pairwise(seq)]
    recs = [records[i] for i in seq]
    page = browser_lanes(recs[0])
    ordered = [True] * len(page) + ordered
    recs = [*page, *recs]
    t0 = _t_start(recs[0])
    bands: list[Band] = []
    shift = [0.0]  # each lane's clock minus the outermost one's
    for (outer, inner), known_order in zip(itertools.pairwise(recs), ordered, strict=True):
        band, skew = (
            _band(outer, inner, t0, shift[-1]) if known_order else (_unordered(outer, inner), 0.0)
        )
        bands.append(band)
        shift.append(shift[-1] + skew)
    lanes = tuple(_lane(rec, t0, s, threshold_s) for rec, s in zip(recs, shift, strict=True))
    trace_id = str(recs[0].get("trace_id") or recs[0].get("flow_id") or "")
    return Trace(trace_id=trace_id, t0=t0, lanes=lanes, bands=tuple(bands))


def _lane(rec: Record, t0: float, shift: float, threshold_s: float) -> Lane:
    base = _t_start(rec) - shift - t0
    events = _events(rec)
    marks = tuple(Mark(t_s=base + t, tokens=k, offset=c) for t, k, c in events if k > 0)
    quiet = tuple(base + t for t, k, _ in events if k <= 0)
    resp = rec.get("response") or {}
    fb = resp.get("t_first_byte")
    t_fb = None if fb is None else float(fb) - shift - t0
    last = resp.get("t_last_byte") or (rec.get("request") or {}).get("t_end")
    ends = [base + t for t, _, _ in events]
    if last is not None:
        ends.append(float(last) - shift - t0)
    runs = [
        Run(t0_s=a.t_s, t1_s=b.t_s, tokens=b.tokens, label=f"stall {b.t_s - a.t_s:.3f} s")
        for a, b in itertools.pairwise(marks)
        if b.t_s - a.t_s >= threshold_s
    ]
    for f in rec.get("findings") or []:
        ev = f.get("evidence") or {}
        at, wait = ev.get("final_burst_at_s"), ev.get("wait_before_burst_s")
        if f.get("kind") == "whole_body_hold" and at is not None and wait is not None:
            start = base + float(at) - float(wait)
            runs.append(Run(t0_s=start, t1_s=base + float(at), tokens=0, label="whole body held"))
        shown = ev.get("first_visible_at_s")
        if f.get("kind") == "not_streamed" and shown is not None:
            label = "not streamed: the whole reply came as one document"
            runs.append(Run(t0_s=base, t1_s=base + float(shown), tokens=0, label=label))
    return Lane(
        hop=str(rec.get("hop") or "?"),
        record=rec,
        t_start_s=base,
        t_first_byte_s=t_fb,
        t_end_s=max(ends, default=base),
        marks=marks,
        quiet_s=quiet,
        runs=tuple(runs),
    )


def _unordered(a: Record, b: Record) -> Band:
    """The band between two lanes whose order nothing told: no runs, its unordered segment."""
    seg = unordered(HopFlow.from_record(a), HopFlow.from_record(b))
    return Band(segment=seg.segment, runs=(), summary=seg.as_dict(), live=False)


def _offsets_only(rec: Record) -> HopFlow:
    """The alignment view of a record, keeping only events that carry a content offset."""
    events = [e for e in rec.get("events") or [] if len(e) >= 3]
    return HopFlow.from_record({**rec, "events": events})


def _band(outer: Record, inner: Record, t0: float, shift: float) -> tuple[Band, float]:
    """The segment between two records, and the inner clock's skew from the outer's."""
    seg = align(_offsets_only(outer), _offsets_only(inner))
    if outer.get("trace_id") != inner.get("trace_id"):
        seg = dataclasses.replace(seg, paired_by=PairedBy.CONTENT)
    name = seg.segment
    live = next((h for h in outer.get("hops") or [] if h.get("segment") == name), None)
    summary: Mapping[str, Any] = live if live is not None else seg.as_dict()
    out_base = _t_start(outer) - shift - t0
    in_base = _t_start(inner) - shift - seg.skew_s - t0
    out_marks = [(out_base + t, c) for t, k, c in _events(outer) if k > 0 and c >= 0]
    offsets = [c for _, c in out_marks]
    runs = []
    inner_events = _events(inner)
    lefts = events_out(inner_events, inner.get("chunks") or [], inner.get("chunks_out") or [])
    for j, (t, k, c) in enumerate(inner_events):
        if k <= 0 or c < 0:
            continue
        i = bisect_left(offsets, c)
        if i < len(out_marks):
            t_in, t_out = in_base + t, out_marks[i][0]
            label = f"held {t_out - t_in:.4f} s between {name.replace('>', ' and ')}"
            left = lefts[j] if lefts else None
            t_left = None if left is None else min(in_base + left, t_out)
            if t_left is not None:
                label += (
                    f": {t_left - t_in:.4f} s in {seg.inner_hop}'s own process, "
                    f"{t_out - t_left:.4f} s on the way"
                )
            runs.append(Run(t0_s=t_in, t1_s=t_out, tokens=k, label=label, t_left_s=t_left))
    delay = summary.get("request_delay_s")
    request = None
    if isinstance(delay, int | float):
        label = f"request took {delay * 1000:.1f} ms from {name.replace('>', ' to ')}"
        request = Run(t0_s=out_base, t1_s=in_base, tokens=0, label=label)
    band = Band(
        segment=name, runs=tuple(runs), summary=summary, live=live is not None, request=request
    )
    return band, seg.skew_s
