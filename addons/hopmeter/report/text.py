"""The report as text for a terminal: the fleet summary, then one line per flow.

Records carry strings that came from traffic (model names, paths, hop names); every one passes
through `clean()` so that no control character from a record reaches the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hopmeter.core.record import summary_line
from hopmeter.report.fleet import Fleet
from hopmeter.report.traces import Trace, is_page_lane

# C0 controls, DEL and C1 controls: an escape sequence in a model name could rewrite the terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


def clean(value: object) -> str:
    """`value` as text with every control character written as a visible \\xNN escape."""
    return str(value).translate(_CONTROLS)


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds for people: '-', '0.3ms', '53ms', '1.03s'."""
    if seconds is None:
        return "-"
    if seconds == 0:
        return "0ms"
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds < 0.001:
        return f"{seconds * 1000:.2f}ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f}ms"
    return f"{seconds * 1000:.0f}ms"


def when(epoch: float | None) -> str:
    """An epoch time as local ISO date and time to the second."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _tally(pairs: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{clean(name)} {n}" for name, n in pairs) or "-"


def fleet_lines(fleet: Fleet) -> list[str]:
    """The fleet summary: counts, latency quantiles per hop, findings worst first, segments."""
    multi = f" ({fleet.multi_hop} seen at several hops)" if fleet.multi_hop else ""
    lines = [
        f"hopmeter report: {fleet.flows} flows in {fleet.traces} traces{multi}, "
        f"{when(fleet.t_first)} to {when(fleet.t_last)}",
        f"  flows by hop:   {_tally(fleet.by_hop)}",
        f"  flows by api:   {_tally(fleet.by_api)}",
        f"  flows by model: {_tally(fleet.by_model)}",
    ]
    width = max(len(clean(name)) for name, _ in fleet.latency)
    lines.append(
        f"  {'':<{width}}  flows  ttfb p50/p99      ttft p50/p99      itl p50/p99 (token-weighted)"
    )
    for name, lat in fleet.latency:
        cols = [f"{ms(a)}/{ms(b)}" for a, b in (lat.ttfb, lat.ttft, lat.itl)]
        lines.append(
            f"  {clean(name):<{width}}  {lat.flows:>5}  {cols[0]:<16}  {cols[1]:<16}  {cols[2]}"
        )
    if fleet.findings:
        lines.append("  findings, worst first:")
        for c in fleet.findings:
            where = [f"{c.flows} flows"] if c.flows else []
            where += [f"{c.segments} segments"] if c.segments else []
            lines.append(f"    {c.severity:<7} {clean(c.kind):<22} {', '.join(where)}")
    else:
        lines.append("  findings: none")
    for segment, n, whole in fleet.segments:
        lines.append(f"  segment {clean(segment)}: {n} traces aligned, {whole} held the whole body")
    return lines


def _hold_note(rec: Mapping[str, Any]) -> str:
    """The outer record's per-segment holds, as a suffix for its flow line."""
    parts = []
    for seg in rec.get("hops") or []:
        request = seg.get("request_delay_s")
        note = "" if request is None else f" request={ms(request)}"
        note += " by_content" if seg.get("paired_by") == "content" else ""
        whole = " whole_body" if seg.get("whole_body") else ""
        split = ""
        if seg.get("tokens_out"):  # the inner hop followed its bytes out: its own, the wire
            split = (
                f" inner_p99={ms(seg.get('inner_hold_p99_s'))}"
                f" wire_p99={ms(seg.get('wire_hold_p99_s'))}"
            )
        parts.append(
            f"hold {clean(seg.get('segment'))} first={ms(seg.get('first_token_hold_s'))} "
            f"p99={ms(seg.get('hold_p99_s'))}{split}{note}{whole}"
        )
    return (" " + " ".join(parts)) if parts else ""


def flow_line(rec: Mapping[str, Any]) -> str:
    """One line per flow: its time, trace, the console's summary line, and its holds."""
    start = (rec.get("request") or {}).get("t_start")
    trace = str(rec.get("trace_id") or "-")[:8]
    return clean(f"{when(start)} {trace} {summary_line(rec)}{_hold_note(rec)}")


def render(fleet: Fleet, traces: Iterable[Trace]) -> str:
    """The whole text report."""
    lines = fleet_lines(fleet)
    lines.append("flows:")
    for trace in traces:  # the browser and screen lanes are in their record's line already
        lines += ["  " + flow_line(lane.record) for lane in trace.lanes if not is_page_lane(lane)]
    return "\n".join(lines) + "\n"
