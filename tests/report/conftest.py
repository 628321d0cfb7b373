"""Records from real runs, made once per test session for the report tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.nginx import available
from tests.report.records import EMOJI_CRLF, HELD, STALLED, demo_records, two_hop_records


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
