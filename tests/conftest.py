"""What tests share across files: one LiteLLM gateway per session.

LiteLLM costs 13-60 s to start (tests/harness/litellm.py), so the session starts it once, the
first time a test asks for it, in front of one `hopmeter upstream`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import litellm
from tests.harness.litellm import Gateway, LiteLLM, Route
from tests.harness.procs import free_port, hopmeter


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
