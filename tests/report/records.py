"""Flow records from real runs, for the report tests: the demo, and two hops around a real nginx.

    path = demo_records(tmp_path)                 # one hop, seven kinds of stream
    path = two_hop_records(tmp_path, "gzip_hold")  # edge -> nginx -> origin -> upstream

Both start the shipped `hopmeter` command as real processes on loopback ports.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.harness.nginx import NginxServer
from tests.harness.procs import HOPMETER, free_port, hopmeter, read_records

# Long enough for gzip to hold the whole body (docs/nginx-holds.md): 60 tokens at 40 tokens/s.
HELD = "tokens=60;rate=40"
# One stall on the model side, seen at both hops: the report colours it in both lanes.
STALLED = "tokens=30;rate=40;stall_at=12;stall_s=0.7"
# Emoji and CRLF, so the records carry line_endings findings and multi-byte offsets.
EMOJI_CRLF = "tokens=30;rate=50;emoji=1;line_ending=crlf;split_writes=1"


def demo_records(tmp: Path) -> Path:
    """Run `hopmeter demo --records` and return the records file (seven single-hop flows)."""
    path = tmp / "demo.jsonl"
    subprocess.run(
        [*HOPMETER, "demo", "--records", str(path)],
        check=True,
        capture_output=True,
        timeout=90,
    )
    return path


def _send(port: int, scenario: str, model: str = "gpt-4o") -> None:
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": model, "stream": True},
        headers={"x-hopmeter-scenario": scenario},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def two_hop_records(tmp: Path, config: str, scenarios: tuple[str, ...] = (HELD,)) -> Path:
    """One request per scenario through edge listener -> nginx `config` -> origin listener.

    Returns the records file: two records per request, sharing a trace id.
    """
    up, edge, origin = free_port(), free_port(), free_port()
    records = tmp / f"two-hop-{config}.jsonl"
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="upstream", ports=(up,)),
        NginxServer(origin, config, prefix=tmp) as nginx,
        hopmeter(
            tmp,
            "run",
            "--listener",
            f"edge=reverse:http://127.0.0.1:{nginx.port}@127.0.0.1:{edge}",
            "--listener",
            f"origin=reverse:http://127.0.0.1:{up}@127.0.0.1:{origin}",
            "--records",
            str(records),
            "--metrics",
            "off",
            name=f"hopmeter-{config}",
            ports=(edge, origin),
        ),
    ):
        for scenario in scenarios:
            _send(edge, scenario)
        read_records(records, 2 * len(scenarios))
    return records
