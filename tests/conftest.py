"""What tests share across files, each made at most once per session, by the first test that
asks: the LiteLLM gateways, and records from real runs for the report tests.

LiteLLM costs 13-60 s to start (tests/harness/litellm.py), so the session starts each config
once, in front of one `hopmeter upstream`: as shipped (`litellm_gateway`), and forwarding
traceparent (`litellm_traced_gateway`, gateway pairing only). The records (`demo_path`,
`held_path`, `streaming_path`) take a real proxy run each (~5 s); the report's unit tests and its
render in Chromium read the same files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import litellm, tier
from tests.harness.litellm import Gateway, LiteLLM, Route, via_routes
from tests.harness.nginx import available
from tests.harness.procs import free_port, hopmeter
from tests.report.records import EMOJI_CRLF, HELD, STALLED, demo_records, two_hop_records

pytest_plugins = ["pytester"]  # tests/harness/test_tier.py runs small test files in this process


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--fast`: the fast tier (tests/harness/tier.py)."""
    parser.addoption(
        "--fast",
        action="store_true",
        help="run only the tests that start no process and open no socket, and fail any that do",
    )


def pytest_configure(config: pytest.Config) -> None:
    """With `--fast`, leave out the tests marked integration or loopback and guard the rest."""
    if config.getoption("fast"):
        config.pluginmanager.register(tier.FastTier(), "hopmeter-fast-tier")


@pytest.fixture(scope="session")
def litellm_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A LiteLLM proxy, started once per session, ready and warm, in front of the demo upstream."""
    reason = litellm.skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("litellm")
    up, via = free_port(), free_port()
    base = f"http://127.0.0.1:{up}/v1"
    routes = [Route("demo", base), Route("demo-fwd", base, forward_headers=True), *via_routes(via)]
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        LiteLLM(tmp, routes) as gateway,
    ):
        yield Gateway(gateway, up, via)


@pytest.fixture(scope="session")
def litellm_traced_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A second LiteLLM, started once per session by the first test that asks, that forwards
    the client's traceparent (its otel callback and forward_traceparent_to_llm_provider)."""
    reason = litellm.skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("litellm-traced")
    up, via = free_port(), free_port()
    routes = [Route("demo", f"http://127.0.0.1:{up}/v1"), *via_routes(via, forward_headers=True)]
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        LiteLLM(tmp, routes, forward_traceparent=True, name="litellm-traced") as gateway,
    ):
        yield Gateway(gateway, up, via)


@pytest.fixture(scope="session")
def demo_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`hopmeter demo` records: seven single-hop flows, clean, stalled, gzip, not streamed..."""
    return demo_records(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="session")
def held_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hops around an nginx that gzips and buffers: a held reply and a stalled one."""
    if not available():
        pytest.skip("nginx is not installed")
    return two_hop_records(tmp_path_factory.mktemp("held"), "gzip_hold", (HELD, STALLED))


@pytest.fixture(scope="session")
def streaming_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hops around a streaming nginx: a clean reply and one with emoji and CRLF."""
    if not available():
        pytest.skip("nginx is not installed")
    return two_hop_records(tmp_path_factory.mktemp("streaming"), "streaming", (HELD, EMOJI_CRLF))
