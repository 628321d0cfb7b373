"""The lanes picture as inline SVG: one lane per hop, each token falling from the model's side.

Drawn as in the seed "GPU to pixel": time runs left to right; the hop nearest the model is the top
lane and the hop nearest the client the bottom one, so a token falls through the lanes. A tick is a
token event's arrival at a hop. Between two lanes lies the segment between those hops: each token
drops from its arrival at the inner hop, runs orange for as long as the segment held it, and drops
to its arrival at the outer hop; where the inner hop followed its bytes out, the first part of the
run, inside the inner hop's own process, is purple. Inside a lane, an orange bar is a stall (a gap
at or above the stall threshold) or the wait before a whole body arrived: held somewhere before this
hop. The request goes the other way: a blue line climbs each band from the outer hop's request
start to the inner hop's, the time the segment took to pass the request in (`request_delay_s`).
"""

from __future__ import annotations

import math
from html import escape

from hopmeter.report.text import clean, ms
from hopmeter.report.traces import Band, Lane, Trace

WIDTH = 960
LEFT = 170  # room for the lane labels
RIGHT = 16
LANE_H = 46
BAND_H = 64
AXIS_H = 30
TICK_H = 18
# Runs drawn per segment: beyond this every k-th is drawn (the summary keeps all of them). A
# record lists at most 8,192 events; 600 runs keep a trace's SVG near 100 KB.
MAX_RUNS = 600


def _f(x: float) -> str:
    return f"{x:.1f}"


