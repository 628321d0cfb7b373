"""Writes hopmeter's Grafana dashboards (dashboards/*.json) from the tables below.

Run `python dashboards/build.py` after changing a panel; tests/test_dashboards.py fails when the
committed JSON and this file disagree. Standard library only, so it runs anywhere.

Conventions (those of grafana/dashboard-linter): one `datasource` variable of type datasource,
every panel and target on `${datasource}`, `$__rate_interval` in every rate(), a unit, a title and
a description on every panel, counters only inside rate()/increase(). No `__inputs`: the files are
provisioned as they are, not imported through the UI.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39  # Grafana 10.4 / 11; older Grafanas migrate it on load

# Label matchers shared by the queries: every metric with hop/api/model labels, and the ones
# without a model label (bytes, findings).
SEL = 'hop=~"$hop", api=~"$api", model=~"$model"'
SEL_HA = 'hop=~"$hop", api=~"$api"'
RI = "$__rate_interval"


def quantile(q: float, metric: str, by: str = "hop", sel: str = SEL) -> str:
    """histogram_quantile over a histogram's bucket rates, grouped by `by`."""
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{RI}])))"


def buckets(metric: str, sel: str = SEL) -> str:
    """Per-bucket increases for a heatmap (Grafana reads `le` as the row)."""
    return f"sum by (le) (increase({metric}_bucket{{{sel}}}[{RI}]))"


@dataclass
class Target:
    expr: str
    legend: str = ""
    fmt: str = "time_series"

    def json(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "datasource": DS,
            "refId": ref,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "range": True,
            "format": self.fmt,
        }
        if self.fmt == "heatmap":
            out["exemplar"] = True  # trace ids ride on the buckets
        return out


@dataclass
class Panel:
    title: str
    description: str
    unit: str
    targets: list[Target]
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    options: dict[str, Any] = field(default_factory=dict)


def p50_p99(metric: str, by: str = "hop", sel: str = SEL) -> list[Target]:
    """The median and the 99th percentile of a histogram, one series per `by`."""
    return [
        Target(quantile(0.5, metric, by, sel), f"{{{{{by}}}}} p50"),
        Target(quantile(0.99, metric, by, sel), f"{{{{{by}}}}} p99"),
    ]


def heatmap(title: str, description: str, metric: str, sel: str = SEL) -> Panel:
    """A heatmap of a histogram's buckets, read as already bucketed (calculate: false)."""
    return Panel(
        title,
        description,
        "s",
        [Target(buckets(metric, sel), "{{le}}", "heatmap")],
        kind="heatmap",
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "scale": "exponential",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
                "fill": "dark-orange",
            },
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "yAxis": {"axisPlacement": "left", "unit": "s", "reverse": False},
            "cellValues": {"unit": "short"},
        },
    )


def stat(title: str, description: str, unit: str, expr: str) -> Panel:
    """A single number over the whole dashboard row."""
    return Panel(title, description, unit, [Target(expr, title)], kind="stat", width=6, height=4)


# --- the dashboards ---------------------------------------------------------------------------
TTFT = "hopmeter_time_to_first_token_seconds"
TTFB = "hopmeter_time_to_first_byte_seconds"
TTFE = "hopmeter_time_to_first_event_seconds"
ITL = "hopmeter_inter_token_latency_seconds"
HOLD = "hopmeter_hold_seconds"
OWN_HOLD = "hopmeter_own_hold_seconds"
CLIENT_WAIT = "hopmeter_client_wait_seconds"
REQUEST_DELAY = "hopmeter_segment_request_delay_seconds"
ADDED_TTFT = "hopmeter_segment_added_ttft_seconds"
PAIRINGS = "hopmeter_pairings_total"
FIRST_PAINTED = "hopmeter_time_to_first_painted_token_seconds"
PAINT_LAG = "hopmeter_paint_lag_seconds"
FLOWS = "hopmeter_flows_total"
FINDINGS = "hopmeter_findings_total"
SEGMENT_FINDINGS = "hopmeter_segment_findings_total"
BYTES = "hopmeter_bytes_total"

