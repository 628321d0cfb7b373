"""The lanes SVG on hand-written records: lane order, ticks, holds between hops, stalls, axis."""

from __future__ import annotations

import re

from hopmeter.report.lanes import MAX_RUNS, height, nice_step, render
from hopmeter.report.traces import build
from tests.report.literal import EDGE, ORIGIN, T0, flow

TWO_HOPS = build([ORIGIN, EDGE], 0.5)


def _group(svg: str, attr: str, value: str) -> str:
    """The SVG group of one lane (attr "hop") or one band (attr "segment")."""
    match = re.search(rf'<g class="\w+" data-{attr}="{re.escape(value)}">.*?</g>', svg)
    assert match is not None, value
    return match.group(0)


def _path(group: str, cls: str) -> str:
    match = re.search(rf'<path d="([^"]*)" class="{cls}"/>', group)
    return match.group(1) if match else ""


def _xs(path: str, command: str) -> list[float]:
    """The x of every move (command "M") or horizontal line (command "H") in a path."""
    return [float(x) for x in re.findall(rf"{command}([\d.]+)", path)]


def test_steps_are_one_two_five() -> None:
    """Axis steps are 1, 2 or 5 times a power of ten, about eight to a span."""
    assert [nice_step(s) for s in (0.8, 1.0, 0.011, 7.0, 30.0)] == [0.1, 0.2, 0.002, 1.0, 5.0]
    assert nice_step(0.0) == 1.0  # an empty span still gets an axis


def test_height_grows_with_lanes_and_bands() -> None:
    """The picture is as tall as its lanes, the bands between them and the axis."""
    assert height(TWO_HOPS) == 8 + 2 * 46 + 64 + 30
    assert height(build([EDGE], 0.5)) == 8 + 46 + 30


def test_the_model_side_is_on_top_and_the_client_side_last() -> None:
    """Lanes are drawn from the hop nearest the model down to the client's, with the segment
    between each pair; the label lists them client side first."""
    svg = render(TWO_HOPS)
    assert svg.startswith('<svg class="lanes" viewBox="0 0 960 194"')
    assert re.findall(r'data-(?:hop|segment)="([^"]*)"', svg) == [
        "origin",
        "edge&gt;origin",
        "edge",
    ]
    assert 'aria-label="lanes, client side last: edge &gt; origin"' in svg


def test_a_tick_per_token_event_and_a_quiet_mark_for_the_rest() -> None:
    """Each event that carried tokens is a tick in its hop's lane; one that carried none (a
    prelude) is a short quiet mark."""
    svg = render(TWO_HOPS)
    for hop in ("origin", "edge"):
        lane = _group(svg, "hop", hop)
        assert len(_xs(_path(lane, "mark"), "M")) == 3
        assert len(_xs(_path(lane, "quiet"), "M")) == 1
        assert f"<title>{hop}: 3 token events</title>" in lane


def test_each_token_is_held_from_the_inner_arrival_to_the_outer_one() -> None:
    """In the band, each token's held run starts where the inner lane ticked it and ends where
    the outer lane did, never leftwards."""
    svg = render(TWO_HOPS)
    band = _group(svg, "segment", "edge&gt;origin")
    held = _path(band, "held")
    origin_ticks = _xs(_path(_group(svg, "hop", "origin"), "mark"), "M")
    edge_ticks = _xs(_path(_group(svg, "hop", "edge"), "mark"), "M")
    assert _xs(held, "M") == origin_ticks
    assert _xs(held, "H") == edge_ticks
    assert all(end > start for start, end in zip(origin_ticks, edge_ticks, strict=True))
    assert "first token held 399ms, hold p50 299ms, p99 399ms, max 399ms" in band


def test_a_stall_is_an_orange_bar_in_its_lane() -> None:
    """A gap at or above the threshold is drawn as a stall bar titled with its length."""
    stalled = flow("proxy", T0, [[0.1, 1, 2], [0.7, 1, 4], [0.8, 1, 6]], trace="s")
    svg = render(build([stalled], 0.5))
    assert re.findall(r'class="stall"><title>([^<]*)</title>', svg) == ["stall 0.600 s"]
    assert 'class="stall"' not in render(build([stalled], 0.7))


def test_the_axis_reads_in_ms_or_seconds() -> None:
    """A sub-second trace is marked in ms; a five-second one in whole seconds."""
    assert re.findall(r'text-anchor="middle">(\d+ ms)<', render(TWO_HOPS))[:3] == [
        "0 ms",
        "100 ms",
        "200 ms",
    ]
    slow = flow("proxy", T0, [[1.0, 1, 2], [5.0, 1, 4]], trace="slow")
    assert re.findall(r'text-anchor="middle">(\d+ s)<', render(build([slow], 0.5)))[:2] == [
        "0 s",
        "1 s",
    ]


def test_a_long_band_draws_a_sample_of_its_runs_and_says_so() -> None:
    """Past MAX_RUNS token runs a band draws every k-th and its title says how many it left out."""
    n = 2 * MAX_RUNS
    events = [[0.01 * i, 1, i + 1] for i in range(n)]
    inner = flow("origin", T0 + 0.001, events, trace="long", parent="edge")
    outer = flow("edge", T0, [[0.01 * i + 0.005, 1, i + 1] for i in range(n)], trace="long")
    band = _group(render(build([inner, outer], 0.5)), "segment", "edge&gt;origin")
    assert len(_xs(_path(band, "held"), "H")) == MAX_RUNS
    assert f"(every 2th of {n} token events drawn)" in band


def test_names_from_traffic_are_escaped_and_made_visible() -> None:
    """A hop name with markup or a control character cannot break out of the SVG."""
    odd = flow('e<dge>"\x1b[31m', T0, [[0.1, 1, 2], [0.2, 1, 4]], trace="odd")
    svg = render(build([odd], 0.5))
    assert "<dge>" not in svg and "\x1b" not in svg
    assert 'data-hop="e&lt;dge&gt;&quot;\\x1b[31m"' in svg


def test_the_request_climbs_from_the_outer_start_to_the_inner_one() -> None:
    """In each band a blue line climbs from the outer hop's request start (below) to the inner
    hop's (above), titled with the delay; the band's label says it and the added first-token
    time."""
    svg = render(TWO_HOPS)
    band = _group(svg, "segment", "edge&gt;origin")
    m = re.search(r'<path d="M([\d.]+) ([\d.]+)L([\d.]+) ([\d.]+)" class="request">', band)
    assert m is not None
    x0, y_bottom, x1, y_top = map(float, m.groups())
    starts = [
        float(re.search(r'class="life"', lane) and re.findall(r'x1="([\d.]+)"', lane)[0])
        for lane in (_group(svg, "hop", "edge"), _group(svg, "hop", "origin"))
    ]
    assert (x0, x1) == (starts[0], max(starts[1], starts[0] + 0.5)) and y_bottom > y_top
    assert "request took 1.0 ms from edge to origin" in band
    assert "request 1.0ms · hold p50" in band and "400ms added to the first token" in band
