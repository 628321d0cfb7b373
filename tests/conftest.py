"""What tests share across files: the LiteLLM gateways, each started at most once per session.

LiteLLM costs 13-60 s to start (tests/harness/litellm.py), so the session starts each config
once, the first time a test asks for it, in front of one `hopmeter upstream`: as shipped
(`litellm_gateway`), and forwarding traceparent (`litellm_traced_gateway`, gateway pairing only).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import litellm
from tests.harness.litellm import Gateway, LiteLLM, Route, via_routes
from tests.harness.procs import free_port, hopmeter


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
