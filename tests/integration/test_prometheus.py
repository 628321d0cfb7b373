"""Every dashboard query against a real Prometheus scraping a real hopmeter, on loopback.

    client -> hopmeter "edge" -> nginx (deploy/nginx/streaming.conf) -> hopmeter "origin"
           -> hopmeter upstream (demo)

One `hopmeter run` holds both listeners and serves /metrics; Prometheus scrapes it every second
with the shipped recording and alert rules loaded; demo traffic (plain, coalesced, stalled, cut,
buffered, Anthropic and Ollama streams) goes through the edge (`--browser`), with two pages that
send their beacon; then each panel query of each dashboard, with its variables set to "All", must
return data.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.beacons import ANNOUNCE, PAGE_ORIGIN, beacon, painted, reads_of, traceparent
from tests.harness.nginx import NginxConfig, NginxServer
from tests.harness.procs import free_port, hopmeter, port_open, wait_for
from tests.test_dashboards import FILES, concrete, load, panels, variable_selectors

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules"
SCRAPE_INTERVAL = "1s"
# Panel queries are evaluated right after the traffic: a one-minute window holds all of it.
WINDOWS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "5m"}

# Requests sent through the edge: (path and scenario query, body). Each plays one case the
# dashboards show: plain and coalesced streams, a stall, a cut connection, a whole body at the
# end, and two other APIs.
CHAT = {"model": "demo-1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
TRAFFIC: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions?coalesce=3", CHAT),
    ("/v1/chat/completions?stall_at=10&stall_s=0.7", CHAT),
    ("/v1/chat/completions?cut_at=10", CHAT),
    ("/v1/chat/completions?buffered=1", CHAT),
    ("/v1/chat/completions?emoji=1", {**CHAT, "model": "gpt-4o-mini"}),
    ("/v1/messages", {**CHAT, "model": "claude-sonnet-4-5", "max_tokens": 64}),
    ("/api/chat", {**CHAT, "model": "llama3.2"}),
]
ROUNDS = 3


def streaming_location() -> NginxConfig:
    """nginx configured with the shipped streaming snippet, not a test-only copy."""
    snippet = (ROOT / "deploy" / "nginx" / "streaming.conf").read_text()
    return NginxConfig(name="deploy-streaming", effect="the shipped snippet", location=snippet)


class Prometheus:
    """A Prometheus server on loopback with its data in a temporary folder."""

    def __init__(self, tmp: Path, target_port: int) -> None:
        self.tmp = tmp
        self.port = free_port()
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(p) for p in sorted(RULES.glob("*.yml"))],
            "scrape_configs": [
                {
                    "job_name": "hopmeter",
                    "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                }
            ],
        }
        self.config = tmp / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: .ci/run installs it (Debian prometheus)")
        self.log = (tmp / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        """What Prometheus logged so far."""
        self.log.flush()
        return (self.tmp / "prometheus.log").read_text(errors="replace")

    def wait_ready(self) -> None:
        """Poll /-/ready until Prometheus serves queries, failing early if it exits."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.output()}")
            if not port_open(self.port):
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_for(ready, 30, "prometheus to be ready")

    @property
    def url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        """GET an API path; the `data` of a successful answer."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            doc = json.load(response)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (a scalar becomes one unlabelled sample)."""
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def flows(self) -> float:
        """Finished flows scraped so far, all hops together."""
        return sum(finite(self.query("sum(hopmeter_flows_total)")))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def finite(result: list[dict[str, Any]]) -> list[float]:
    """The finite sample values of a query result."""
    values = [float(sample["value"][1]) for sample in result]
    return [v for v in values if math.isfinite(v)]


def panel_queries(include_hold: bool) -> list[tuple[str, str, str]]:
    """(dashboard, panel, PromQL) for each target, variables as "All" and windows as above."""
    out = []
    for path in FILES:
        for panel in panels(load(path)):
            for target in panel["targets"]:
                expr = target["expr"]
                for name, value in WINDOWS.items():
                    expr = expr.replace(name, value)
                if ("hopmeter_hold_seconds" in expr) == include_hold:
                    out.append((path.stem, panel["title"], concrete(expr)))
    return out


def page(edge_port: int) -> None:
    """A page running hopmeter's snippet: a streamed reply announcing its beacon, then the
    beacon with the reads and the frames that painted them (the paint panels' data)."""
    tp = traceparent()
    headers = {"traceparent": tp, "origin": PAGE_ORIGIN, "tracestate": ANNOUNCE}
    url = f"http://127.0.0.1:{edge_port}"
    reply = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers, timeout=30)
    reads = reads_of(reply.content)
    doc = beacon(tp, reads=reads, screen=painted(reads))
    chars = sum(reads["chars"])
    doc["stream"] = {"bytes": len(reply.content), "chars": chars, "shown": chars, "fffd": 0}
    answer = httpx.post(
        f"{url}/_hopmeter/beacon",
        content=json.dumps(doc),
        headers={"content-type": "text/plain;charset=UTF-8", "origin": PAGE_ORIGIN},
        timeout=10,
    )
    assert answer.status_code == 204, answer.text