OVERVIEW = [
    stat(
        "Streams active",
        "Responses being streamed through hopmeter right now (all hops).",
        "none",
        "sum(hopmeter_streams_active)",
    ),
    stat(
        "Streams per second",
        "Finished flows per second at the selected hops.",
        "reqps",
        f"sum(rate({FLOWS}{{{SEL}}}[{RI}]))",
    ),
    stat(
        "Tokens per second",
        "Tokens delivered per second at the selected hops, however "
        "counted (stream, usage, tokenizer or estimate).",
        "short",
        f"sum(rate(hopmeter_tokens_total{{{SEL}}}[{RI}]))",
    ),
    stat(
        "Time to first token, p99",
        "99th percentile of request start to the first visible token, all selected hops together.",
        "s",
        quantile(0.99, TTFT, by=""),
    ),
    Panel(
        "Time to first token by hop",
        "Request start to the first event with visible content "
        "(role preludes and empty deltas do not count). The gap between two hops is what the "
        "path between them adds.",
        "s",
        p50_p99(TTFT),
    ),
    Panel(
        "Time to first byte by hop",
        "Request start to the first response body byte. A TTFT "
        "far above TTFB is a prelude or reasoning; a TTFB far above the origin's is a hop "
        "holding the body.",
        "s",
        p50_p99(TTFB),
    ),
    Panel(
        "Inter-token latency by hop",
        "Token-weighted gap between tokens: an event of k tokens "
        "after a gap g counts k times as g/k. A buffering hop shows a p50 near zero with a "
        "high p99: bursts after stalls.",
        "s",
        p50_p99(ITL),
    ),
    Panel(
        "Time to first event by hop",
        "Request start to the first complete event, visible or not (role prelude, ping).",
        "s",
        p50_p99(TTFE),
    ),
    heatmap(
        "Time to first token, distribution",
        "Every stream's TTFT over time; exemplars link a cell to the trace id of a stream in it.",
        TTFT,
    ),
    heatmap(
        "Inter-token latency, distribution",
        "Token-weighted inter-token gaps over time. Two "
        "bands (near zero and far above) are a buffer releasing windows.",
        ITL,
    ),
    Panel(
        "Stream duration by hop",
        "Request start to the last response byte.",
        "s",
        p50_p99("hopmeter_stream_duration_seconds"),
    ),
    Panel(
        "Tokens per event by hop",
        "Tokens carried per token-bearing event: 1 is a "
        "token-per-event stream, a few is a coalescing provider, hundreds is a body that was "
        "not streamed or was held whole.",
        "short",
        p50_p99("hopmeter_event_tokens"),
    ),
    Panel(
        "Streams per second by route",
        "Finished flows per second, by route template.",
        "reqps",
        [Target(f"sum by (route) (rate({FLOWS}{{{SEL}}}[{RI}]))", "{{route}}")],
    ),
    Panel(
        "Tokens per second by model",
        'Tokens per second by model family (allow-listed; others are "other").',
        "short",
        [Target(f"sum by (model) (rate(hopmeter_tokens_total{{{SEL}}}[{RI}]))", "{{model}}")],
    ),
]

WHOLE_BODY = f'kind="whole_body_hold", {SEL_HA}'
HOLDING_KINDS = 'kind=~"whole_body_hold|burst_gaps|compression_on_stream|buffering_headers"'
DELIVERY_KINDS = 'kind=~"slow_client|proxy_hold"'
SEG = 'segment=~"$segment"'

