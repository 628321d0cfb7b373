"""The inter-token gap histogram as inline SVG, one bar per hop in each bucket.

Gaps are token-weighted (an event carrying k tokens after a gap g counts k gaps of g/k,
docs/design.md §6) and bucketed on the inter-token-latency grid of the Prometheus histogram
(docs/design.md §8), so the picture matches the dashboards. A buffering hop shows as a heap of
sub-millisecond gaps (tokens released together) beside a few long ones; buckets at or above the
stall threshold are orange.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from html import escape

from hopmeter.core.figures import token_gaps
from hopmeter.report.text import clean
from hopmeter.report.traces import Lane

# docs/design.md §8, inter-token latency buckets (upper bounds, seconds); one more above the last.
BOUNDS_S = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
MIN_BUCKETS = 15  # always show up to 1 s, so two histograms read on the same axis
WIDTH, HEIGHT = 460, 190
LEFT, RIGHT, TOP, BOTTOM = 40, 10, 12, 48
HOP_COLOURS = ("#1d4ed8", "#60a5fa", "#a5b4fc", "#c4b5fd")  # outermost hop darkest
STALL_COLOURS = ("#ea580c", "#fb923c", "#fdba74", "#fed7aa")


def bucket_label(i: int) -> str:
    """The upper bound of bucket i, for people ('1ms', '2.5ms', '1s', '>80s')."""
    if i >= len(BOUNDS_S):
        return f">{BOUNDS_S[-1]:g}s"
    b = BOUNDS_S[i]
    return f"{b:g}s" if b >= 1 else f"{b * 1000:g}ms"


def counts(lane: Lane) -> list[int]:
    """Token-weighted gaps of one hop, per bucket (len(BOUNDS_S) + 1 buckets)."""
    out = [0] * (len(BOUNDS_S) + 1)
    ev = lane.record.get("events") or []
    gaps = token_gaps([float(e[0]) for e in ev], [int(e[1]) for e in ev])
    for g, w in zip(gaps.values_s, gaps.weights, strict=True):
        out[bisect_left(BOUNDS_S, g)] += w
    return out


def render(lanes: Sequence[Lane], threshold_s: float) -> str:
    """The histogram SVG for a trace's hops (outermost first)."""
    per_hop = [counts(lane) for lane in lanes]
    used = [i for c in per_hop for i, n in enumerate(c) if n]
    if not used:
        return '<p class="muted no-gaps">No gaps: fewer than two events carried tokens.</p>'
    n_buckets = max(MIN_BUCKETS, max(used, default=0) + 1)
    peak = max((max(c[:n_buckets]) for c in per_hop), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / n_buckets
    bar = slot * 0.85 / max(1, len(lanes))
    base = TOP + plot_h
    out = [
        f'<svg class="histogram" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="inter-token gap histogram" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}" class="baseline"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{peak}</text>',
        f'<text x="{LEFT - 4}" y="{base}" text-anchor="end">0</text>',
    ]
    for h, lane in enumerate(lanes):  # the key, top right
        y = TOP + 4 + h * 14
        out.append(
            f'<rect x="{WIDTH - 130}" y="{y}" width="10" height="10" '
            f'fill="{HOP_COLOURS[h % len(HOP_COLOURS)]}"/><text x="{WIDTH - 115}" y="{y + 9}">'
            f"{escape(clean(lane.hop))}</text>"
        )
    for i in range(n_buckets):
        lower = BOUNDS_S[i - 1] if i else 0.0
        stall = lower >= threshold_s
        for h, c in enumerate(per_hop):
            if not c[i]:
                continue
            bar_h = max(1.0, c[i] / peak * plot_h)
            x = LEFT + i * slot + slot * 0.075 + h * bar
            colours = STALL_COLOURS if stall else HOP_COLOURS
            title = f"{clean(lanes[h].hop)}: {c[i]} gaps up to {bucket_label(i)}"
            out.append(
                f'<rect x="{x:.1f}" y="{base - bar_h:.1f}" width="{bar:.1f}" height="{bar_h:.1f}" '
                f'fill="{colours[h % len(colours)]}"><title>{escape(title)}</title></rect>'
            )
        if i % 2 == 0 or i == n_buckets - 1:
            x = LEFT + (i + 0.5) * slot
            out.append(
                f'<text x="{x:.1f}" y="{base + 12}" text-anchor="end" '
                f'transform="rotate(-40 {x:.1f} {base + 12})">{bucket_label(i)}</text>'
            )
    out.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 2}" text-anchor="middle" class="sub">'
        "gap before each token (token-weighted), bucket upper bounds</text></svg>"
    )
    return "".join(out)
