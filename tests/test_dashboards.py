"""Structural checks of the Grafana dashboards, with a few grafana/dashboard-linter rules redone.

The linter itself is a Go program; the rules below re-implement the published ones this project
relies on (rule names as the linter spells them), and promtool parses every query.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from hopmeter.export.prometheus import Metrics, exported_names

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))
PANEL_TYPES_WITH_QUERIES = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
# grafana/dashboard-linter panel-units-rule's list (Grafana's valueFormats categories), the
# families a latency and traffic dashboard can use.
VALID_UNITS = {
    "none", "string", "short", "percent", "percentunit", "sci", "locale",
    "bytes", "decbytes", "bits", "decbits", "kbytes", "deckbytes", "mbytes", "decmbytes",
    "pps", "binBps", "Bps", "binbps", "bps", "KiBs", "KBs", "MiBs", "MBs",
    "hertz", "ns", "µs", "ms", "s", "m", "h", "d", "dtdurationms", "dtdurations", "dthms",
    "dtdhms", "timeticks", "clockms", "clocks",
    "cps", "ops", "reqps", "rps", "wps", "iops", "cpm", "opm", "rpm", "wpm",
}  # fmt: skip
# Concrete stand-ins for Grafana's variables, so a query can be run or parsed as PromQL.
SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "${datasource}": "prometheus",
    "$datasource": "prometheus",
}
VARIABLE_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def load(path: Path) -> dict[str, Any]:
    """One dashboard file as JSON."""
    board: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return board


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, nested ones (rows) included."""
    stack = list(board.get("panels", []))
    while stack:
        panel = stack.pop(0)
        yield panel
        stack.extend(panel.get("panels", []))


def concrete(expr: str) -> str:
    """The expression with Grafana's variables replaced by values PromQL accepts."""
    for name, value in SUBSTITUTIONS.items():
        expr = expr.replace(name, value)
    return VARIABLE_RE.sub(".*", expr)


def all_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, concrete PromQL) for every target of every panel."""
    return [
        (path.name, panel["title"], concrete(target["expr"]))
        for path in FILES
        for panel in panels(load(path))
        for target in panel.get("targets", [])
    ]


def variable_selectors() -> list[tuple[str, str, str]]:
    """(dashboard, variable, concrete series selector) of every label_values variable."""
    out = []
    for path in FILES:
        for var in load(path)["templating"]["list"]:
            if var["type"] == "query":
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
                assert match, f"{path.name}: variable {var['name']} query {query!r}"
                out.append((path.name, var["name"], concrete(match.group(1))))
    return out


# --- a small PromQL scanner: enough to find range selectors and counters in their context -------
TOKEN_RE = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'  # strings
    r"|[A-Za-z_:][A-Za-z0-9_:]*"  # identifiers
    r"|\[[^\]]*\]"  # range selectors (and subqueries)
    r"|[(){},]|[^\s]"
)


def scan(expr: str) -> Iterator[tuple[str, str | None, str]]:
    """Yield (token, enclosing function or None, previous token) outside label matchers."""
    calls: list[str | None] = []
    braces = 0
    previous = ""
    for token in TOKEN_RE.findall(expr):
        if token == "{":
            braces += 1
        elif token == "}":
            braces -= 1
        elif braces:
            continue
        elif token == "(":
            calls.append(previous if re.fullmatch(r"[A-Za-z_]\w*", previous) else None)
        elif token == ")":
            calls.pop()
        yield token, (calls[-1] if calls else None), previous
        previous = token


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects."""
    return {t for t, _, _ in scan(expr) if t.startswith("hopmeter_")}


def rate_interval_errors(expr: str) -> list[str]:
    """target-rate-interval-rule: a range inside rate()/irate() must be $__rate_interval."""
    return [
        f"{func}() over {token} instead of [$__rate_interval]"
        for token, func, _ in scan(expr)
        if token.startswith("[") and func in {"rate", "irate"} and token != "[$__rate_interval]"
    ]