HOPS = [
    stat(
        "Whole-body holds in range",
        "Flows in the time range where nearly all bytes arrived "
        "in one burst after a long wait: a hop buffered the whole body.",
        "short",
        f"sum(increase({FINDINGS}{{{WHOLE_BODY}}}[$__range]))",
    ),
    stat(
        "Hold p99, worst segment",
        "The highest 99th-percentile per-token hold of any selected segment.",
        "s",
        f"max({quantile(0.99, HOLD, 'segment', SEG)})",
    ),
    stat(
        "Hold p50, worst segment",
        "The highest median per-token hold of any selected "
        "segment; a few tenths of a millisecond is the floor of two listeners.",
        "s",
        f"max({quantile(0.5, HOLD, 'segment', SEG)})",
    ),
    stat(
        "Tokens paired per second",
        "Tokens seen at both ends of a segment and matched by "
        "content offset; zero means no stream was seen at two listeners.",
        "short",
        f"sum(rate({HOLD}_count{{{SEG}}}[{RI}]))",
    ),
    Panel(
        "Per-token hold by segment",
        "How long each segment (outer>inner hop) held each "
        "token: t_outer - t_inner, matched by content offset.",
        "s",
        p50_p99(HOLD, "segment", SEG),
    ),
    heatmap(
        "Per-token hold, distribution",
        "Per-token holds of the selected segments over time; a band at seconds is a buffering hop.",
        HOLD,
        SEG,
    ),
    Panel(
        "Each hop's own hold per token",
        "How long a hop's own process held each token: from reading it to handing it to the "
        "client's socket. A tenth of a millisecond is mitmproxy and hopmeter at work; "
        "milliseconds and up are a busy or starved proxy (proxy_hold).",
        "s",
        p50_p99(OWN_HOLD),
    ),
    Panel(
        "Client wait per flow by hop",
        "How long each flow's bytes waited on the client to take them (its reads, its receive "
        "buffer, its HTTP/2 window). High here with a low own hold: the client set the pace, "
        "not the path.",
        "s",
        p50_p99(CLIENT_WAIT),
    ),
    Panel(
        "Slow clients and proxy holds by hop",
        "Flows per interval where the client set the pace (slow_client) or the hop's own "
        "process held bytes (proxy_hold).",
        "short",
        [
            Target(
                f"sum by (kind, hop) (increase({FINDINGS}{{{DELIVERY_KINDS}, {SEL_HA}}}[{RI}]))",
                "{{kind}} at {{hop}}",
            )
        ],
    ),
    Panel(
        "Added to the first token by segment",
        "What each segment added to the time to first token (request delay + first-token hold, "
        "p50 and p99), and the request's way in alone.",
        "s",
        [
            *p50_p99(ADDED_TTFT, "segment", SEG),
            Target(quantile(0.5, REQUEST_DELAY, "segment", SEG), "{{segment}} request p50"),
        ],
    ),
    Panel(
        "Pairing by trace or by content",
        "Flows paired across listeners by trace id or by reply content (a hop dropped the "
        "trace context), and flows left unpaired because several replies were alike; and "
        "requests whose traceparent was malformed (the client's trace replaced by one "
        "hopmeter started: they pair by content only).",
        "short",
        [
            Target(
                f"sum by (paired_by, match) (increase({PAIRINGS}[{RI}]))",
                "{{paired_by}} {{match}}",
            ),
            Target(
                "sum by (hop) "
                f'(increase(hopmeter_traceparent_malformed_total{{hop=~"$hop"}}[{RI}]))',
                "{{hop}} traceparent malformed",
            ),
        ],
    ),
    Panel(
        "Time to first painted token by hop",
        "From the page's fetch() to the first frame that painted reply text, per reply "
        "(--browser: the page's beacon, joined to the record of the hop it talked to). Against "
        "time to first token at that hop: the difference is the page's share.",
        "s",
        p50_p99(FIRST_PAINTED),
    ),
    Panel(
        "Paint lag per token (read -> screen)",
        "How long each token took from the page's body reader to the frame that painted it: a "
        "client that writes once per frame stays within a frame or two (8-17 ms); a smoothing "
        "buffer adds its delay; a re-render of the whole message or a reveal after the end "
        "shows as seconds.",
        "s",
        p50_p99(PAINT_LAG),
    ),
    Panel(
        "Time to first token, p99 by hop",
        "The same streams' first token at each hop: the "
        "difference between an outer and an inner hop is the path's share.",
        "s",
        [Target(quantile(0.99, TTFT), "{{hop}}")],
    ),
    Panel(
        "Inter-token latency by hop (holding)",
        "Behind a hop that holds, gaps collapse to "
        "near zero in bursts: compare the p50 at each hop.",
        "s",
        p50_p99(ITL),
    ),
    Panel(
        "Whole-body hold findings by hop",
        "Flows per interval where a hop held the whole body.",
        "short",
        [Target(f"sum by (hop) (increase({FINDINGS}{{{WHOLE_BODY}}}[{RI}]))", "{{hop}}")],
    ),
    Panel(
        "Holding findings by kind",
        "Findings that point at a hop holding tokens: whole-body "
        "holds, burst gaps, compression on a stream, headers that let proxies buffer.",
        "short",
        [
            Target(
                f"sum by (kind, hop) (increase({FINDINGS}{{{HOLDING_KINDS}, {SEL_HA}}}[{RI}]))",
                "{{kind}} at {{hop}}",
            )
        ],
    ),
    Panel(
        "Findings introduced by each segment",
        "Findings present at a segment's outer hop but not its inner one (and a batching "
        "segment's tell), from the live pairing or a join service: the segment caused them.",
        "short",
        [
            Target(
                f"sum by (kind, segment) (increase({SEGMENT_FINDINGS}{{{SEG}}}[{RI}]))",
                "{{kind}} on {{segment}}",
            )
        ],
    ),
    Panel(
        "Durations below zero by what",
        "Holds, request delays, paint lags and own holds that came out below zero per second: "
        "never observed into their histograms (they would hide), counted here. Across hosts, "
        "clocks that stepped against each other (clock_skew_suspect); on one clock, an "
        "alignment that did not hold (alignment_suspect). 0 when there are none.",
        "short",
        [
            Target(
                f"sum by (what) (rate(hopmeter_negative_durations_total[{RI}])) or vector(0)",
                "{{what}}",
            )
        ],
    ),
]

