"""The report as one self-contained HTML page: fleet summary on top, then each trace's lanes.

Token streams come first, worst first (then in time order); the flows that carried no token
(a page's own assets, a health check, a favicon) are summed up in one collapsed table at the end,
so that a `--browser` run opens with its replies, not with `GET /demo/`.

Nothing is fetched: CSS and SVG are inline and the page runs no script; a Content-Security-Policy
says so to the browser, so even a string that escaped escaping could not load or run anything.
Every string from a record goes through `_e` (control characters made visible, then HTML-escaped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from hopmeter import __version__
from hopmeter.core.client import FIXES as CLIENT_FIXES
from hopmeter.core.detectors import FIXES
from hopmeter.core.vocab import BROWSER, SCREEN
from hopmeter.report import histogram, lanes
from hopmeter.report.fleet import Fleet
from hopmeter.report.text import clean, ms, when
from hopmeter.report.traces import Band, Trace, severity, severity_rank

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#111827;margin:24px;
max-width:1000px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 4px}
h3{font-size:14px;margin:12px 0 4px}table{border-collapse:collapse;margin:6px 0}
td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}th{font-weight:600;color:#374151}
.muted,.sub{color:#6b7280;font-size:12px}section.trace{border-top:1px solid #e5e7eb;margin-top:24px}
.verdict{margin:2px 0 8px}.ok{color:#166534}.sev-error{color:#b91c1c}.sev-warning{color:#b45309}
.sev-info{color:#1d4ed8}.row{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
ul.findings{padding-left:18px}li.finding{margin:6px 0}.fix{margin:2px 0}.evidence{color:#4b5563;
font-size:12px}code{font-size:12px}svg text{font:11px system-ui,sans-serif;fill:#374151}
svg text.hop,svg text.segment{font-weight:600;font-size:12px;fill:#111827}
svg text.segment{fill:#9a3412}
.lane-bg{fill:#f3f4f6}.life{stroke:#d1d5db;stroke-width:2}.start{stroke:#6b7280;stroke-width:2}
.first-byte{fill:#6b7280}.mark{stroke:#111827;stroke-width:1.2}.quiet{stroke:#9ca3af;stroke-width:1}
.stall{fill:#ea580c;opacity:.85}.fall{stroke:#6b7280;stroke-width:1;opacity:.6;fill:none}
.held{stroke:#ea580c;stroke-width:1.6;fill:none}.own{stroke:#7c3aed;stroke-width:1.6;fill:none}.grid{stroke:#e5e7eb}.baseline{stroke:#9ca3af}
.request{stroke:#2563eb;stroke-width:1.6;fill:none}
.legend span{display:inline-block;margin-right:16px}.sw{display:inline-block;width:18px;height:8px;
margin-right:5px;vertical-align:middle}
"""
LEGEND = (
    '<p class="legend muted"><span><i class="sw" style="background:#111827;width:2px"></i>'
    "a token event arrives at this hop</span>"
    '<span><i class="sw" style="background:#ea580c"></i>held: between two hops, from leaving the '
    "inner hop (its arrival there when that is not known) to the outer's arrival; in a lane, a "
    "stall or a whole-body wait</span>"
    '<span><i class="sw" style="background:#7c3aed"></i>held inside the inner hop\'s own process, '
    "before its bytes left it</span>"
    '<span><i class="sw" style="background:#9ca3af;height:2px"></i>the token falls to the next hop'
    '</span><span><i class="sw" style="background:#2563eb;height:2px"></i>the request climbs to '
    "the inner hop</span>"
    "<span>▲ first byte · | request start · top lane nearest the model</span></p>"
)
BROWSER_NOTE = (
    '<p class="legend muted browser-note">The two bottom lanes are the page\'s, from its beacon: '
    "<b>browser</b> is when the page's body reader got each token, <b>screen</b> when a frame "
    "painted it (after its layout: what Paint Timing calls paint time; the pixels reach the "
    "glass about a frame later). The page's clock is aligned to the proxy's within bounds from "
    "causality; the screen shares the page's clock.</p>"
)
LATENCY_HEAD = ("", "flows", "TTFB p50 / p99", "TTFT p50 / p99", "ITL p50 / p99")
SEGMENT_HEAD = (
    "segment",
    "first token",
    "p50",
    "p99",
    "max",
    "inner hop's own p99",
    "wire p99",
    "whole body",
    "tokens",
    "request",
    "added to TTFT",
    "paired by",
    "measured",
)
FIGURES = (
    ("status", "response.status", None),
    ("ended", "response.ended", None),
    ("encoding", "response.content_encoding", None),
    ("TTFB", "figures.ttfb_s", ms),
    ("first event", "figures.ttfe_s", ms),
    ("TTFT", "figures.ttft_s", ms),
    ("ITL p50", "figures.itl_p50_s", ms),
    ("ITL p99", "figures.itl_p99_s", ms),
    ("max gap", "figures.max_gap_s", ms),
    ("stalls", "figures.stalls", None),
    ("tokens", "figures.tokens", None),
    ("token source", "figures.tokens_source", None),
    ("tokens/s", "figures.tokens_per_s", None),
    ("duration", "figures.duration_s", ms),
    ("own hold p99", "delivery.hold_p99_s", ms),
    ("client wait", "delivery.client_wait_s", ms),
    ("bytes (wire)", "response.bytes_wire", None),
    ("framing overhead", "figures.framing_overhead", None),
)


