"""One response as text: the verdict, findings with their fixes, figures, then one row per event.

What mitmweb and the mitmproxy console show in hopmeter's content view (hopmeter.proxy.addon.ui),
and what a flow's comment says. It is built from the flow's record (the times, tokens and findings
measured live) and its stored body, read again with the core's own parsers for each event's text:
a flow saved to a file and opened later renders the same, with nothing of the live proxy left.
mitmweb draws a view as plain text (it ignores syntax highlighting), so stalls and bursts are
marked with glyphs in the text itself, and the figures and findings come first: mitmweb shows
the first 512 lines until asked for more.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from hopmeter.core.detectors import DEFAULT_STALL_THRESHOLD_S, THRESHOLDS
from hopmeter.core.meter import FlowMeter
from hopmeter.core.vocab import SEVERITY_ORDER, Api, Severity
from hopmeter.core.wire import detect_api
from hopmeter.report.text import clean, ms
from hopmeter.report.traces import stall_threshold

TEXT_HEAD_CHARS = 40  # of each event's text, shown in its row
BAR_CELLS = 16  # the gap bar's width; a cell is split in eighths
BLOCKS = " ▏▎▍▌▋▊▉"  # eighths of a cell
FIX_WIDTH = 96  # a finding's fix is wrapped at this many characters
# Events closer than the detectors' wire-speed gap came in one release, not on a token clock
# (core.detectors THRESHOLDS["burst_join_s"]); this many in a row are marked as a burst.
BURST_GAP_S = THRESHOLDS["burst_join_s"]
BURST_MIN_EVENTS = 3
GLYPHS = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "ℹ"}
CLEAN_GLYPH = "✔"


def worst_severity(record: Mapping[str, Any]) -> Severity | None:
    """The severity of the record's worst finding, None when it has none."""
    found = [
        Severity(f["severity"])
        for f in record.get("findings") or []
        if isinstance(f, Mapping) and f.get("severity") in SEVERITY_ORDER
    ]
    return min(found, key=SEVERITY_ORDER.__getitem__, default=None)


def measured(record: Mapping[str, Any]) -> bool:
    """Whether the record is an LLM reply worth a verdict: a known API, or a finding."""
    return record.get("api", Api.OTHER) != Api.OTHER or bool(record.get("findings"))


def verdict(record: Mapping[str, Any]) -> str:
    """One line: TTFT, inter-token latency p50/p99, max gap, tokens and the findings' kinds."""
    fig = record.get("figures") or {}
    kinds = ",".join(str(f.get("kind")) for f in record.get("findings") or []) or "clean"
    if not fig:
        resp = record.get("response") or {}
        # no response: the status the proxy answered in place of a failed upstream, if it did
        status = resp.get("status", (record.get("upstream_error") or {}).get("status_sent"))
        ended = resp.get("ended") or record.get("ended") or "no response"
        return clean(f"hopmeter: not measured ({status or '-'}, {ended}) · {kinds}")
    return clean(
        f"TTFT {ms(fig.get('ttft_s'))} · ITL p50 {ms(fig.get('itl_p50_s'))} "
        f"p99 {ms(fig.get('itl_p99_s'))} · max gap {ms(fig.get('max_gap_s'))} · "
        f"{fig.get('tokens', '-')} tok · {kinds}"
    )


def reread(body: bytes, *, api: str | None, content_type: str, path: str = "/") -> FlowMeter:
    """The stored (decoded) body read again by the core's meter: its events and their text."""
    known = api if api in tuple(Api) else None
    meter = FlowMeter(
        api=Api(known) if known else detect_api("POST", path, {}, {}, content_type),
        content_type=content_type,
        content_encoding=None,
    )
    meter.feed(body, 0.0)
    meter.close(0.0)
    return meter


def render(
    body: bytes,
    record: Mapping[str, Any] | None,
    *,
    content_type: str,
    path: str = "/",
    stall_threshold_s: float | None = None,
) -> str:
    """The whole view: a header, findings and figures (when measured), then the events."""
    meter = reread(
        body, api=record.get("api") if record else None, content_type=content_type, path=path
    )
    texts = meter.event_texts()
    if record is None:
        lines = ["hopmeter: not measured live (no record in this flow): events without times"]
        events: list[tuple[float | None, int | None]] = [(None, None)] * len(texts)
        threshold = stall_threshold_s or DEFAULT_STALL_THRESHOLD_S
    else:
        lines = _head(record)
        events = [(float(e[0]), int(e[1])) for e in record.get("events") or [] if len(e) >= 2]
        threshold = stall_threshold_s or stall_threshold([record])
        if len(events) != len(texts):
            lines.append(
                f"  (the stored body reads as {len(texts)} events, the record lists "
                f"{len(events)}: texts are shown by position)"
            )
    lines += _events(events, texts, threshold)
    if record is not None and record.get("events_dropped"):
        lines.append(f"  … {record['events_dropped']} more events were counted, not listed")
    return "\n".join(lines) + "\n"


