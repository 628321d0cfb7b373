"""--workers N: several processes serve the same port; metrics and records stay correct."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
import pytest

from tests.procs import demo_path, free_port, read_records, wait_for

pytestmark = pytest.mark.integration
FLOWS = 24


def _flows(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hopmeter_flows_total{")
    )


def _two_free_ports() -> int:
    """A port p with p and p + 1 both free a moment ago (worker i serves metrics on p + i)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", p + 1)) != 0:
                try:
                    s2 = socket.socket()
                    s2.bind(("127.0.0.1", p + 1))
                    s2.close()
                    return p
                except OSError:
                    continue
    raise AssertionError("no two adjacent free ports")


def test_two_workers_share_the_port_and_every_flow_is_counted_once(tmp_path: Path) -> None:
    """Connections spread over both workers; each scrape target counts its own, records all."""
    metrics = _two_free_ports()
    with demo_path(
        tmp_path,
        "--workers",
        "2",
        "--metrics",
        f"127.0.0.1:{metrics}",
        "--quiet",
        ports=(metrics, metrics + 1),
    ) as path:
        proxy, records, port = path.proxy, path.records, path.port
        for _ in range(FLOWS):
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"stream": True},
                headers={"x-hopmeter-scenario": "tokens=5;rate=500", "connection": "close"},
            )
            assert r.status_code == 200
        recs = read_records(records, FLOWS)

        def counted() -> tuple[float, float] | None:
            pair = (_flows(metrics), _flows(metrics + 1))
            return pair if sum(pair) == FLOWS else None

        per_worker = wait_for(counted, what="every flow counted by one worker")
        assert proxy.stop(signal.SIGTERM) == 0
    assert all(n > 0 for n in per_worker), per_worker  # both workers served connections
    assert len({r["flow_id"] for r in recs}) == FLOWS  # whole records, none interleaved