def _e(value: object) -> str:
    return escape(clean(value), quote=True)


def _get(rec: Mapping[str, Any], path: str) -> Any:
    value: Any = rec
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _fleet(fleet: Fleet) -> str:
    lat = [
        (name, lat.flows, *(f"{ms(a)} / {ms(b)}" for a, b in (lat.ttfb, lat.ttft, lat.itl)))
        for name, lat in fleet.latency
    ]
    tallies = (("hops", fleet.by_hop), ("apis", fleet.by_api), ("models", fleet.by_model))
    counts = " · ".join(
        f"<b>{label}</b> " + ", ".join(f"{_e(k)} {n}" for k, n in pairs) for label, pairs in tallies
    )
    find = "".join(
        f'<li class="sev-{_e(c.severity)}"><b>{_e(c.kind)}</b> ({_e(c.severity)}): '
        f"{c.flows} flows" + (f", {c.segments} segments" if c.segments else "") + "</li>"
        for c in fleet.findings
    )
    segs = "".join(
        f"<li>{_e(s)}: {n} traces aligned, {w} held the whole body</li>"
        for s, n, w in fleet.segments
    )
    multi = f", {fleet.multi_hop} seen at several hops" if fleet.multi_hop else ""
    return (
        '<section id="fleet"><h2>Fleet</h2>'
        f"<p>{fleet.flows} flows in {fleet.traces} traces{multi}, "
        f"{_e(when(fleet.t_first))} to {_e(when(fleet.t_last))}</p><p>{counts}</p>"
        + _table(LATENCY_HEAD, lat, "latency")
        + '<h3>Findings, worst first</h3><ul class="fleet-findings">'
        + (find or '<li class="ok">none</li>')
        + "</ul>"
        + (f"<h3>Segments</h3><ul>{segs}</ul>" if segs else "")
        + "</section>"
    )