def _head(rec: Mapping[str, Any]) -> list[str]:
    resp = rec.get("response") or {}
    sev = worst_severity(rec)
    glyph = GLYPHS[sev] if sev else CLEAN_GLYPH
    lines = [
        clean(
            f"hopmeter · {rec.get('api')} {rec.get('model') or ''} · {resp.get('status', '-')} · "
            f"ended {resp.get('ended', '-')} · hop {rec.get('hop')}"
        ),
        f"{glyph} {verdict(rec)}",
        "",
    ]
    findings = [f for f in rec.get("findings") or [] if isinstance(f, Mapping)]
    lines.append("FINDINGS" + ("  none: the stream looks clean" if not findings else ""))
    for f in findings:
        evidence = " ".join(
            f"{k}={_value(v)}" for k, v in sorted((f.get("evidence") or {}).items())
        )
        sev_name = str(f.get("severity"))
        mark = GLYPHS.get(Severity(sev_name), "·") if sev_name in SEVERITY_ORDER else "·"
        lines.append(clean(f"  {mark} {f.get('kind')} ({sev_name}): {evidence}"))
        fix = textwrap.wrap(f"fix: {f.get('fix', '')}", FIX_WIDTH)
        lines += ["      " + clean(line) for line in fix]
    for seg in rec.get("hops") or []:
        whole = ", whole body" if seg.get("whole_body") else ""
        lines.append(
            clean(
                f"  ⇄ segment {seg.get('segment')}: first token held "
                f"{ms(seg.get('first_token_hold_s'))}, p99 {ms(seg.get('hold_p99_s'))}{whole}"
            )
        )
    return [*lines, "", "FIGURES", *_figures(rec), ""]


def _figures(rec: Mapping[str, Any]) -> list[str]:
    fig = rec.get("figures") or {}
    if not fig:
        return ["  none: the response was not measured"]
    resp = rec.get("response") or {}
    return [
        f"  ttfb {ms(fig.get('ttfb_s'))} · ttft {ms(fig.get('ttft_s'))} · "
        f"itl p50 {ms(fig.get('itl_p50_s'))} p99 {ms(fig.get('itl_p99_s'))} · "
        f"max gap {ms(fig.get('max_gap_s'))} · stalls {fig.get('stalls')}",
        clean(
            f"  tokens {fig.get('tokens')} ({fig.get('tokens_source')}) · "
            f"tokens/s {_value(fig.get('tokens_per_s'))} · duration {ms(fig.get('duration_s'))} · "
            f"events {fig.get('events')} · wire {resp.get('bytes_wire')} B"
            + (f" ({resp['content_encoding']})" if resp.get("content_encoding") else "")
        ),
    ]


def _value(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list | dict):
        return orjson.dumps(v).decode()
    return str(v)


def _events(
    events: Sequence[tuple[float | None, int | None]], texts: Sequence[str], threshold_s: float
) -> list[str]:
    times = [t for t, _ in events]
    gaps: list[float | None] = [None]
    for a, b in itertools.pairwise(times):
        gaps.append(b - a if a is not None and b is not None else None)
    scale = max([g for g in gaps if g is not None] + [threshold_s])
    burst = _bursts(gaps)
    lines = [
        f"EVENTS  {len(events)} · t since request start · gap since the event before · "
        f"▲ STALL gap ≥ {threshold_s:g} s · ≡ burst (≥{BURST_MIN_EVENTS} events "
        f"< {BURST_GAP_S * 1000:g} ms apart)",
        f"  {'#':>4} {'t ms':>9} {'gap ms':>9} {'tok':>4}  {'gap':<{BAR_CELLS}}  text",
    ]
    for i, (t, tokens) in enumerate(events):
        text = texts[i] if i < len(texts) else ""
        shown = orjson.dumps(text[:TEXT_HEAD_CHARS]).decode()
        shown += "…" if len(text) > TEXT_HEAD_CHARS else ""
        gap = gaps[i]
        tag = ""
        if gap is not None and gap >= threshold_s:
            tag = f"  ◀ ▲ STALL {gap:.3f} s"
        elif i in burst:
            tag = "  ≡ burst"
        t_ms = f"{t * 1000:9.1f}" if t is not None else f"{'-':>9}"
        gap_ms = f"{gap * 1000:+9.1f}" if gap is not None else f"{'-':>9}"
        tok = "-" if tokens is None else str(tokens)
        lines.append(clean(f"  {i:>4} {t_ms} {gap_ms} {tok:>4}  {_bar(gap, scale)}  {shown}") + tag)
    return lines


def _bar(gap: float | None, scale: float) -> str:
    """A gap as a bar of BAR_CELLS cells, linear up to `scale` (in eighths of a cell)."""
    if gap is None or scale <= 0:
        return " " * BAR_CELLS
    eighths = max(0, min(BAR_CELLS * 8, round(gap / scale * BAR_CELLS * 8)))
    full, part = divmod(eighths, 8)
    return ("█" * full + (BLOCKS[part] if part else "")).ljust(BAR_CELLS)


def _bursts(gaps: Sequence[float | None]) -> set[int]:
    """Indexes of events in runs of BURST_MIN_EVENTS or more that came under BURST_GAP_S apart."""
    out: set[int] = set()
    run: list[int] = []
    for i, gap in enumerate(gaps):
        if gap is not None and gap < BURST_GAP_S and run:
            run.append(i)
            continue
        if len(run) >= BURST_MIN_EVENTS:
            out.update(run)
        run = [i]
    if len(run) >= BURST_MIN_EVENTS:
        out.update(run)
    return out
