"""Outputs that stall, fill up, close or rotate never hold a stream (the shipped `hopmeter run`,
real pipes, /dev/full, a tmpfs, the real logrotate with deploy/logrotate/hopmeter).

Streams come from an in-test upstream that stamps each event with the time it sent it
(time.monotonic(), the clock the client in this process reads too), so a test compares what
clients waited with and without a reader on the proxy's standard output: never an absolute time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gzip
import os
import random
import shutil
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.devices import small_tmpfs
from tests.harness.procs import HOPMETER, free_port, port_open, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LOGROTATE_SNIPPET = ROOT / "deploy" / "logrotate" / "hopmeter"
EVENTS = 6
GAP_S = 0.2  # 240 streams at once: 1,200 events/s, which the client and upstream in this process
# keep up with
F_SETPIPE_SZ = 1031


async def stamped(ex: Exchange) -> None:
    """An OpenAI chat stream of EVENTS events GAP_S apart, each carrying its number and the
    moment it was sent; each stream starts at a random point of the first gap, so that the
    streams' events are spread evenly instead of coming in bursts."""
    await ex.head({"content-type": "text/event-stream"})
    await asyncio.sleep(random.uniform(0, GAP_S))
    for i in range(EVENTS):
        doc = {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "gpt-4o",
            "choices": [{"index": 0, "delta": {"content": f" tok{i}"}}],
            "i": i,
            "t": time.monotonic(),
        }
        await ex.chunk(b"data: " + orjson.dumps(doc) + b"\n\n")
        await asyncio.sleep(GAP_S)
    await ex.chunk(b"data: [DONE]\n\n")
    await ex.end()


@dataclass
class Streams:
    """What the clients saw: per stream, the event numbers in arrival order and their delays."""

    orders: list[list[int]] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    done: int = 0
    trace_ids: list[str] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        """The q-quantile of every event's delay (upstream send -> client read)."""
        return statistics.quantiles(self.delays, n=100, method="inclusive")[round(q * 100) - 1]


async def _one(client: httpx.AsyncClient, url: str, seen: Streams) -> None:
    trace_id = uuid.uuid4().hex
    seen.trace_ids.append(trace_id)
    order: list[int] = []
    buf = b""
    done = False
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"}
    async with client.stream("POST", url, json=body, headers=headers) as response:
        assert response.status_code == 200
        async for data in response.aiter_raw():
            now = time.monotonic()
            buf += data
            *events, buf = buf.split(b"\n\n")
            for event in events:
                payload = event.removeprefix(b"data: ")
                if payload == b"[DONE]":
                    done = True
                    continue
                doc = orjson.loads(payload)
                order.append(doc["i"])
                seen.delays.append(now - doc["t"])
    seen.orders.append(order)
    seen.done += done


def run_streams(port: int, count: int, timeout_s: float = 30.0) -> Streams:
    """`count` streams through the proxy at once; what their clients saw."""
    return run_side_by_side([port], count, timeout_s)[0]


def run_side_by_side(ports: list[int], count: int, timeout_s: float = 30.0) -> list[Streams]:
    """`count` streams through each proxy, all at once (the same weather for each; each proxy's
    streams started first half of the time, as the client's order favours the first); what
    their clients saw, per proxy."""
    seen = [Streams() for _ in ports]

    async def main() -> None:
        limits = httpx.Limits(max_connections=count * len(ports), max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
            pairs = list(zip(ports, seen, strict=True))
            streams = [
                _one(client, f"http://127.0.0.1:{port}/v1/chat/completions", into)
                for i in range(count)
                for port, into in (pairs if i % 2 else pairs[::-1])
            ]
            await asyncio.wait_for(asyncio.gather(*streams), timeout_s)

    asyncio.run(main())
    return seen


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of hopmeter's /metrics, by name and sorted labels."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def lost(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], output: str
) -> dict[str, float]:
    """An output's lost lines by reason."""
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "hopmeter_output_lost_lines_total" and dict(labels)["output"] == output
    }


