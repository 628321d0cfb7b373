"""A real LiteLLM proxy (a model-routing LLM gateway) on loopback, for gateway tests.

    routes = [Route("demo", f"http://127.0.0.1:{up}/v1"),
              Route("demo-fwd", f"http://127.0.0.1:{up}/v1", forward_headers=True)]
    with LiteLLM(tmp_path, routes) as gateway:      # started, ready and warmed up
        httpx.post(gateway.chat_url, headers=gateway.headers(), json={"model": "demo", ...})

LiteLLM 1.108.7 runs from its own venv (`.venv-litellm`, made by scripts/setup-litellm from a
hash-pinned lock; HOPMETER_LITELLM_VENV points elsewhere), never from the test venv: it pins its
own versions of half of PyPI. `skip_reason()` says why a test cannot run without it; CI sets it
up. What it does to a stream, measured (the research that chose this version): it re-frames every
SSE event (compact JSON, its own `created`, `model` renamed, null fields dropped, CRLF to LF) but
keeps the text byte for byte; one upstream event gives one chunk out; it sends its response
headers only with the first event; it renames every upstream response header `llm_provider-…`
and forwards no client `x-*` header (nor `traceparent`) unless told to.

Starting it costs 13-60 s (importing its proxy server alone takes ~12 s), so tests share one per
session: the `litellm_gateway` fixture in tests/conftest.py. It needs a master key (it refuses to
start without one, and refuses the well-known sk-1234), reads its cost map from the wheel
(LITELLM_LOCAL_MODEL_COST_MAP: no outbound connection), and its first request after start is slow
and bursty (~0.7 s on the request path, then a burst): `start()` sends warm-up requests before it
returns, so no test measures the cold path by accident.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx
import orjson

from tests.harness.procs import Proc, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HOPMETER_LITELLM_VENV") or ROOT / ".venv-litellm")
VERSION = "1.108.7"
START_TIMEOUT_S = 150.0  # cold start 13-18 s idle, up to 61 s measured on a loaded 2-core box
WARM_UP_REQUESTS = 2  # the first request after start is slow and bursty; the second is warm


def skip_reason() -> str | None:
    """Why LiteLLM tests cannot run here, or None when they can."""
    if not (VENV / "bin" / "litellm").exists():
        return f"LiteLLM is not installed in {VENV}: run scripts/setup-litellm"
    return None


@dataclass(frozen=True, slots=True)
class Route:
    """One model name the gateway serves, and the OpenAI-compatible upstream it goes to."""

    name: str  # what clients ask for (`model` in the request; listed by /v1/models)
    api_base: str  # the upstream's base URL, e.g. http://127.0.0.1:9000/v1
    upstream_model: str = "demo-1"  # the name the upstream is asked for
    forward_headers: bool = False  # pass the client's x-* headers (X-Hopmeter-Scenario) upstream
    # an X-Hopmeter-Scenario the gateway itself adds to every request of this route (its
    # `extra_headers`), so a route plays a reply of its own while client headers stay dropped
    scenario: str = ""
    warm: bool = True  # warmed up at start (False: its upstream is not up yet then)


# Routes through a port where the gateway tests put an origin listener of their own, each playing
# one reply the upstream behind it replays (tests/integration/test_gateway_pairing.py).
VIA_REPLIES = {
    "reply-a": "replay=alpha;rate=40",
    "reply-b": "replay=bravo;rate=40",
    "reply-c": "replay=charlie;rate=40",
}


def via_routes(port: int, *, forward_headers: bool = False) -> list[Route]:
    """The VIA_REPLIES routes, to an origin listener on 127.0.0.1:`port` (not warmed at start).

    With the otel callback forwarding traceparent, LiteLLM 1.108.7 replaces the route's own
    `extra_headers` with the traceparent it adds: such a gateway needs `forward_headers` and the
    client's X-Hopmeter-Scenario instead (measured: every route then played the default reply).
    """
    base = f"http://127.0.0.1:{port}/v1"
    return [
        Route(name, base, scenario=sc, warm=False, forward_headers=forward_headers)
        for name, sc in VIA_REPLIES.items()
    ]


def config(routes: Sequence[Route], *, forward_traceparent: bool = False) -> dict[str, object]:
    """LiteLLM's proxy config for `routes` (JSON, which is YAML too).

    `forward_traceparent` passes the client's W3C traceparent upstream, unchanged: LiteLLM does so
    only with its "otel" callback loaded as well (spans kept in memory, OTEL_EXPORTER=in_memory).
    """
    settings: dict[str, object] = {}
    forwarding = [r.name for r in routes if r.forward_headers]
    if forwarding:
        settings["model_group_settings"] = {"forward_client_headers_to_llm_api": forwarding}
    if forward_traceparent:
        settings.update(callbacks=["otel"], forward_traceparent_to_llm_provider=True)
    doc: dict[str, object] = {"model_list": [_model(r) for r in routes]}
    if settings:
        doc["litellm_settings"] = settings
    return doc


def _model(r: Route) -> dict[str, object]:
    params: dict[str, object] = {
        "model": f"openai/{r.upstream_model}",
        "api_base": r.api_base,
        "api_key": "sk-upstream-unused",
    }
    if r.scenario:
        params["extra_headers"] = {"X-Hopmeter-Scenario": r.scenario}
    return {"model_name": r.name, "litellm_params": params}


class LiteLLM:
    """The LiteLLM proxy on 127.0.0.1, from its own venv; a context manager."""

    def __init__(
        self,
        tmp: Path,
        routes: Sequence[Route],
        *,
        forward_traceparent: bool = False,
        name: str = "litellm",
    ) -> None:
        if not routes:
            raise ValueError("LiteLLM needs at least one route")
        self.routes = list(routes)
        self.port = free_port()
        self.key = "sk-" + secrets.token_hex(24)  # a master key is mandatory
        self.config_path = tmp / f"{name}.yaml"
        self.config_path.write_bytes(
            orjson.dumps(config(routes, forward_traceparent=forward_traceparent))
        )
        self.log = tmp / f"{name}.log"
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        """The gateway's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def chat_url(self) -> str:
        """Where clients send OpenAI chat completions."""
        return f"{self.url}/v1/chat/completions"

    def headers(self) -> dict[str, str]:
        """What every client request carries: the master key."""
        return {"authorization": f"Bearer {self.key}"}

    def start(self) -> Self:
        """Start the gateway, wait until it is live, and warm every route up."""
        env = {
            "LITELLM_MASTER_KEY": self.key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map at start
            "NO_COLOR": "1",
            "OTEL_EXPORTER": "in_memory",  # the otel callback, when loaded, keeps spans in memory
        }
        argv = [str(VENV / "bin" / "litellm"), "--config", str(self.config_path)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = Proc(argv, self.log, env)
        try:
            wait_for(self._live, START_TIMEOUT_S, f"LiteLLM live on {self.port}")
            self.warm_up()
        except BaseException:
            self.stop()
            raise
        return self

    def _live(self) -> bool:
        assert self.proc is not None
        if self.proc.popen.poll() is not None:
            raise AssertionError(f"LiteLLM exited {self.proc.popen.returncode}:\n{self.output()}")
        try:
            return httpx.get(f"{self.url}/health/liveliness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def warm_up(self, requests: int = WARM_UP_REQUESTS, *, every: bool = False) -> None:
        """Stream a short reply through every route to warm (`every`: all of them), `requests`
        times each."""
        for _ in range(requests):
            for route in self.routes:
                if not (route.warm or every):
                    continue
                body = {
                    "model": route.name,
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                with httpx.stream(
                    "POST", self.chat_url, json=body, headers=self.headers(), timeout=60
                ) as r:
                    r.read()
                    assert r.status_code == 200, (
                        f"warm-up via {route.name}: {r.status_code} {r.text}"
                    )

    def output(self) -> str:
        """What the gateway logged so far."""
        return self.proc.output() if self.proc is not None else ""

    def stop(self) -> None:
        """Stop the gateway (SIGTERM; it exits within a second)."""
        if self.proc is not None:
            self.proc.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class Gateway:
    """The running gateway and the hopmeter upstream behind it.

    Routes: `demo` as LiteLLM ships (client x-* headers dropped: the upstream plays its default
    script) and `demo-fwd`, which forwards them (X-Hopmeter-Scenario reaches the upstream).
    """

    litellm: LiteLLM
    upstream_port: int
    via_port: int = 0  # where the VIA_REPLIES routes go: a test's origin listener

    @property
    def url(self) -> str:
        """The gateway's own base URL (the upstream an edge listener forwards to)."""
        return self.litellm.url

    @property
    def upstream_url(self) -> str:
        """The hopmeter upstream's own address (its send log is at /_hopmeter/sends/ID)."""
        return f"http://127.0.0.1:{self.upstream_port}"
