"""--workers N: several processes serve the same port; metrics and records stay correct.

And every listener, a worker's or a single process's, queues a burst of connections.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from hopmeter.proxy.run.listen import LISTEN_BACKLOG
from tests.harness.procs import demo_path, free_port, read_records, wait_for

pytestmark = pytest.mark.integration
FLOWS = 24


def _flows(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hopmeter_flows_total{")
    )


def listen_backlogs(port: int) -> list[int]:
    """The accept-queue size of every socket listening on `port` (`ss`: Send-Q of a listener)."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return [int(line.split()[2]) for line in out.splitlines() if line.startswith("LISTEN")]


def expected_backlog() -> int:
    """What the kernel grants hopmeter's request: it caps a backlog at net.core.somaxconn."""
    return min(LISTEN_BACKLOG, int(Path("/proc/sys/net/core/somaxconn").read_text()))


needs_ss = pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")


def _two_free_ports() -> int:
    """A port p with p and p + 1 both free a moment ago (worker i serves metrics on p + i)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", p + 1)) != 0:
                try:
                    with socket.socket() as s2:  # closed even when bind fails
                        s2.bind(("127.0.0.1", p + 1))
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
        if shutil.which("ss"):  # both workers listen, each with the deep accept queue
            # the first worker's listener answers before the second's is up: wait for both
            def both() -> list[int] | None:
                backlogs = listen_backlogs(port)
                return backlogs if len(backlogs) == 2 else None

            backlogs = wait_for(both, what="both workers listening")
            assert backlogs == [expected_backlog()] * 2
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


def test_sigterm_to_the_parent_drains_every_worker(tmp_path: Path) -> None:
    """SIGTERM to the parent of two workers: each drains, so a stream under way finishes whole
    and is recorded complete, and the parent exits 0 once the workers have."""
    with demo_path(tmp_path, "--workers", "2", "--quiet") as path:
        url = f"{path.url}/v1/chat/completions"
        got: list[bytes] = []
        done = threading.Event()

        def stream() -> None:
            headers = {"x-hopmeter-scenario": "tokens=30;rate=20"}  # 1.5 s
            with httpx.stream("POST", url, json={"stream": True}, headers=headers) as r:
                got.extend(r.iter_raw())
            done.set()

        client = threading.Thread(target=stream)
        client.start()
        wait_for(lambda: len(got) >= 3, what="the stream to be under way")
        assert path.proxy.stop(signal.SIGTERM, timeout_s=30) == 0
        client.join(10)
        assert done.is_set()
    (rec,) = read_records(path.records, 1)
    assert rec["ended"] == "complete"
    assert b"data: [DONE]" in b"".join(got)


def test_sighup_to_the_parent_makes_every_worker_reopen_its_records(tmp_path: Path) -> None:
    """SIGHUP to the parent named by --pid-file is passed on to both workers: neither stops, and
    every flow after it is recorded in the new file at the path, every flow before in the moved
    one, each exactly once."""
    pid_file = tmp_path / "run.pid"
    with demo_path(tmp_path, "--workers", "2", "--quiet", "--pid-file", str(pid_file)) as path:
        assert pid_file.read_text() == f"{path.proxy.popen.pid}\n"

        def flows(n: int) -> None:
            for _ in range(n):
                r = httpx.post(
                    f"{path.url}/v1/chat/completions",
                    json={"stream": True},
                    headers={"x-hopmeter-scenario": "tokens=3;rate=500", "connection": "close"},
                )
                assert r.status_code == 200

        flows(FLOWS)
        before = read_records(path.records, FLOWS)
        moved = tmp_path / "records.jsonl.1"
        path.records.rename(moved)
        path.proxy.popen.send_signal(signal.SIGHUP)
        # each worker says it reopened: then every flow after goes to the new file
        wait_for(
            lambda: path.proxy.output().count("(SIGHUP or SIGUSR1)") == 2,
            what="both workers reopen",
        )
        flows(FLOWS)
        after = read_records(path.records, FLOWS)
        assert path.proxy.popen.poll() is None
        assert path.proxy.stop(signal.SIGTERM) == 0
    assert len(read_records(moved, FLOWS)) == FLOWS and len(after) == FLOWS
    ids = [r["flow_id"] for r in [*before, *after]]
    assert len(set(ids)) == 2 * FLOWS
    assert not pid_file.exists()


@needs_ss
def test_a_single_process_listens_with_a_deep_accept_queue(tmp_path: Path) -> None:
    """asyncio's default backlog (100) overflows when a few hundred clients connect at once: the
    kernel drops their SYNs and each waits a second to retry. hopmeter asks for more."""
    with demo_path(tmp_path, "--quiet") as path:
        assert listen_backlogs(path.port) == [expected_backlog()]
        assert expected_backlog() > 100
