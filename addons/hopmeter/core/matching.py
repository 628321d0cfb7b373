"""Which flows at different hops were one request: by trace id, else by the reply they carried.

Flows that share a W3C trace id are one request (docs/design.md §5). A gateway that drops the
`traceparent` header (LiteLLM as shipped, docs/gateways.md) leaves the hop behind it with a trace
of its own, so the two sides share no id. They still share the reply: the fingerprint of its
visible text (hopmeter.core.fingerprint) and time windows that nest, since the inner hop sees the
request after the outer one and the end of the reply before it.

The rule is never to pair two different replies. Two flows are paired by content only when each
is the other's one candidate at the other's hop(s): same fingerprint and length, windows nested
within `slack_s`, no shared hop. Identical replies in flight at once make every one of them a
candidate of each other's partners: all of them stay unpaired, marked `ambiguous`, counted. A
model name is no key (a gateway renames it, LiteLLM's `demo-1` becomes `demo`), and breaks no tie
either (an alias can map any name to any other): it is only reported, as `model_match`.

Trace units come first: the flows of one trace id are one unit, and a unit pairs by content only
with units at hops it does not have, so a chain edge > mid > origin whose middle segment kept the
trace and whose last dropped it joins into one.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hopmeter.core.fingerprint import Fingerprint, normalise_model
from hopmeter.core.hops import SEGMENT_FIXES, Segment, chained
from hopmeter.core.order import HopOrder
from hopmeter.core.vocab import SEVERITY_ORDER, FindingKind, PairedBy, PairingMatch, Severity

# Live, both hops read one clock; a record's end mixes mitmproxy's wall-clock start with
# monotonic offsets, so windows may disagree by a millisecond or so: 50 ms covers that and a loaded
# event loop's lag, and is far below a stream's length.
LIVE_SLACK_S = 0.05
# Across hosts (`hopmeter join --max-skew`), clocks kept by NTP agree within milliseconds; a
# second covers a poorly synced host. Larger only admits more candidates (more ambiguity), never
# a wrong pair.
JOIN_SLACK_S = 1.0

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Flow:
    """What matching needs of one flow: its hop, trace, reply fingerprint and time window."""

    ref: int  # the caller's index
    hop: str
    trace_id: str
    fingerprint: Fingerprint | None
    t_start: float
    t_end: float
    model: str | None = None

    @classmethod
    def from_record(cls, ref: int, rec: Record) -> Flow:
        """The matching view of a `hopmeter.flow/1` record."""
        req = rec.get("request") or {}
        resp = rec.get("response") or {}
        t_start = float(req.get("t_start") or 0.0)
        ends = [resp.get("t_last_byte"), req.get("t_end"), t_start]
        t_end = max(float(t) for t in ends if isinstance(t, int | float))
        return cls(
            ref=ref,
            hop=str(rec.get("hop") or ""),
            trace_id=str(rec.get("trace_id") or f"flow:{rec.get('flow_id') or ref}"),
            fingerprint=Fingerprint.from_record(rec),
            t_start=t_start,
            t_end=t_end,
            model=rec.get("model") if isinstance(rec.get("model"), str) else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How one flow was paired: the record's `pairing` field."""

    paired_by: PairedBy | None  # None: not paired
    match: PairingMatch
    candidates: int = 0  # flows at another hop that could have been its partner
    model_match: bool | None = None  # content pairs only: the normalised model names agree

    def as_dict(self) -> dict[str, Any]:
        """The record's `pairing` field (docs/design.md §4)."""
        out: dict[str, Any] = {
            "paired_by": self.paired_by,
            "match": self.match,
            "candidates": self.candidates,
        }
        if self.model_match is not None:
            out["model_match"] = self.model_match
        return out


@dataclass(slots=True)
class _Unit:
    """The flows of one trace id."""

    flows: list[Flow]
    hops: frozenset[str] = field(init=False)
    t_start: float = field(init=False)
    t_end: float = field(init=False)

    def __post_init__(self) -> None:
        self.hops = frozenset(f.hop for f in self.flows)
        self.t_start = min(f.t_start for f in self.flows)
        self.t_end = max(f.t_end for f in self.flows)

    @property
    def outer(self) -> Flow:
        return min(self.flows, key=lambda f: f.t_start)

    @property
    def key(self) -> tuple[str, int] | None:
        fp = self.outer.fingerprint
        return None if fp is None else fp.key


@dataclass(frozen=True, slots=True, kw_only=True)
class Matching:
    """Groups of flows that were one request (each with two or more hops), and every outcome."""

    groups: list[list[int]]  # refs, outermost first
    outcomes: dict[int, Outcome]


def _nested(a: _Unit, b: _Unit, slack_s: float) -> bool:
    """Whether one unit's window lies inside the other's (within `slack_s`)."""
    outer, inner = (a, b) if a.t_start <= b.t_start else (b, a)
    return inner.t_start >= outer.t_start - slack_s and inner.t_end <= outer.t_end + slack_s


