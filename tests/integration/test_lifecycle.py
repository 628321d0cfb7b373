"""Stopping hopmeter loses no record: finished flows are written, in-flight ones as shutdown."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from tests.harness.procs import (
    HOPMETER,
    demo_path,
    free_port,
    port_open,
    read_records,
    rss_mib,
    wait_for,
)

pytestmark = pytest.mark.integration


def _long_stream(url: str) -> tuple[list[bytes], threading.Thread]:
    """A 20 s stream read in a thread: the pieces it got so far, and the thread, once it is
    under way (five pieces in)."""
    got: list[bytes] = []

    def read() -> None:
        try:
            with httpx.stream(
                "POST",
                url,
                json={"stream": True},
                timeout=30,
                headers={"x-hopmeter-scenario": "tokens=1000;rate=50"},
            ) as r:
                for piece in r.iter_raw():
                    got.append(piece)
        except httpx.HTTPError:
            pass

    client = threading.Thread(target=read)
    client.start()
    wait_for(lambda: len(got) >= 5, what="the long stream to be under way")
    return got, client


def test_sigterm_writes_finished_and_in_flight_flows(tmp_path: Path) -> None:
    """After SIGTERM and a drain that runs out, the records hold the finished flow and the one
    still in flight as ended shutdown."""
    with demo_path(tmp_path, "--drain-timeout", "0.5") as path:
        proxy, records = path.proxy, path.records
        url = f"{path.url}/v1/chat/completions"
        httpx.post(url, json={"stream": True}, headers={"x-hopmeter-scenario": "tokens=5"})
        read_records(records, 1)
        _, client = _long_stream(url)
        assert proxy.stop(signal.SIGTERM) == 0
        client.join(10)
    recs = read_records(records, 2)
    assert [r["response"]["ended"] for r in recs] == ["complete", "shutdown"]
    assert recs[1]["figures"]["events"] >= 5
    assert "Traceback" not in proxy.output()


def test_a_stream_the_drain_ends_stops_where_its_record_ends(tmp_path: Path) -> None:
    """A relayed stream still in flight when the drain runs out: once its record is written
    (ended shutdown) no byte reaches the client past what the record counts, and nothing is
    measured after its end. The metrics endpoint is on: stopping it keeps the process up for a
    moment after the records, while the upstream goes on sending."""
    metrics = free_port()
    with demo_path(
        tmp_path, "--drain-timeout", "0.3", "--metrics", f"127.0.0.1:{metrics}", ports=(metrics,)
    ) as path:
        proxy, records = path.proxy, path.records
        got, client = _long_stream(f"{path.url}/v1/chat/completions")
        assert proxy.stop(signal.SIGTERM) == 0
        client.join(10)
    (rec,) = read_records(records, 1)
    assert rec["response"]["ended"] == "shutdown"
    assert sum(map(len, got)) == rec["response"]["bytes_out"]
    assert "measuring failed" not in proxy.output()


@pytest.mark.parametrize("flags", [("--json",), ("--records", "-")], ids=["json", "records"])
def test_standard_output_carries_only_the_flows_json_lines(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """With the flows' JSON lines on standard output (`--json`, `--records -`), the log lines
    (listening, draining, the console's text line) go to standard error: a reader of standard
    output (jq, a log shipper) gets JSON lines only."""
    port = free_port()
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            [*HOPMETER, "run", "--listen", f"127.0.0.1:{port}", "--metrics", "off", *flags],
            stdout=out,
            stderr=err,
        )
        try:
            wait_for(lambda: port_open(port), what="the proxy to listen")
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"stream": True})
            assert r.status_code == 200
            wait_for(lambda: out_path.read_bytes().count(b"\n") >= 1, what="a JSON line")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
    lines = out_path.read_bytes().splitlines()
    assert len(lines) == 1 and orjson.loads(lines[0])["trace_id"]
    said = err_path.read_text()
    assert "listening at" in said and "drained" in said


def test_unwritable_records_file_is_a_clear_error(tmp_path: Path) -> None:
    """A records path in a read-only folder fails at start with one line naming it."""
    import subprocess

    from tests.harness.procs import HOPMETER

    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "r.jsonl").mkdir()  # a folder where the file should be: cannot be opened
    result = subprocess.run(
        [
            *HOPMETER,
            "run",
            "--records",
            str(locked / "r.jsonl"),
            "--metrics",
            "off",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert f"cannot write records to {locked / 'r.jsonl'}" in result.stderr
    assert "Traceback" not in result.stderr


def mapped_tables(pid: int) -> set[str]:
    """The token tables (hopmeter.core.bpe) a process has mapped, by file name."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in lines if line.endswith(".bpe")}


@pytest.mark.parametrize("lazy", [False, True], ids=["default", "lazy"])
def test_the_vocabulary_is_loaded_before_the_listener_opens(tmp_path: Path, lazy: bool) -> None:
    """By default `hopmeter run` maps the tokenizer's table before its listener accepts a
    connection, so no early request waits for it; with `--lazy-tokenizer` it idles without it
    and maps it for the first flow. Both count that flow's tokens alike, and the table costs
    the process a few MiB once counting has touched it (not tiktoken's ~47 MiB encoder)."""
    with demo_path(tmp_path, *(("--lazy-tokenizer",) if lazy else ())) as path:
        pid = path.proxy.popen.pid
        idle = rss_mib(pid)  # the listener accepts connections from here on
        idle_tables = mapped_tables(pid)
        httpx.post(
            f"{path.url}/v1/chat/completions",
            json={"stream": True},
            headers={"x-hopmeter-scenario": "tokens=40;usage=off"},
        )
        (rec,) = read_records(path.records, 1)
        grown = rss_mib(pid) - idle
        tables = mapped_tables(pid)
    figures = rec["figures"]
    assert (figures["tokens_source"], figures["tokens_counted"], figures["tokens"]) == (
        "tokenizer",
        40,
        40,
    )
    assert {name.split("-")[0] for name in tables} == {"o200k_base"}
    assert idle_tables == (set() if lazy else tables)
    assert grown < 20, (idle, grown)