class _Scale:
    """Seconds since the trace's origin to x pixels."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.width = WIDTH - LEFT - RIGHT

    def x(self, t_s: float) -> float:
        return LEFT + max(0.0, min(t_s, self.span_s)) / self.span_s * self.width


def nice_step(span_s: float, target: int = 8) -> float:
    """A 1-2-5 step that cuts `span_s` into about `target` intervals."""
    raw = span_s / target
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _axis(scale: _Scale, top: float, bottom: float) -> list[str]:
    step = nice_step(scale.span_s)
    out = ['<g class="axis">']
    for i in range(int(scale.span_s / step + 1e-9) + 1):
        t = i * step
        x = _f(scale.x(t))
        label = f"{t:g} s" if step >= 1 else f"{t * 1000:g} ms"
        out.append(
            f'<line x1="{x}" y1="{_f(top)}" x2="{x}" y2="{_f(bottom)}" class="grid"/>'
            f'<text x="{x}" y="{_f(bottom + 16)}" text-anchor="middle">{label}</text>'
        )
    out.append("</g>")
    return out


def _label(y: float, title: str, sub: str, cls: str) -> str:
    return (
        f'<text x="8" y="{_f(y - 3)}" class="{cls}">{escape(clean(title))}</text>'
        f'<text x="8" y="{_f(y + 12)}" class="sub">{escape(clean(sub))}</text>'
    )


def _lane(lane: Lane, scale: _Scale, top: float) -> list[str]:
    mid = top + LANE_H / 2
    fig = lane.record.get("figures") or {}
    tokens = sum(m.tokens for m in lane.marks)
    sub = f"ttft {ms(fig.get('ttft_s'))} · {tokens} tok · {len(lane.marks)} ev"
    out = [
        f'<g class="lane" data-hop="{escape(clean(lane.hop))}">',
        f"<title>{escape(clean(lane.hop))}: {len(lane.marks)} token events</title>",
        f'<rect x="{LEFT}" y="{_f(top)}" width="{WIDTH - LEFT - RIGHT}" height="{LANE_H}" '
        'class="lane-bg" rx="4"/>',
        _label(mid, lane.hop, sub, "hop"),
        f'<line x1="{_f(scale.x(lane.t_start_s))}" y1="{_f(mid)}" x2="{_f(scale.x(lane.t_end_s))}"'
        f' y2="{_f(mid)}" class="life"/>',
        f'<path d="M{_f(scale.x(lane.t_start_s))} {_f(mid - 9)}v18" class="start"/>',
    ]
    if lane.t_first_byte_s is not None:
        x = _f(scale.x(lane.t_first_byte_s))
        out.append(f'<path d="M{x} {_f(mid + 4)}l-4 7h8z" class="first-byte"/>')
    for run in lane.runs:
        x0, x1 = scale.x(run.t0_s), scale.x(run.t1_s)
        out.append(
            f'<rect x="{_f(x0)}" y="{_f(mid - 4)}" width="{_f(max(x1 - x0, 1.0))}" height="8" '
            f'class="stall"><title>{escape(run.label)}</title></rect>'
        )
    quiet = "".join(f"M{_f(scale.x(t))} {_f(mid - 4)}v8" for t in lane.quiet_s)
    if quiet:
        out.append(f'<path d="{quiet}" class="quiet"/>')
    ticks = "".join(f"M{_f(scale.x(m.t_s))} {_f(mid - TICK_H / 2)}v{TICK_H}" for m in lane.marks)
    if ticks:
        out.append(f'<path d="{ticks}" class="mark"/>')
    out.append("</g>")
    return out


def _band(band: Band, scale: _Scale, top: float) -> list[str]:
    """Token runs from the inner lane (above) to the outer lane (below)."""
    runs = band.runs
    step = max(1, math.ceil(len(runs) / MAX_RUNS))
    shown = runs[::step]
    s = band.summary
    whole = " · whole body" if s.get("whole_body") else ""
    sub = f"hold p50 {ms(s.get('hold_p50_s'))} max {ms(s.get('hold_max_s'))}{whole}"
    if s.get("tokens_out"):
        sub += f" · wire p99 {ms(s.get('wire_hold_p99_s'))}"
    if s.get("request_delay_s") is not None:
        sub = f"request {ms(s.get('request_delay_s'))} · {sub}"
    fall, held, own = [], [], []
    bottom = top + BAND_H
    for j, run in enumerate(shown):
        y = top + 6 + (BAND_H - 12) * (j / (len(shown) - 1) if len(shown) > 1 else 0.5)
        x0, x1 = scale.x(run.t0_s), scale.x(run.t1_s)
        fall.append(f"M{_f(x0)} {_f(top)}V{_f(y)}M{_f(x1)} {_f(y)}V{_f(bottom)}")
        if run.t_left_s is not None:  # the inner hop's own part, then the wire's
            xl = scale.x(run.t_left_s)
            if xl > x0:
                own.append(f"M{_f(x0)} {_f(y)}H{_f(xl)}")
            x0 = xl
        held.append(f"M{_f(x0)} {_f(y)}H{_f(max(x1, x0 + 0.5))}")
    first = s.get("first_token_hold_s")
    title = (
        f"segment {band.segment}: first token held {ms(first)}, hold p50 "
        f"{ms(s.get('hold_p50_s'))}, p99 {ms(s.get('hold_p99_s'))}, max {ms(s.get('hold_max_s'))}"
    )
    if s.get("added_ttft_s") is not None:
        title += (
            f"; request took {ms(s.get('request_delay_s'))} on the way in: "
            f"{ms(s.get('added_ttft_s'))} added to the first token"
        )
    if s.get("paired_by") == "content":
        title += "; paired by reply content (the trace id did not pass)"
    if step > 1:
        title += f" (every {step}th of {len(runs)} token events drawn)"
    out = [
        f'<g class="band" data-segment="{escape(clean(band.segment))}">',
        f"<title>{escape(clean(title))}</title>",
        _label(top + BAND_H / 2, band.segment, sub, "segment"),
    ]
    if fall:
        out.append(f'<path d="{"".join(fall)}" class="fall"/>')
        out.append(f'<path d="{"".join(held)}" class="held"/>')
    if own:
        out.append(f'<path d="{"".join(own)}" class="own"/>')
    req = band.request
    if req is not None:  # the request climbs from the outer lane (below) to the inner (above)
        x0, x1 = scale.x(req.t0_s), scale.x(req.t1_s)
        out.append(
            f'<path d="M{_f(x0)} {_f(bottom)}L{_f(max(x1, x0 + 0.5))} {_f(top)}" '
            f'class="request"><title>{escape(clean(req.label))}</title></path>'
        )
    out.append("</g>")
    return out


def height(trace: Trace) -> int:
    """The SVG's height for `trace`."""
    return int(8 + len(trace.lanes) * LANE_H + len(trace.bands) * BAND_H + AXIS_H)


def render(trace: Trace) -> str:
    """The lanes SVG of one trace."""
    scale = _Scale(trace.span_s)
    h = height(trace)
    hops = " > ".join(lane.hop for lane in trace.lanes)
    out = [
        f'<svg class="lanes" viewBox="0 0 {WIDTH} {h}" width="{WIDTH}" height="{h}" '
        f'role="img" aria-label="{escape(clean("lanes, client side last: " + hops))}" '
        'xmlns="http://www.w3.org/2000/svg">',
    ]
    out += _axis(scale, 4, h - AXIS_H + 4)
    y = 4.0
    # drawn from the model's side down to the client's: the reverse of outermost-first
    for i in range(len(trace.lanes) - 1, -1, -1):
        out += _lane(trace.lanes[i], scale, y)
        y += LANE_H
        if i > 0:
            out += _band(trace.bands[i - 1], scale, y)
            y += BAND_H
    out.append("</svg>")
    return "".join(out)