class Proxy:
    """`hopmeter run` as a real process, its standard output and error where the test says."""

    def __init__(
        self, upstream: int, *args: str, stdout: int | None = None, stderr: int | None = None
    ) -> None:
        """Standard error goes where standard output does unless `stderr` says otherwise."""
        self.port, self.metrics = free_port(), free_port()
        argv = [*HOPMETER, "run", f"http://127.0.0.1:{upstream}"]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--metrics", f"127.0.0.1:{self.metrics}"]
        self.popen = subprocess.Popen(
            [*argv, "--drain-timeout", "1", *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stdout if stderr is None else stderr,
            start_new_session=True,
        )
        wait_for(lambda: self._up(self.port) and self._up(self.metrics), 30, "the proxy to listen")

    def _up(self, port: int) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(f"hopmeter run exited {self.popen.returncode}")
        return port_open(port)

    def stop(self) -> int:
        """SIGTERM; the exit status (the test fails if it does not exit)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
            raise AssertionError("hopmeter run did not exit after SIGTERM") from None


@contextlib.contextmanager
def piped(read: bool) -> Iterator[tuple[int, bytearray]]:
    """A one-page pipe for the proxy's standard output and error: (its write end, what a reader
    read). Without a reader nobody reads it until the test is over."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    got = bytearray()

    def reader() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(r, 65536):
                got.extend(data)

    thread = threading.Thread(target=reader, daemon=True) if read else None
    if thread is not None:
        thread.start()
    try:
        yield w, got
    finally:
        os.close(w)
        if thread is None:
            os.close(r)
        else:
            thread.join(10)
            os.close(r)


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    """The stamping upstream's port."""
    with ScriptedUpstream(stamped) as up:
        yield up.port


def check_every_stream(seen: Streams, count: int) -> None:
    """Every stream completed with every event, in order."""
    assert seen.done == count
    assert seen.orders == [list(range(EVENTS))] * count


def test_a_stdout_nobody_reads_holds_no_stream(upstream: int) -> None:
    """`--records -` with the default console, standard output and error into a pipe nobody
    reads: 120 concurrent streams all complete with every event in order, their delay no worse
    than that of 120 streams run at the same moment through a control proxy whose pipe is read,
    and the lines that did not fit are counted lost. (The stalled proxy's queues are 16 KiB, so
    that they fill; the control's keep the default.)"""
    count = 120
    with piped(read=False) as (stalled_out, _), piped(read=True) as (control_out, got):
        stalled = Proxy(upstream, "--records", "-", "--set", "hopmeter_output_queue=16KiB",
                        stdout=stalled_out)  # fmt: skip
        # the control's log apart: two writers' lines in one pipe interleave past PIPE_BUF
        # (4 KiB), and a record line can be longer (docs/cli.md, --records -)
        control = Proxy(upstream, "--records", "-", stdout=control_out, stderr=subprocess.DEVNULL)
        try:
            blocked, free = run_side_by_side([stalled.port, control.port], count)
            losses = {
                name: sum(lost(scrape(proxy.metrics), "records").values())
                + sum(lost(scrape(proxy.metrics), "log").values())
                for name, proxy in (("stalled", stalled), ("control", control))
            }
        finally:
            # both exit within the drain timeout, the stalled one with its pipe still full
            assert (stalled.stop(), control.stop()) == (0, 0)
    assert got.count(b'"schema":"hopmeter.flow/1"') == count
    check_every_stream(blocked, count)
    check_every_stream(free, count)
    figures = {
        name: [round(run.quantile(q) * 1000, 2) for q in (0.5, 0.9, 0.99)]
        for name, run in (("stalled", blocked), ("control", free))
    }
    print(f"delay p50/p90/p99 ms: {figures}")
    assert blocked.quantile(0.5) <= free.quantile(0.9), figures
    assert blocked.quantile(0.9) <= free.quantile(0.99), figures
    assert losses["stalled"] > 0 and losses["control"] == 0


def test_a_closed_stdout_never_stops_the_proxy(upstream: int) -> None:
    """Standard output and error a pipe whose reader is gone: every line is lost `epipe`, the
    proxy goes on serving, and exits cleanly."""
    r, w = os.pipe()
    os.close(r)
    try:
        proxy = Proxy(upstream, "--records", "-", stdout=w)
    finally:
        os.close(w)
    try:
        check_every_stream(run_streams(proxy.port, 20), 20)

        def all_lost() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            samples = scrape(proxy.metrics)
            return samples if lost(samples, "records").get("epipe") == 20 else None

        samples = wait_for(all_lost, what="20 records lost epipe")
        assert lost(samples, "log").get("epipe", 0) > 0
        assert proxy.popen.poll() is None
    finally:
        assert proxy.stop() == 0


