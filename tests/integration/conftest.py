"""What integration tests share across files: one LiteLLM gateway per session.

LiteLLM costs 13-60 s to start (tests/harness/litellm.py), so the session starts it once, the
first time a test asks for it, in front of one `hopmeter upstream`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.harness import litellm
from tests.harness.litellm import LiteLLM, Route
from tests.harness.procs import free_port, hopmeter


@dataclass(frozen=True, slots=True)
class Gateway:
    """The running gateway and the hopmeter upstream behind it.

    Routes: `demo` as LiteLLM ships (client x-* headers dropped: the upstream plays its default
    script) and `demo-fwd`, which forwards them (X-Hopmeter-Scenario reaches the upstream).
    """

    litellm: LiteLLM
    upstream_port: int

    @property
    def upstream_url(self) -> str:
        """The hopmeter upstream's own address (its send log is at /_hopmeter/sends/ID)."""
        return f"http://127.0.0.1:{self.upstream_port}"


@pytest.fixture(scope="session")
def litellm_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A LiteLLM proxy, started once per session, ready and warm, in front of the demo upstream."""
    reason = litellm.skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("litellm")
    up = free_port()
    base = f"http://127.0.0.1:{up}/v1"
    routes = [Route("demo", base), Route("demo-fwd", base, forward_headers=True)]
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        LiteLLM(tmp, routes) as gateway,
    ):
        yield Gateway(gateway, up)