def counter_agg_errors(expr: str) -> list[str]:
    """target-counter-agg-rule: a _total counter only inside rate()/irate()/increase() ranges."""
    tokens = list(scan(expr))
    errors = []
    for i, (token, _, _) in enumerate(tokens):
        if not (token.startswith("hopmeter_") and token.endswith("_total")):
            continue
        rest = [t for t in tokens[i + 1 :] if t[0] not in {"{", "}"}]
        if (
            not rest
            or not rest[0][0].startswith("[")
            or rest[0][1]
            not in {
                "rate",
                "irate",
                "increase",
            }
        ):
            errors.append(f"counter {token} is not inside rate(), irate() or increase()")
    return errors


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name hopmeter.export.prometheus can expose, read from a real registry."""
    return set(exported_names(Metrics(CollectorRegistry()).registry))


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool's path; fails (not skips) without it: .ci/run installs it."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: .ci/run installs it (Debian package prometheus)")
    return path


def test_the_committed_json_matches_the_builder() -> None:
    """dashboards/*.json are exactly what dashboards/build.py writes."""
    spec = importlib.util.spec_from_file_location("dashboard_build", DASHBOARDS / "build.py")
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # dataclasses look their module up while being defined
    try:
        spec.loader.exec_module(build)
    finally:
        del sys.modules[spec.name]
    assert sorted(build.dashboards()) == [p.name for p in FILES]
    for name, board in build.dashboards().items():
        text = (DASHBOARDS / name).read_text(encoding="utf-8")
        assert text == build.render(board), f"{name} is stale: run python dashboards/build.py"


def test_there_are_three_dashboards_with_unique_uids() -> None:
    """Overview, hops and stream health exist, each with its own uid and title."""
    boards = [load(p) for p in FILES]
    assert {b["uid"] for b in boards} == {
        "hopmeter-overview",
        "hopmeter-hops",
        "hopmeter-stream-health",
    }
    assert len({b["title"] for b in boards}) == len(boards)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_is_provisionable_json(path: Path) -> None:
    """Valid JSON without __inputs (provisioned, not imported), no fixed id, a schema version."""
    board = load(path)
    assert "__inputs" not in board
    assert board["id"] is None
    assert isinstance(board["schemaVersion"], int)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panel_ids_are_unique_and_panels_do_not_overlap(path: Path) -> None:
    """Each panel id appears once, and no two panels cover the same grid cell."""
    board = load(path)
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_template_datasource_rule(path: Path) -> None:
    """template-datasource-rule: one datasource variable named datasource, for prometheus."""
    variables = [v for v in load(path)["templating"]["list"] if v["type"] == "datasource"]
    assert len(variables) == 1
    (var,) = variables
    assert (var["name"], var["label"], var["query"]) == ("datasource", "Data source", "prometheus")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panel_datasource_rule(path: Path) -> None:
    """panel-datasource-rule: every panel, target and variable queries ${datasource}."""
    board = load(path)
    for panel in panels(board):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}", var["name"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_flow_variables_are_multi_value_with_all(path: Path) -> None:
    """hop, api and model are label_values variables, multi-value, with All meaning any."""
    variables = {v["name"]: v for v in load(path)["templating"]["list"]}
    for name in ("hop", "api", "model"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"], name
        assert var["allValue"] == ".*"
        assert var["query"]["query"].startswith("label_values(")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_template_on_time_change_reload_rule(path: Path) -> None:
    """template-on-time-change-reload: query variables refresh on time range change (2)."""
    for var in load(path)["templating"]["list"]:
        if var["type"] == "query":
            assert var["refresh"] == 2, var["name"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panel_units_rule(path: Path) -> None:
    """panel-units-rule: every panel has a valid unit (heatmaps on their y axis too)."""
    for panel in panels(load(path)):
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit in VALID_UNITS, f"{panel['title']}: unit {unit!r}"
        if panel["type"] == "heatmap":
            assert panel["options"]["yAxis"]["unit"] in VALID_UNITS, panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panel_title_description_rule(path: Path) -> None:
    """panel-title-description-rule: every panel has a title and a description."""
    for panel in panels(load(path)):
        assert panel.get("title") and panel.get("description"), panel.get("id")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_panel_no_targets_rule(path: Path) -> None:
    """panel-no-targets-rule: every panel has at least one target with an expression."""
    for panel in panels(load(path)):
        assert panel.get("targets"), panel["title"]
        assert all(t.get("expr") for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_target_rate_interval_rule(path: Path) -> None:
    """target-rate-interval-rule: every rate()/irate() range is $__rate_interval."""
    for panel in panels(load(path)):
        for target in panel["targets"]:
            assert rate_interval_errors(target["expr"]) == [], panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_target_counter_agg_rule(path: Path) -> None:
    """target-counter-agg-rule: counters appear only inside rate(), irate() or increase()."""
    for panel in panels(load(path)):
        for target in panel["targets"]:
            assert counter_agg_errors(target["expr"]) == [], panel["title"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_heatmaps_read_prometheus_buckets(path: Path) -> None:
    """Heatmap targets are bucket increases in heatmap format, not recalculated by Grafana."""
    for panel in panels(load(path)):
        if panel["type"] == "heatmap":
            assert panel["options"]["calculate"] is False
            for target in panel["targets"]:
                assert target["format"] == "heatmap" and "_bucket{" in target["expr"]
                assert target["legendFormat"] == "{{le}}"


def test_the_rule_scanner_catches_what_it_should() -> None:
    """The re-implemented rules flag a fixed rate window and a bare counter."""
    assert rate_interval_errors("rate(hopmeter_flows_total[5m])")
    assert not rate_interval_errors('increase(x{a="[1m]"}[$__range])')
    assert counter_agg_errors("sum(hopmeter_flows_total)")
    assert not counter_agg_errors('sum(increase(hopmeter_flows_total{k="("}[$__range]))')


def test_queries_use_only_exported_metrics(exported: set[str]) -> None:
    """Every metric a panel or variable selects is one hopmeter.export.prometheus exports."""
    queries = [q for _, _, q in all_queries()] + [s for _, _, s in variable_selectors()]
    used: set[str] = set()
    for expr in queries:
        names = metric_names(expr)
        assert names, f"no hopmeter metric in {expr}"
        assert names <= exported, f"{names - exported} not exported (in {expr})"
        used |= names
    # every family shows up somewhere (the dashboards cover the whole of docs/design.md §8)
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in used}
    missing = {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported} - families
    assert missing == set(), f"metrics on no dashboard: {missing}"


@pytest.mark.integration
def test_every_query_parses_as_a_recording_rule(tmp_path: Path, promtool: str) -> None:
    """promtool check rules accepts every panel query and variable selector, as recorded rules."""
    queries = all_queries() + variable_selectors()
    rules = [
        {"record": f"hopmeter_dashboard:query_{i}", "expr": expr}
        for i, (_, _, expr) in enumerate(queries)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_provisioning_points_grafana_at_the_dashboards() -> None:
    """The provisioning files are valid Grafana provisioning (apiVersion 1) for a file provider."""
    providers = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    sources = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources.yaml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