def test_records_to_a_full_device_are_counted_and_said(upstream: int, tmp_path: Path) -> None:
    """`--records /dev/full`: streams are unaffected, each record is counted lost `enospc`, and
    the log says so (once at once, and in the total at exit)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proxy = Proxy(upstream, "--records", "/dev/full", stdout=out.fileno())
        try:
            check_every_stream(run_streams(proxy.port, 30), 30)
            wait_for(lambda: lost(scrape(proxy.metrics), "records").get("enospc") == 30,
                     what="30 records lost enospc")  # fmt: skip
        finally:
            assert proxy.stop() == 0
    text = log.read_text()
    assert "hopmeter: WARNING outputs could not write every line (since start): records" in text
    assert "over this run: records 30 lines (enospc 30)" in text


def test_records_resume_once_a_full_disk_has_room(upstream: int, tmp_path: Path) -> None:
    """On a small tmpfs that fills up, streams go on and records are counted lost; once space is
    freed, records are written to the same file again without a restart, and every line in it
    is a whole record."""
    with small_tmpfs(tmp_path / "disk", 64) as disk:
        filler = disk / "filler"
        filler.write_bytes(b"\0" * 60 * 1024)
        records = disk / "records.jsonl"
        proxy = Proxy(upstream, "--records", str(records), stdout=subprocess.DEVNULL)
        try:
            check_every_stream(run_streams(proxy.port, 20), 20)
            wait_for(lambda: sum(lost(scrape(proxy.metrics), "records").values()) > 0,
                     what="records lost")  # fmt: skip
            filler.unlink()
            before = records.read_bytes().count(b"\n")
            check_every_stream(run_streams(proxy.port, 20), 20)

            def resumed() -> dict[str, float] | None:
                samples = scrape(proxy.metrics)
                written = samples["hopmeter_output_written_lines_total", (("output", "records"),)]
                gone = sum(lost(samples, "records").values())
                return (
                    lost(samples, "records") if written + gone == 40 and written > before else None
                )

            by_reason = wait_for(resumed, what="records written again")
            assert by_reason["enospc"] > 0
        finally:
            assert proxy.stop() == 0
        lines = records.read_bytes().splitlines()
        assert all(orjson.loads(ln)["schema"] == "hopmeter.flow/1" for ln in lines)
        assert len(lines) > before


def test_logrotate_rotates_records_while_streams_run(upstream: int, tmp_path: Path) -> None:
    """The real logrotate with deploy/logrotate/hopmeter (paths moved into the test's folder)
    rotates the records file while streams run: the proxy keeps running, and every flow's record
    is in exactly one of the two files."""
    logrotate = shutil.which("logrotate") or "/usr/sbin/logrotate"
    if not os.path.exists(logrotate):
        pytest.fail("logrotate is not installed: .ci/run installs it (Debian package logrotate)")
    records, pid_file = tmp_path / "records.jsonl", tmp_path / "run.pid"
    config = tmp_path / "logrotate.conf"
    config.write_text(
        LOGROTATE_SNIPPET.read_text()
        .replace("/var/log/hopmeter/records.jsonl", str(records))
        .replace("/var/log/hopmeter/joined.jsonl", str(tmp_path / "joined.jsonl"))
        .replace("/run/hopmeter/", f"{tmp_path}/")
    )
    proxy = Proxy(upstream, "--records", str(records), "--pid-file", str(pid_file),
                  stdout=subprocess.DEVNULL)  # fmt: skip
    seen = Streams()
    try:
        assert pid_file.read_text() == f"{proxy.popen.pid}\n"
        rotating = threading.Thread(target=rotate, args=(logrotate, config, tmp_path))
        for wave in range(5):
            if wave == 3:  # once more while a wave's streams run
                rotating.start()
            part = run_streams(proxy.port, 40)
            check_every_stream(part, 40)
            seen.trace_ids += part.trace_ids
            if wave == 1:  # rotate between two waves
                rotate(logrotate, config, tmp_path)
        rotating.join(30)
        assert proxy.popen.poll() is None  # SIGHUP never stops it
        rotated = sorted(tmp_path.glob("records.jsonl.*"))
        assert [p.name for p in rotated] == ["records.jsonl.1", "records.jsonl.2.gz"]
        files = [records, *rotated]

        def every_record() -> list[str] | None:
            ids = [
                orjson.loads(ln)["trace_id"]
                for path in files
                for ln in (
                    gzip.decompress(path.read_bytes())
                    if path.suffix == ".gz"
                    else path.read_bytes()
                ).splitlines()
            ]
            return ids if len(ids) >= len(seen.trace_ids) else None

        ids = wait_for(every_record, what="every record written")
    finally:
        assert proxy.stop() == 0
    assert sorted(ids) == sorted(seen.trace_ids)  # each exactly once across the files
    assert not pid_file.exists()


def rotate(logrotate: str, config: Path, tmp: Path) -> None:
    """Run logrotate on `config`, forced."""
    result = subprocess.run(
        [logrotate, "--force", "--state", str(tmp / "logrotate.state"), str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_sigusr1_reopens_the_records_as_for_nginx_and_stops_nothing(
    upstream: int, tmp_path: Path
) -> None:
    """A `postrotate` written for nginx sends USR1 (whose default action ends a process): it
    reopens the records file as SIGHUP does, while streams run; none is cut, the proxy goes on."""
    records = tmp_path / "records.jsonl"
    with piped(read=True) as (out, got):
        proxy = Proxy(upstream, "--records", str(records), stdout=out)
        try:
            check_every_stream(run_streams(proxy.port, 10), 10)
            records.rename(tmp_path / "records.jsonl.1")
            during = threading.Thread(target=lambda: seen.append(run_streams(proxy.port, 20)))
            seen: list[Streams] = []
            during.start()
            proxy.popen.send_signal(signal.SIGUSR1)
            during.join(60)
            check_every_stream(seen[0], 20)
            wait_for(lambda: b"(SIGHUP or SIGUSR1)" in got, what="the reopen said")
            check_every_stream(run_streams(proxy.port, 5), 5)
            assert proxy.popen.poll() is None
        finally:
            assert proxy.stop() == 0
    lines = [
        *records.read_bytes().splitlines(),
        *(tmp_path / "records.jsonl.1").read_bytes().splitlines(),
    ]
    assert len(lines) == 35 and records.stat().st_size > 0


def test_join_serve_reopens_its_records_on_sighup(tmp_path: Path) -> None:
    """`hopmeter join --serve --records --pid-file`: after the file is moved away, SIGHUP makes
    the next joined line go to a new file at the path; the service keeps serving."""
    pytest.importorskip("opentelemetry.proto")
    from tests.harness.otlp import PROTOBUF, hop_span, join_serve, post, request_of

    def pair(trace: bytes) -> bytes:
        edge, origin = bytes([1]) * 8, bytes([2]) * 8
        spans = [hop_span(trace, edge), hop_span(trace, origin, hop="origin", parent=edge)]
        return request_of(spans).SerializeToString()

    pid_file = tmp_path / "join.pid"
    with join_serve(tmp_path, "--pid-file", str(pid_file)) as join:
        assert post(join.port, pair(bytes([0xA1]) * 16), PROTOBUF)[0] == 200
        (first,) = join.joined(1)
        join.records.rename(tmp_path / "join.jsonl.1")
        os.kill(int(pid_file.read_text()), signal.SIGHUP)
        wait_for(lambda: "reopening" in join.proc.output(), what="the reopen said")
        assert post(join.port, pair(bytes([0xB2]) * 16), PROTOBUF)[0] == 200
        (second,) = join.joined(1)
        assert join.proc.popen.poll() is None
        assert join.metrics()['hopmeter_output_written_lines_total{output="records"}'] == 2
    assert first["trace_id"] == "a1" * 16 and second["trace_id"] == "b2" * 16
    (old,) = (tmp_path / "join.jsonl.1").read_bytes().splitlines()
    assert orjson.loads(old)["trace_id"] == "a1" * 16


def test_a_bad_queue_size_is_one_line_and_earlier_log_lines_are_written() -> None:
    """`--set hopmeter_output_queue=lots` stops the proxy before it starts with one line naming
    the option; a line logged before it (the metrics warning) is still written, though the
    master never ran."""
    result = subprocess.run(
        [*HOPMETER, "run", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{free_port()}",
         "--metrics", f"0.0.0.0:{free_port()}", "--set", "hopmeter_output_queue=lots"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hopmeter: hopmeter_output_queue 'lots': expected a size in bytes, e.g. 65536, 64KiB "
        "or 8MiB"
    ]
    assert "the metrics endpoint listens beyond this host" in result.stdout