def match(flows: Sequence[Flow], slack_s: float = LIVE_SLACK_S) -> Matching:
    """Group `flows` by trace id, then join trace units that share a reply and nothing else."""
    by_trace: dict[str, list[Flow]] = defaultdict(list)
    for f in flows:
        by_trace[f.trace_id].append(f)
    units = [_Unit(fs) for fs in by_trace.values()]
    by_key: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, u in enumerate(units):
        if u.key is not None:
            by_key[u.key].append(i)
    # candidates[i][hops of j] = units j that unit i could be one request with
    candidates: list[dict[frozenset[str], list[int]]] = [defaultdict(list) for _ in units]
    for members in by_key.values():
        for x, i in enumerate(members):
            for j in members[x + 1 :]:
                a, b = units[i], units[j]
                if a.hops & b.hops or not _nested(a, b, slack_s):
                    continue
                candidates[i][b.hops].append(j)
                candidates[j][a.hops].append(i)
    parent = list(range(len(units)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, per_hops in enumerate(candidates):
        for js in per_hops.values():
            j = js[0]
            if len(js) == 1 and i < j and candidates[j].get(units[i].hops) == [i]:
                parent[find(i)] = find(j)
    components: dict[int, list[int]] = defaultdict(list)
    for i in range(len(units)):
        components[find(i)].append(i)
    return _result(units, candidates, components.values())


def _result(
    units: list[_Unit],
    candidates: list[dict[frozenset[str], list[int]]],
    components: Iterable[list[int]],
) -> Matching:
    groups: list[list[int]] = []
    outcomes: dict[int, Outcome] = {}
    for comp in components:
        flows = [f for i in comp for f in units[i].flows]
        hops = [f.hop for f in flows]
        joined = len(comp) > 1 and len(set(hops)) == len(hops)  # never a hop twice
        for i in comp:
            u = units[i]
            most = max((len(js) for js in candidates[i].values()), default=0)
            if joined:
                models = {normalise_model(units[j].outer.model) for j in comp}
                outcome = Outcome(
                    paired_by=PairedBy.CONTENT,
                    match=PairingMatch.UNIQUE,
                    candidates=most,
                    model_match=len(models) == 1 and None not in models,
                )
            elif len(u.hops) > 1:
                outcome = Outcome(paired_by=PairedBy.TRACE, match=PairingMatch.UNIQUE)
            else:
                # a candidate it did not get (its candidate had others too) is ambiguity too:
                # "none" is for a flow nothing at another hop could have been one request with
                ambiguous = most > 0 or len(comp) > 1
                outcome = Outcome(
                    paired_by=None,
                    match=PairingMatch.AMBIGUOUS if ambiguous else PairingMatch.NONE,
                    candidates=most,
                )
            for f in u.flows:
                outcomes[f.ref] = outcome
        if joined:
            groups.append([f.ref for f in sorted(flows, key=lambda f: f.t_start)])
        else:
            groups += [
                [f.ref for f in sorted(units[i].flows, key=lambda f: f.t_start)]
                for i in comp
                if len(units[i].flows) > 1
            ]
    return Matching(groups=groups, outcomes=outcomes)


def segments(
    records: Sequence[Record], order: HopOrder | None = None, *, one_clock: bool = False
) -> list[tuple[tuple[int, ...], list[Segment]]]:
    """The requests in one group of records, each as its records' indexes outermost first (the
    first carries the segments) and its segments, each saying how its two sides were paired:
    in the order of their parent links, else of their hops (hopmeter.core.order), never of
    their clocks. A trace shared by several requests (an instrumented client's calls at once)
    is as many requests as its flows' links say; a request seen at one hop has no segment.
    """
    out = []
    for c, links in chained(records, order, one_clock=one_clock):
        segs = []
        for link, seg in links:
            outer, inner = records[link.outer], records[link.inner]
            same = outer.get("trace_id") and outer.get("trace_id") == inner.get("trace_id")
            segs.append(
                dataclasses.replace(seg, paired_by=PairedBy.TRACE if same else PairedBy.CONTENT)
            )
        if segs:
            out.append((c.members, segs))
    return out


def trace_dropped(segs: Iterable[Segment]) -> list[dict[str, Any]]:
    """One `trace_context_dropped` finding per segment whose sides were paired by content."""
    return [
        {
            "kind": FindingKind.TRACE_CONTEXT_DROPPED,
            "severity": Severity.WARNING,
            "evidence": {"segment": s.segment, "inner_hop": s.inner_hop, "paired_by": s.paired_by},
            "fix": SEGMENT_FIXES[FindingKind.TRACE_CONTEXT_DROPPED],
        }
        for s in segs
        if s.paired_by == PairedBy.CONTENT
    ]


def with_findings(record: Record, extra: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`record` with `extra` findings among its own, worst first."""
    found = [*(record.get("findings") or []), *extra]
    found.sort(key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), len(SEVERITY_ORDER)))
    return {**record, "findings": found}


def match_records(records: Sequence[Record], slack_s: float = LIVE_SLACK_S) -> Matching:
    """`match` on records (refs are their indexes in `records`)."""
    return match([Flow.from_record(i, r) for i, r in enumerate(records)], slack_s)


def without_content(matching: Matching, records: Sequence[Record]) -> Matching:
    """`matching` without its content pairs: flows that shared a trace across hops stay paired
    by it, every other one is ambiguous (something in flight may carry the same reply)."""
    by_trace: dict[object, list[int]] = defaultdict(list)
    for i, rec in enumerate(records):
        by_trace[rec.get("trace_id")].append(i)
    groups = [
        sorted(refs, key=lambda i: float((records[i].get("request") or {}).get("t_start") or 0))
        for refs in by_trace.values()
        if len(refs) > 1
    ]
    outcomes = {}
    for refs in by_trace.values():
        across = len({records[i].get("hop") for i in refs}) > 1
        for i in refs:
            was = matching.outcomes[i]
            outcomes[i] = (
                Outcome(paired_by=PairedBy.TRACE, match=PairingMatch.UNIQUE)
                if across
                else Outcome(
                    paired_by=None, match=PairingMatch.AMBIGUOUS, candidates=was.candidates
                )
            )
    return Matching(groups=groups, outcomes=outcomes)
