"""The fleet summary: what every record says together, for the text and the HTML report alike.

TTFB and TTFT quantiles are over flows (one value each); inter-token latency is pooled over every
token of every flow, token-weighted as a flow's own figure is (docs/design.md §6), so one long
stream weighs more than one short one, as it does in the Prometheus histogram.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hopmeter.core.figures import token_gaps, weighted_quantile
from hopmeter.report.traces import Record, Trace, severity, severity_rank

ALL = "all hops"  # the row of the latency table that pools every hop


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """p50/p99 of TTFB, TTFT and inter-token latency over some flows (None: no data)."""

    flows: int
    ttfb: tuple[float | None, float | None]
    ttft: tuple[float | None, float | None]
    itl: tuple[float | None, float | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingCount:
    """How many flows, and how many segments between hops, showed one kind of finding."""

    kind: str
    severity: str
    flows: int
    segments: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """Everything the summary on top of a report says."""

    flows: int
    traces: int
    multi_hop: int  # traces seen at two or more hops
    t_first: float | None  # epoch seconds
    t_last: float | None
    by_hop: list[tuple[str, int]]
    by_api: list[tuple[str, int]]
    by_model: list[tuple[str, int]]
    latency: list[tuple[str, Latency]]  # ALL first, then one row per hop
    findings: list[FindingCount]  # worst first
    segments: list[tuple[str, int, int]]  # (segment, traces, whole-body holds)


def _pair(
    values: Sequence[float], weights: Sequence[int] | None = None
) -> tuple[float | None, float | None]:
    w = list(weights) if weights is not None else [1] * len(values)
    return weighted_quantile(values, w, 0.5), weighted_quantile(values, w, 0.99)


def latency(records: Sequence[Record]) -> Latency:
    """TTFB/TTFT over flows and pooled token-weighted inter-token latency."""
    ttfb: list[float] = []
    ttft: list[float] = []
    gaps: list[float] = []
    weights: list[int] = []
    for rec in records:
        fig = rec.get("figures") or {}
        if fig.get("ttfb_s") is not None:
            ttfb.append(float(fig["ttfb_s"]))
        if fig.get("ttft_s") is not None:
            ttft.append(float(fig["ttft_s"]))
        events = rec.get("events") or []
        g = token_gaps([float(e[0]) for e in events], [int(e[1]) for e in events])
        gaps += g.values_s
        weights += g.weights
    return Latency(flows=len(records), ttfb=_pair(ttfb), ttft=_pair(ttft), itl=_pair(gaps, weights))


def _rank(sev: str) -> int:
    return severity_rank({"severity": sev})


def _counts(values: Sequence[str]) -> list[tuple[str, int]]:
    return sorted(Counter(values).items(), key=lambda kv: (-kv[1], kv[0]))


def summarise(records: Sequence[Record], traces: Sequence[Trace]) -> Fleet:
    """The fleet summary of `records`, grouped as `traces`."""
    hops = [str(r.get("hop") or "?") for r in records]
    starts = [float(r["request"]["t_start"]) for r in records if (r.get("request") or {})]
    rows = [(ALL, latency(records))]
    for hop, _ in _counts(hops):
        rows.append((hop, latency([r for r in records if str(r.get("hop") or "?") == hop])))
    in_flows: Counter[tuple[str, str]] = Counter()
    in_segments: Counter[tuple[str, str]] = Counter()
    for rec in records:
        client = (rec.get("browser") or {}).get("findings") or []  # the page's, from its beacon
        for f in [*(rec.get("findings") or []), *client]:
            in_flows[(str(f.get("kind")), severity(f))] += 1
    for trace in traces:
        for band in trace.bands:
            for f in band.summary.get("findings") or []:
                in_segments[(str(f.get("kind")), severity(f))] += 1
    findings = [
        FindingCount(kind=k, severity=s, flows=in_flows[(k, s)], segments=in_segments[(k, s)])
        for k, s in set(in_flows) | set(in_segments)
    ]
    findings.sort(key=lambda c: (_rank(c.severity), -(c.flows + c.segments), c.kind))
    seg: Counter[str] = Counter()
    whole: Counter[str] = Counter()
    for trace in traces:
        for band in trace.bands:
            seg[band.segment] += 1
            whole[band.segment] += bool(band.summary.get("whole_body"))
    return Fleet(
        flows=len(records),
        traces=len(traces),
        multi_hop=sum(1 for t in traces if len(t.lanes) > 1),
        t_first=min(starts, default=None),
        t_last=max(starts, default=None),
        by_hop=_counts(hops),
        by_api=_counts([str(r.get("api") or "other") for r in records]),
        by_model=_counts([str(r.get("model") or "-") for r in records]),
        latency=rows,
        findings=findings,
        segments=[(s, n, whole[s]) for s, n in sorted(seg.items())],
    )