def _fact(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _finding(where: str, f: Mapping[str, Any]) -> str:
    ev = f.get("evidence") or {}
    extra = {k: v for k, v in f.items() if k == "first_token_hold_s"}
    if f.get("introduced_by") not in (None, where):
        extra["introduced_by"] = f["introduced_by"]
    facts = ", ".join(f"{k}={_fact(v)}" for k, v in {**extra, **ev}.items())
    kind = str(f.get("kind"))
    fix = f.get("fix") or FIXES.get(kind) or CLIENT_FIXES.get(kind, "")
    sev = severity(f)
    return (
        f'<li class="finding sev-{_e(sev)}" data-kind="{_e(f.get("kind"))}"><b>{_e(f.get("kind"))}'
        f"</b> <span>({_e(sev)}, at {_e(where)})</span>"
        + (f'<div class="evidence">{_e(facts)}</div>' if facts else "")
        + (f'<p class="fix">Fix: {_e(fix)}</p>' if fix else "")
        + "</li>"
    )


def _segment_row(b: Band) -> list[object]:
    s = b.summary
    return [
        b.segment,
        *(ms(s.get(k)) for k in ("first_token_hold_s", "hold_p50_s", "hold_p99_s", "hold_max_s")),
        ms(s.get("inner_hold_p99_s")),
        ms(s.get("wire_hold_p99_s")),
        "yes" if s.get("whole_body") else "no",
        s.get("tokens_aligned", len(b.runs)),
        ms(s.get("request_delay_s")),
        ms(s.get("added_ttft_s")),
        s.get("paired_by") or "trace",
        "live" if b.live else "aligned from events",
    ]


def _headline(trace: Trace) -> str:
    worst = trace.worst()
    held = [b for b in trace.bands if b.summary.get("whole_body")]
    if held:
        b = held[0]
        return (
            f'<p class="verdict sev-error">Segment {_e(b.segment)} held the whole body: first '
            f"token {_e(ms(b.summary.get('first_token_hold_s')))} late.</p>"
        )
    if worst is not None:
        sev = severity(worst)
        return f'<p class="verdict sev-{_e(sev)}">{_e(worst.get("fix") or worst.get("kind"))}</p>'
    return '<p class="verdict ok">Streamed cleanly at every hop.</p>'


def _trace(trace: Trace, threshold_s: float) -> str:
    rec = trace.outer
    req = rec.get("request") or {}
    title = (
        f"{req.get('method', '')} {req.get('path', '')} · {rec.get('api', '')} · "
        f"{rec.get('model') or '-'} · {len(trace.lanes)} hop{'s' if len(trace.lanes) > 1 else ''}"
    )
    figures = _table(
        ["", *(lane.hop for lane in trace.lanes)],
        [
            [label, *(_show(_get(lane.record, path), fmt) for lane in trace.lanes)]
            for label, path, fmt in FIGURES
        ],
        "figures",
    )
    segments = ""
    if trace.bands:
        rows = [_segment_row(b) for b in trace.bands]
        segments = "<h3>Holds per segment</h3>" + _table(SEGMENT_HEAD, rows, "segments")
    found = "".join(_finding(where, f) for where, f in trace.findings())
    return (
        f'<section class="trace" id="trace-{_e(trace.trace_id)}" '
        f'data-hops="{len(trace.lanes)}"><h2>{_e(title)}</h2>'
        f'<p class="muted">trace {_e(trace.trace_id)} · {_e(when(trace.t0))} · hops, client '
        f"side first: {_e(' > '.join(lane.hop for lane in trace.lanes))}</p>"
        + _headline(trace)
        + lanes.render(trace)
        + LEGEND
        + (BROWSER_NOTE if any(lane.hop in (BROWSER, SCREEN) for lane in trace.lanes) else "")
        + '<div class="row"><div><h3>Inter-token gaps</h3>'
        + histogram.render(trace.lanes, threshold_s)
        + f'<p class="muted">stall threshold {_e(ms(threshold_s))}</p></div>'
        + f"<div><h3>Figures</h3>{figures}</div></div>"
        + segments
        + "<h3>Findings</h3>"
        + (f'<ul class="findings">{found}</ul>' if found else '<p class="ok">none</p>')
        + "</section>"
    )


def _show(value: object, fmt: Any) -> str:
    if value is None:
        return "-"
    return str(fmt(value)) if fmt is not None else str(value)


def is_stream(trace: Trace) -> bool:
    """Whether any hop of the trace saw a token."""
    return any(lane.marks for lane in trace.lanes)


def _badness(t: Trace) -> tuple[int, int, float]:
    """Worst first: the worst finding's severity, then more hops, then earlier."""
    w = t.worst()
    return (3 if w is None else severity_rank(w), -len(t.lanes), t.t0)


def _pick(traces: Sequence[Trace], max_traces: int) -> list[Trace]:
    """At most `max_traces` token streams, worst first."""
    return sorted((t for t in traces if is_stream(t)), key=_badness)[: max(0, max_traces)]


def _others(traces: Sequence[Trace], max_rows: int) -> str:
    """The flows that carried no token, in one collapsed table (worst first)."""
    rest = sorted((t for t in traces if not is_stream(t)), key=_badness)
    if not rest:
        return ""
    rows = []
    for t in rest[: max(0, max_rows)]:
        rec, worst = t.outer, t.worst()
        req, resp = rec.get("request") or {}, rec.get("response") or {}
        rows.append(
            [
                f"{req.get('method', '')} {req.get('path', '')}",
                resp.get("status", "-"),
                " > ".join(lane.hop for lane in t.lanes),
                ms(_get(rec, "figures.duration_s")),
                "-" if worst is None else f"{worst.get('kind')} ({severity(worst)})",
            ]
        )
    left = len(rest) - len(rows)
    more = f'<p class="muted">{left} more not listed (--max-traces).</p>' if left else ""
    found = sum(1 for t in rest if t.worst() is not None)
    return (
        f'<details class="other-flows"><summary>{len(rest)} other flows carried no token '
        f"(page assets and the like){f', {found} with findings' if found else ''}</summary>"
        + _table(("request", "status", "hops", "duration", "worst finding"), rows, "others")
        + more
        + "</details>"
    )


def render(fleet: Fleet, traces: Sequence[Trace], *, threshold_s: float, max_traces: int) -> str:
    """The whole page."""
    shown = _pick(traces, max_traces)
    left = sum(1 for t in traces if is_stream(t)) - len(shown)
    note = f'<p class="muted">{left} more traces not drawn (--max-traces).</p>' if left else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>hopmeter report: {fleet.flows} flows</title><style>{CSS}</style></head><body>"
        f'<h1>hopmeter report</h1><p class="muted">hopmeter {_e(__version__)} · each trace drawn '
        "as lanes, one per hop, from the measured arrival of every token event</p>"
        + _fleet(fleet)
        + "".join(_trace(t, threshold_s) for t in shown)
        + note
        + _others(traces, max_traces)
        + "</body></html>\n"
    )