NOT_COMPLETE = f'{SEL}, ended!="complete"'

STREAM_HEALTH = [
    stat(
        "Streams active",
        "Responses being streamed through hopmeter right now (all hops).",
        "none",
        "sum(hopmeter_streams_active)",
    ),
    stat(
        "Streams not complete",
        "Share of finished flows that ended any way but complete "
        "(upstream reset, client gone, error, shutdown).",
        "percentunit",
        f"(sum(rate({FLOWS}{{{NOT_COMPLETE}}}[{RI}])) or vector(0)) / "
        f"sum(rate({FLOWS}{{{SEL}}}[{RI}]))",
    ),
    stat(
        "Framing overhead",
        "Wire bytes received per byte of visible text: the price of "
        "per-token events (the seed article measured 35x for OpenAI chat).",
        "none",
        f'sum(rate({BYTES}{{{SEL_HA}, direction="in"}}[{RI}])) / '
        f'sum(rate({BYTES}{{{SEL_HA}, direction="in", part="payload"}}[{RI}]))',
    ),
    stat(
        "Internal errors in range",
        "Errors inside hopmeter's measuring code; traffic was "
        "forwarded unchanged, but those flows were not measured.",
        "short",
        "sum(increase(hopmeter_internal_errors_total[$__range])) or vector(0)",
    ),
    Panel(
        "Findings by kind",
        "Detector findings per interval, by kind (docs/design.md §7).",
        "short",
        [Target(f"sum by (kind) (increase({FINDINGS}{{{SEL_HA}}}[{RI}]))", "{{kind}}")],
    ),
    Panel(
        "Stalls per second by hop",
        "Gaps between tokens at or above the stall threshold.",
        "short",
        [Target(f"sum by (hop) (rate(hopmeter_stalls_total{{{SEL}}}[{RI}]))", "{{hop}}")],
    ),
    Panel(
        "Largest gap per stream by hop",
        "Each stream's single largest gap between tokens; "
        "percentiles of a per-token distribution smooth a lone stall away, this does not.",
        "s",
        p50_p99("hopmeter_max_gap_seconds"),
    ),
    Panel(
        "Truncated streams by hop",
        "Streams without their terminal event, reset, or with an error event inside a 200.",
        "short",
        [
            Target(
                f'sum by (hop) (increase({FINDINGS}{{kind="truncated", {SEL_HA}}}[{RI}]))',
                "{{hop}}",
            )
        ],
    ),
    Panel(
        "Streams by ending",
        "Finished flows per second by how they ended.",
        "reqps",
        [Target(f"sum by (ended) (rate({FLOWS}{{{SEL}}}[{RI}]))", "{{ended}}")],
    ),
    Panel(
        "Streams by status class",
        "Finished flows per second by HTTP status class.",
        "reqps",
        [Target(f"sum by (status_class) (rate({FLOWS}{{{SEL}}}[{RI}]))", "{{status_class}}")],
    ),
    Panel(
        "Framing overhead by hop and API",
        "Wire bytes per byte of visible text.",
        "none",
        [
            Target(
                f'sum by (hop, api) (rate({BYTES}{{{SEL_HA}, direction="in"}}[{RI}])) / '
                f'sum by (hop, api) (rate({BYTES}{{{SEL_HA}, direction="in", '
                f'part="payload"}}[{RI}]))',
                "{{hop}} {{api}}",
            )
        ],
    ),
    Panel(
        "Egress bytes by hop",
        "Bytes per second sent to clients, split into visible text "
        "(payload) and everything else (framing).",
        "Bps",
        [
            Target(
                f'sum by (hop, part) (rate({BYTES}{{{SEL_HA}, direction="out"}}[{RI}]))',
                "{{hop}} {{part}}",
            )
        ],
    ),
    Panel(
        "Client findings by kind",
        "What pages did to streams that reached them intact (--browser, from each page's "
        "beacon): a decoder per chunk, missed events, a re-render per token, a write per token, "
        "a reveal after the end, a smoothing buffer (info).",
        "short",
        [
            Target(
                f'sum by (kind, hop) (increase({FINDINGS}{{kind=~"client_.*", {SEL_HA}}}[{RI}]))',
                "{{kind}} at {{hop}}",
            )
        ],
    ),
    Panel(
        "Browser beacons by outcome",
        "Beacons per second: joined to their record, refused (malformed, too large, another "
        "origin, an unknown trace, a flood) or missing (a record waited 15 s in vain).",
        "short",
        [Target(f"sum by (outcome) (rate(hopmeter_beacons_total[{RI}]))", "{{outcome}}")],
    ),
    Panel(
        "Internal errors by site",
        "Errors inside hopmeter's measuring code per second, by "
        "where they were caught (0 when there are none).",
        "short",
        [
            Target(
                f"sum by (where) (rate(hopmeter_internal_errors_total[{RI}])) or vector(0)",
                "{{where}}",
            )
        ],
    ),
    Panel(
        "Output lines lost by output and reason",
        "Lines hopmeter could not write, per second: records, the console's JSON lines, log "
        "lines. queue_full: the reader of that output (a log agent, a pipe, a disk) is slower "
        "than the traffic and its queue filled; enospc / edquot: the disk is full (written "
        "again once it has room); epipe: its reader is gone; shutdown: still queued at exit. "
        "Streams are never held for an output (0 when nothing is lost).",
        "short",
        [
            Target(
                f"sum by (output, reason) (rate(hopmeter_output_lost_lines_total[{RI}])) "
                f"or vector(0)",
                "{{output}} {{reason}}",
            )
        ],
    ),
    Panel(
        "Output lines written by output",
        "Lines per second each output wrote: records, the console's JSON lines, log lines; "
        "beside the lost ones above, the share an output keeps up with.",
        "short",
        [
            Target(
                f"sum by (output) (rate(hopmeter_output_written_lines_total[{RI}]))",
                "{{output}}",
            )
        ],
    ),
    Panel(
        "Output queues: bytes waiting",
        "Bytes of lines each output holds now, waiting for its writer (bounded per output by "
        "hopmeter_output_queue, 8 MiB by default). Near the bound, lines are being dropped.",
        "bytes",
        [Target("sum by (output) (hopmeter_output_queued_bytes)", "{{output}}")],
    ),
    Panel(
        "Events and tokens per second by hop",
        "Events dispatched (role preludes, pings and [DONE] included) against the tokens they "
        "carried. Many events per token is framing overhead; far fewer is coalescing.",
        "short",
        [
            Target(f"sum by (hop) (rate(hopmeter_events_total{{{SEL}}}[{RI}]))", "{{hop}} events"),
            Target(f"sum by (hop) (rate(hopmeter_tokens_total{{{SEL}}}[{RI}]))", "{{hop}} tokens"),
        ],
    ),
    Panel(
        "Streams active",
        "Responses being streamed right now.",
        "none",
        [Target("sum(hopmeter_streams_active)", "active")],
    ),
    Panel(
        "Tokens by count source",
        "Tokens per second by how they were counted: from the "
        "stream itself, a usage total, a tokenizer, or an estimate.",
        "short",
        [Target(f"sum by (source) (rate(hopmeter_tokens_total{{{SEL}}}[{RI}]))", "{{source}}")],
    ),
    Panel(
        "Malformed events by hop and API",
        "Event payloads per second that hopmeter could not read as their API's format: counted "
        "and skipped, never fatal. A steady rate points at a format change hopmeter does not "
        "know yet or a hop that rewrites events; the bytes were forwarded unchanged.",
        "short",
        [
            Target(
                f"sum by (hop, api) (rate(hopmeter_malformed_events_total{{{SEL_HA}}}[{RI}]))",
                "{{hop}} {{api}}",
            )
        ],
    ),
    Panel(
        "Kept bodies clipped",
        "Streamed bodies per second whose copy for mitmproxy (-w, export, mitmweb) was cut at "
        "a bound: flow_cap (longer than hopmeter_keep_body) or total_cap (the open streams' "
        "copies reached hopmeter_keep_body_total). The clients got every byte.",
        "short",
        [
            Target(
                f'sum by (hop, reason) (rate(hopmeter_bodies_clipped_total{{hop=~"$hop"}}[{RI}]))',
                "{{hop}} {{reason}}",
            )
        ],
    ),
    Panel(
        "Measured in part",
        "What of the streams their records do not list, per second: events past the "
        "timeline's cap (their tokens still counted), chunks past the chunk list's cap, events "
        "too large to read (their bytes still forwarded), error events past the five a record "
        "keeps, bodies timed but not decoded. Each record says its own counts.",
        "short",
        [
            Target(
                f'sum by (hop, what) (rate(hopmeter_measure_dropped_total{{hop=~"$hop"}}[{RI}]))',
                "{{hop}} {{what}}",
            )
        ],
    ),
    Panel(
        "Read in part",
        "Bytes per second forwarded unread: a chunk to decode gave more events than its read "
        "budget (a compression bomb: millions of tiny events from a few kilobytes), and the "
        "rest of its flow went unread so that the loop every stream shares was not held. The "
        "clients got every byte; the record says stream.unread_bytes.",
        "bytes",
        [
            Target(
                f'sum by (hop) (rate(hopmeter_measure_unread_bytes_total{{hop=~"$hop"}}[{RI}]))',
                "{{hop}}",
            )
        ],
    ),
    Panel(
        "Label sets collapsed",
        "Flows per second observed with model and route said as other: the metrics already "
        "held 128 sets of hop, api, model and route (clients choosing many models and routes); "
        "and names said as other on every series: hop, segment or error site names past the "
        "first 32 (limit) or not names (malformed). The flows are in every figure, under other.",
        "short",
        [
            Target(
                "sum by (hop, api) "
                f'(rate(hopmeter_label_sets_collapsed_total{{hop=~"$hop"}}[{RI}]))',
                "{{hop}} {{api}}",
            ),
            Target(
                f"sum by (label, why) (rate(hopmeter_label_values_folded_total[{RI}]))",
                "{{label}} names: {{why}}",
            ),
        ],
    ),
]