def send(edge_port: int, path: str, body: dict[str, Any]) -> None:
    """One streamed request through the edge, read to its end (a cut stream raises; ignored)."""
    try:
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", f"http://127.0.0.1:{edge_port}{path}", json=body) as response,
        ):
            for _ in response.iter_raw():
                pass
    except httpx.HTTPError:
        pass  # the cut_at scenario resets the connection on purpose


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Upstream, nginx, hopmeter with two listeners, Prometheus; traffic sent and scraped."""
    tmp = tmp_path_factory.mktemp("prometheus-stack")
    upstream_port, edge_port, origin_port, metrics_port = (free_port() for _ in range(4))
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{upstream_port}",
                 name="upstream", ports=(upstream_port,)),
        NginxServer(origin_port, streaming_location(), prefix=tmp) as nginx,
        hopmeter(
            tmp, "run",
            "--listener", f"edge=reverse:http://127.0.0.1:{nginx.port}@127.0.0.1:{edge_port}",
            "--listener",
            f"origin=reverse:http://127.0.0.1:{upstream_port}@127.0.0.1:{origin_port}",
            "--metrics", f"127.0.0.1:{metrics_port}", "--quiet", "--browser",
            name="proxy", ports=(edge_port, origin_port, metrics_port),
        ),
    ):  # fmt: skip
        prometheus = Prometheus(tmp, metrics_port)
        try:
            prometheus.wait_ready()
            wait_for(
                lambda: prometheus.query('up{job="hopmeter"} == 1'), 30, "a first hopmeter scrape"
            )
            requests = TRAFFIC * ROUNDS
            page(edge_port)  # a rate needs two samples of a series: a page before and after
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda r: send(edge_port, *r), requests))
            page(edge_port)
            joined = 'hopmeter_beacons_total{outcome="joined"} >= 2'
            wait_for(lambda: prometheus.query(joined), 30, "both pages' beacons scraped")
            # every request is a flow at the edge and one at the origin
            wanted = 2 * len(requests)
            wait_for(lambda: prometheus.flows() >= wanted, 30, f"{wanted} flows scraped")
            yield prometheus
        finally:
            prometheus.stop()


def test_every_panel_query_returns_data(stack: Prometheus) -> None:
    """Each panel query of each dashboard, variables at All, returns at least one finite value."""
    empty = []
    for board, title, expr in panel_queries(include_hold=False):
        if not finite(stack.query(expr)):
            empty.append(f"{board} / {title}: {expr}")
    assert empty == [], "queries without data:\n" + "\n".join(empty)


def test_hold_panel_queries_return_data(stack: Prometheus) -> None:
    """The hold panels (segment between edge and origin) return data."""
    empty = [
        f"{board} / {title}: {expr}"
        for board, title, expr in panel_queries(include_hold=True)
        if not finite(stack.query(expr))
    ]
    assert empty == [], "queries without data:\n" + "\n".join(empty)


def test_variable_queries_find_the_hops(stack: Prometheus) -> None:
    """The hop, api and model variables list what the traffic produced."""
    values = {}
    for _, name, selector in variable_selectors():
        series = stack.api("/api/v1/series", **{"match[]": selector})
        values[name] = {s.get(name) for s in series} - {None}
    assert {"edge", "origin"} <= values["hop"]
    assert {"openai.chat", "anthropic.messages", "ollama"} <= values["api"]
    assert {"demo", "gpt-4o-mini", "claude-sonnet-4", "llama"} <= values["model"]


def test_trace_ids_arrive_as_exemplars(stack: Prometheus) -> None:
    """Prometheus stores exemplars with trace ids on the first-token histogram."""
    now = time.time()
    data = stack.api(
        "/api/v1/query_exemplars",
        query="hopmeter_time_to_first_token_seconds_bucket",
        start=str(now - 300),
        end=str(now + 60),
    )
    trace_ids = {e["labels"].get("trace_id") for series in data for e in series["exemplars"]}
    assert trace_ids - {None}, data


def test_shipped_rules_evaluate_without_error(stack: Prometheus) -> None:
    """The recording and alert rules load into Prometheus and evaluate healthily."""

    def evaluated() -> list[dict[str, Any]] | None:
        groups = stack.api("/api/v1/rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        # a rule not yet evaluated reports the zero time, 0001-01-01
        done = rules and all(not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if done else None

    rules = wait_for(evaluated, 30, "every rule evaluated once")
    assert {r["health"] for r in rules} == {"ok"}, [r for r in rules if r["health"] != "ok"]
    recorded = {r["name"] for r in rules if r["type"] == "recording"}
    assert finite(stack.query("hop:hopmeter_time_to_first_token_seconds:p99_5m"))
    assert "hop:hopmeter_framing_overhead:ratio_rate5m" in recorded
