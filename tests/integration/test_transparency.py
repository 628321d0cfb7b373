"""The core promise, on real processes: hopmeter never holds a byte and never changes one."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.h2client import stream_post
from tests.harness.procs import free_port, hopmeter, measuring, read_records
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

EVENTS = 12
# How long the lockstep upstream waits for the client to acknowledge an event. Far above any
# forwarding delay on loopback; reached only when a hop holds the event.
ACK_TIMEOUT_S = 10.0


class Lockstep:
    """An upstream that sends event N+1 only after the client has received event N."""

    def __init__(self) -> None:
        self.acks = [threading.Event() for _ in range(EVENTS)]
        self.held_at: int | None = None

    async def __call__(self, ex: Exchange) -> None:
        await ex.head({"content-type": "text/event-stream", "cache-control": "no-cache"})
        for n in range(EVENTS):
            await ex.chunk(f'data: {{"n": {n}, "text": "tök {n} 🦙"}}\n\n'.encode())
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, self.acks[n].wait, ACK_TIMEOUT_S):
                self.held_at = n
                break
        await ex.end()

    def read(self, response: httpx.Response) -> bytes:
        """Read the stream, acknowledging each complete event the moment it arrives."""
        got = b""
        for piece in response.iter_raw():
            got += piece
            for n in range(got.count(b"\n\n")):
                self.acks[n].set()
        return got


def _lockstep_through(url: str, lock: Lockstep) -> bytes:
    with (
        httpx.Client(timeout=30) as c,
        c.stream("POST", url, json={"model": "m", "stream": True}) as r,
    ):
        assert r.status_code == 200
        return lock.read(r)


def test_lockstep_http1(tmp_path: Path) -> None:
    """Each event reaches an HTTP/1.1 client before upstream sends the next: nothing is held."""
    lock = Lockstep()
    with (
        ScriptedUpstream(lock) as up,
        measuring(tmp_path, f"http://127.0.0.1:{up.port}") as proxy,
    ):
        body = _lockstep_through(f"{proxy.url}/v1/chat/completions", lock)
        rec = read_records(proxy.records, 1)[0]
    assert lock.held_at is None
    assert body.count(b"\n\n") == EVENTS
    assert rec["response"]["ended"] == "complete"
    assert rec["figures"]["events"] == EVENTS
    assert rec["response"]["bytes_out"] == rec["response"]["bytes_wire"] == len(body)


def test_lockstep_http2_client(tmp_path: Path) -> None:
    """An HTTP/2 client over TLS gets each event before upstream sends the next."""
    lock = Lockstep()
    with (
        ScriptedUpstream(lock) as up,
        measuring(
            tmp_path, f"http://127.0.0.1:{up.port}", "--set", f"confdir={tmp_path / 'mitm'}"
        ) as proxy,
    ):
        port, records = proxy.port, proxy.records
        got = b""
        for kind, payload in stream_post(
            "127.0.0.1", port, "/v1/chat/completions", b'{"model": "m", "stream": true}'
        ):
            if kind == "status":
                assert payload == b"200"
                continue
            got += payload
            for n in range(got.count(b"\n\n")):
                lock.acks[n].set()
        body = got
        rec = read_records(records, 1)[0]
    assert lock.held_at is None
    assert body.count(b"\n\n") == EVENTS
    assert rec["response"]["http_version"] == "HTTP/1.1"  # upstream side; the client spoke h2
    assert rec["figures"]["events"] == EVENTS


def test_lockstep_two_listeners_around_nginx(tmp_path: Path) -> None:
    """Both listeners of one process, with a streaming nginx between them, hold nothing."""
    from tests.harness.nginx import NginxServer

    lock = Lockstep()
    edge, origin = free_port(), free_port()
    records = tmp_path / "records.jsonl"
    with (
        ScriptedUpstream(lock) as up,
        NginxServer(origin, "streaming", prefix=tmp_path) as nginx,
        hopmeter(
            tmp_path,
            "run",
            "--listener",
            f"edge=reverse:http://127.0.0.1:{nginx.port}@127.0.0.1:{edge}",
            "--listener",
            f"origin=reverse:http://127.0.0.1:{up.port}@127.0.0.1:{origin}",
            "--records",
            str(records),
            "--metrics",
            "off",
            ports=(edge, origin),
        ),
    ):
        body = _lockstep_through(f"http://127.0.0.1:{edge}/v1/chat/completions", lock)
        recs = read_records(records, 2)
    assert lock.held_at is None
    assert body.count(b"\n\n") == EVENTS
    assert {r["hop"] for r in recs} == {"edge", "origin"}
    assert len({r["trace_id"] for r in recs}) == 1


# -- byte identity -------------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.sampled_from(list("ab c,.é。猫🦙👩\u200d💻\ufffd")), max_size=12)
_ENDING = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A random event stream (mixed endings, emoji, comments) and random cut points."""
    parts = []
    for _ in range(draw(st.integers(1, 8))):
        nl = draw(_ENDING)
        if draw(st.booleans()):
            parts.append(f": keepalive{nl}")
        parts.append(f"event: delta{nl}" if draw(st.booleans()) else "")
        parts.append(f"data: {draw(_TEXT)}{nl}")
        parts.append(nl)
    data = "".join(parts).encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=6)))
    return data, cuts


class Replayer:
    """Serves, for request /s/N, the N-th registered stream in the given pieces."""

    def __init__(self) -> None:
        self.streams: dict[str, list[bytes]] = {}

    async def __call__(self, ex: Exchange) -> None:
        await ex.head({"content-type": "text/event-stream"})
        for piece in self.streams[ex.path]:
            await ex.chunk(piece)
            await asyncio.sleep(0.001)
        await ex.end()


@pytest.fixture(scope="module")
def identity_path(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One proxy in front of a replaying upstream, shared by the Hypothesis examples."""
    tmp = tmp_path_factory.mktemp("identity")
    replayer = Replayer()
    with (
        ScriptedUpstream(replayer) as up,
        measuring(tmp, f"http://127.0.0.1:{up.port}", "--quiet") as proxy,
        httpx.Client(base_url=proxy.url, timeout=20) as client,
    ):
        yield replayer, client, proxy.proc


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=streams())
def test_bytes_identical_through_proxy(identity_path, case) -> None:  # type: ignore[no-untyped-def]
    """Whatever the events, endings and chunking, the client receives exactly upstream's bytes."""
    replayer, client, _ = identity_path
    data, cuts = case
    bounds = [0, *cuts, len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    path = f"/s/{len(replayer.streams)}"
    replayer.streams[path] = pieces
    with client.stream("GET", path) as r:
        got = b"".join(r.iter_raw())
    assert got == data