# --- assembling -------------------------------------------------------------------------------
def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "includeAll": False,
        "multi": False,
        "options": [],
    }


def query_variable(name: str, label: str, metric: str, matchers: str = "") -> dict[str, Any]:
    """A multi-value label_values variable with "All" meaning any value (.*)."""
    selector = f"{metric}{{{matchers}}}" if matchers else metric
    query = f"label_values({selector}, {name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor"},
        "refresh": 2,  # on time range change (template-on-time-change-reload-rule)
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "sort": 1,
        "regex": "",
        "hide": 0,
    }


def flow_variables() -> list[dict[str, Any]]:
    return [
        query_variable("hop", "Hop", FLOWS),
        query_variable("api", "API", FLOWS, 'hop=~"$hop"'),
        query_variable("model", "Model", FLOWS, 'hop=~"$hop", api=~"$api"'),
    ]


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DS,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": [t.json(chr(ord("A") + i)) for i, t in enumerate(panel.targets)],
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": panel.options,
    }
    if panel.kind == "timeseries":
        out["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
        }
        out["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    return out


def dashboard(
    uid: str, title: str, description: str, panels: list[Panel], variables: list[dict[str, Any]]
) -> dict[str, Any]:
    laid: list[dict[str, Any]] = []
    x = y = row_height = 0
    for i, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        laid.append(panel_json(panel, i, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return {
        "id": None,
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["hopmeter", "llm", "streaming"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "links": [
            {
                "title": "hopmeter dashboards",
                "type": "dashboards",
                "tags": ["hopmeter"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "annotations": {"list": []},
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": laid,
    }


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON."""
    segment = query_variable("segment", "Segment", f"{HOLD}_count")
    return {
        "hopmeter-overview.json": dashboard(
            "hopmeter-overview",
            "hopmeter / Overview",
            "First byte, first token and inter-token latency at every hop.",
            OVERVIEW,
            flow_variables(),
        ),
        "hopmeter-hops.json": dashboard(
            "hopmeter-hops",
            "hopmeter / Hops",
            "How long each segment between two listeners holds each token, each hop's own hold, "
            "and how long clients kept the bytes waiting.",
            HOPS,
            [segment, *flow_variables()],
        ),
        "hopmeter-stream-health.json": dashboard(
            "hopmeter-stream-health",
            "hopmeter / Stream health",
            "Findings, stalls, truncations, framing overhead, egress and hopmeter's own health.",
            STREAM_HEALTH,
            flow_variables(),
        ),
    }


def render(board: dict[str, Any]) -> str:
    """The file's exact text (stable: tests compare it byte for byte)."""
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Write the dashboards; with --check, only report whether the files are up to date."""
    stale = []
    for name, board in dashboards().items():
        path = HERE / name
        text = render(board)
        if "--check" in argv:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
