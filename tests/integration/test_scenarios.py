"""The scenario matrix on real processes: every fault the demo upstream plays, behind each measured
nginx configuration, and the verdict hopmeter gives on both sides of nginx.

    client ─► hopmeter "edge" ─► nginx ─► hopmeter "origin" ─► upstream

nginx runs each configuration of CONFIGS in tests/harness/nginx.py.

One `hopmeter upstream` process plays the scenarios. A small upstream in this file plays the two
framings the demo upstream never sends, a close-delimited and a Content-Length stream: the only
bodies nginx's proxy buffers hold (docs/nginx-holds.md). Per nginx config there is one hopmeter
process with four listeners (edge and origin around a demo-upstream nginx and around a
framed-upstream nginx); the configs take turns, and a config's cases run at once. Every run
renders the report of what it measured; `HOPMETER_WRITE_SCENARIOS=1` makes it docs/scenarios.md
(whatever the verdicts), otherwise it goes to the test's temporary directory and the tree stays
clean.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from hopmeter.core.detectors import THRESHOLDS
from hopmeter.core.vocab import SEVERITY_ORDER
from hopmeter.upstream import formats
from hopmeter.upstream.scenario import Scenario
from tests.harness.findings import stream_kinds
from tests.harness.nginx import CONFIGS, NGINX, NginxServer, available
from tests.harness.procs import HOPMETER, Proc, free_port, read_records
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not available(), reason="nginx is not installed"),
]

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenarios.md"
# A reply long enough for nginx's gzip to hold it whole and for gzip_bursts to release it in
# several windows: 300 OpenAI events at 100 tokens/s, 52 KB that compress to ~1.2 KB
# (docs/nginx-holds.md measured these configs with exactly this reply).
TOKENS, RATE = 300, 100.0
COMMON = f"tokens={TOKENS};rate={RATE:g}"
# Where the error event and the cut come: late enough that gzip_bursts has released a few windows.
FAULT_AT = 200
REQUEST_TIMEOUT_S = 30.0
RECORDS_TIMEOUT_S = 30.0
# A config's cases run again (at most this many times in all) when a listener saw a stall that no
# scenario plays: the host paused, see _host_paused. The doc says how many runs each config took.
MAX_WAVES = 3
# A port picked by free_port() can be taken by another process before ours binds it.
PORT_ATTEMPTS = 3
MODEL = "gpt-4o-mini"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One scenario: what the upstream does, and the findings it must draw."""

    name: str
    plays: str  # for the doc: what the upstream does
    scenario: str = ""  # X-Hopmeter-Scenario keys after COMMON
    upstream: str = "demo"  # "demo", or the framed upstream in this file: "close" | "length"
    stream: bool = True  # what the request asks for
    at_origin: frozenset[str] = frozenset()  # the verdict where no hop holds
    # The content part of the verdict after nginx re-encodes the stream with gzip (the hold and
    # compression_on_stream come on top): nginx drops Content-Length, weakens but keeps ETag, and
    # a stall or split character inside a held body is no longer what the client sees.
    gzipped: frozenset[str] | None = None
    held_by_upstream: bool = False  # the upstream itself sends the body in one piece
    event_stream: bool = True

    @property
    def content(self) -> frozenset[str]:
        """The verdict's content part behind a gzipping nginx."""
        return self.at_origin if self.gzipped is None else self.gzipped


def _k(*kinds: str) -> frozenset[str]:
    return frozenset(kinds)


CASES: tuple[Case, ...] = (
    Case(name="clean", plays="a steady 100 tokens/s"),
    Case(name="jittered", plays="±30% on every interval", scenario="jitter=0.3;seed=7"),
    Case(
        name="stall",
        plays="one 900 ms stall before token 150",
        scenario="stall_at=150;stall_s=0.9",
        at_origin=_k("stall"),
        gzipped=_k(),
    ),
    Case(name="coalesced", plays="4 tokens per event", scenario="coalesce=4"),
    Case(
        name="buffered",
        plays="whole body at the end, Content-Length and ETag (body hashing)",
        scenario="buffered=1",
        at_origin=_k("whole_body_hold", "buffering_headers"),
        held_by_upstream=True,
    ),
    Case(
        name="gzip",
        plays="gzip without a flush per event",
        scenario="gzip=1",
        at_origin=_k("whole_body_hold", "compression_on_stream"),
        held_by_upstream=True,
    ),
    Case(
        name="crlf",
        plays="CRLF line endings",
        scenario="line_ending=crlf",
        at_origin=_k("line_endings"),
    ),
    Case(
        name="emoji_split",
        plays="emoji, each event written in two pieces cut inside a character",
        scenario="emoji=1;split_writes=1",
        at_origin=_k("split_utf8"),
        gzipped=_k(),
    ),
    Case(
        name="fffd",
        plays="U+FFFD where the emoji were (a server decoding tokens alone)",
        scenario="emoji=1;fffd=1",
        at_origin=_k("replacement_char"),
    ),
    Case(
        name="error",
        plays=f"an error event after {FAULT_AT} tokens",
        scenario=f"error_at={FAULT_AT}",
        at_origin=_k("truncated"),
    ),
    Case(
        name="cut",
        plays=f"the connection cut after {FAULT_AT} tokens",
        scenario=f"cut_at={FAULT_AT}",
        at_origin=_k("truncated"),
    ),
    Case(
        name="not_streamed",
        plays="one JSON document although the request asked for a stream",
        scenario="stream=0",
        at_origin=_k("not_streamed"),
        event_stream=False,
    ),
    Case(
        name="document",
        plays='one JSON document, as the request (`"stream": false`) asked',
        stream=False,
        at_origin=_k("not_streamed"),
        event_stream=False,
    ),
    Case(
        name="close_delimited",
        plays="a steady stream, not chunked: the body ends when the connection closes",
        upstream="close",
    ),
    Case(
        name="content_length",
        plays="a steady stream with Content-Length up front",
        upstream="length",
        at_origin=_k("buffering_headers"),
        gzipped=_k(),
    ),
)
CASE = {c.name: c for c in CASES}


@dataclass(frozen=True, slots=True)
class Expect:
    """Findings that must appear, and ones that may (content-dependent)."""

    required: frozenset[str]
    optional: frozenset[str] = frozenset()


def expected(case: Case, config: str, hop: str) -> Expect:
    """The verdict for `case` seen at `hop` ("edge" or "origin") with nginx `config` between."""
    if hop == "origin" or config == "streaming" or not case.event_stream:
        # nothing between the upstream and this listener holds; nginx gzips event streams only
        return Expect(case.at_origin)
    if config == "buffer_bursts":
        # proxy buffers hold only bodies nginx cannot delimit by chunks (docs/nginx-holds.md)
        bursts = _k("burst_gaps") if case.upstream in ("close", "length") else _k()
        return Expect(case.at_origin | bursts)
    hold = "whole_body_hold" if config == "gzip_hold" or case.held_by_upstream else "burst_gaps"
    # decompressed reads of a gzip stream end wherever deflate blocks end: inside a character
    # when the text has multi-byte ones
    maybe_split = _k("split_utf8") if "emoji" in case.scenario else _k()
    return Expect(case.content | {"compression_on_stream", hold}, maybe_split)


# -- the framed upstream ---------------------------------------------------------------------------


async def _serve_framed(ex: Exchange) -> None:
    """The demo upstream's clean reply and clock, close-delimited or with Content-Length."""
    framing = ex.path.strip("/").split("/", 1)[0]
    scenario = Scenario(tokens=TOKENS, rate=RATE)
    plan = formats.openai_chat(scenario, MODEL, include_usage=True)
    head = [
        "HTTP/1.1 200 OK",
        "content-type: text/event-stream; charset=utf-8",
        "cache-control: no-cache, no-transform",
        "x-accel-buffering: no",
    ]
    if framing == "length":
        head.append(f"content-length: {sum(len(p.body) for p in plan)}")
    else:
        head.append("connection: close")
    ex.writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await ex.writer.drain()
    due = [0.0]
    for gap in scenario.intervals():
        due.append(due[-1] + gap)
    await asyncio.sleep(scenario.ttft_s)
    start = time.monotonic()
    for event in plan:
        if event.last_token is not None:
            wait = start + due[event.last_token] - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        ex.writer.write(event.body)
        await ex.writer.drain()
    if framing != "length":
        ex.writer.close()


# -- running the matrix ----------------------------------------------------------------------------


@dataclass(slots=True)
class Cell:
    """One case behind one nginx config: what the client saw and both listeners' records."""

    client: str
    edge: dict[str, Any]
    origin: dict[str, Any]


@dataclass(slots=True)
class Run:
    """Everything one run measured, and how long it took."""

    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    waves: dict[str, int] = field(default_factory=dict)  # per config: 1, or more after a pause
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Route:
    """One nginx config's processes: two nginx servers and the hopmeter around them."""

    config: str
    edge_port: int
    framed_port: int
    records: Path


def _trace_id(config: str, case: str, wave: int) -> str:
    return hashlib.sha256(f"{config}/{case}/{wave}".encode()).hexdigest()[:32]


def _send(route: Route, case: Case, *, wave: int) -> str:
    """Send one case's request through the edge; what the client got, in a few words."""
    port = route.framed_port if case.upstream != "demo" else route.edge_port
    prefix = "" if case.upstream == "demo" else f"/{case.upstream}"
    headers = {
        "traceparent": f"00-{_trace_id(route.config, case.name, wave)}-{'1' * 16}-01",
        "accept-encoding": "gzip",  # nginx gzips only for clients that accept it
        "x-hopmeter-scenario": ";".join(p for p in (COMMON, case.scenario) if p),
    }
    body = {"model": MODEL, "stream": case.stream, "messages": [{"role": "user", "content": "hi"}]}
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}{prefix}/v1/chat/completions",
            json=body,
            headers=headers,
            timeout=REQUEST_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}"
    return f"{r.status_code}, {len(r.content)} B"


def _ready(proc: Proc, ports: Iterable[int]) -> bool:
    """Wait until `proc` listens on every port; False if it exited because one was taken."""
    try:
        for port in ports:
            proc.wait_port(port)
    except AssertionError:
        if proc.popen.poll() is not None and "already in use" in proc.output():
            return False
        raise
    if "already in use" in proc.output():
        # another process listens on the port this one could not bind: every port answers,
        # but this process is on its way out
        proc.stop()
        return False
    return True


def _listening[T](
    first: tuple[T, Proc, list[int]], restart: Callable[[int], tuple[T, Proc, list[int]]]
) -> T:
    """What `first` started, once it listens; started again on fresh ports if one was taken."""
    started = first
    for attempt in range(1, PORT_ATTEMPTS + 1):
        value, proc, ports = started
        if _ready(proc, ports):
            return value
        started = restart(attempt)
    raise AssertionError(f"ports were taken {PORT_ATTEMPTS} times running: {proc.args}")


def _start_demo(
    stack: contextlib.ExitStack, tmp: Path, attempt: int
) -> tuple[int, Proc, list[int]]:
    """`hopmeter upstream` on a free port, not yet waited for."""
    port = free_port()
    proc = Proc([*HOPMETER, "upstream", "--listen", f"127.0.0.1:{port}"], tmp / f"up{attempt}.log")
    stack.callback(proc.stop)
    return port, proc, [port]


def _start_route(
    stack: contextlib.ExitStack, tmp: Path, config: str, upstreams: tuple[int, int], attempt: int
) -> tuple[Route, Proc, list[int]]:
    """Two nginx servers with `config` and one hopmeter around them, not yet waited for."""
    ports = {name: free_port() for name in ("edge", "origin", "edge_f", "origin_f")}
    nginx = stack.enter_context(NginxServer(ports["origin"], config, prefix=tmp))
    nginx_f = stack.enter_context(NginxServer(ports["origin_f"], config, prefix=tmp))
    records = tmp / f"{config}.jsonl"
    listeners = {
        "edge": (nginx.port, ports["edge"]),
        "origin": (upstreams[0], ports["origin"]),
        "edge-framed": (nginx_f.port, ports["edge_f"]),
        "origin-framed": (upstreams[1], ports["origin_f"]),
    }
    # two unrelated chains whose upstreams play one script: their replies are alike, so the
    # listeners pair by trace id only (a reply at edge and one at origin-framed share no request)
    args = ["run", "--records", str(records), "--metrics", "off", "--quiet", "--no-content-pairing"]
    for name, (target, port) in listeners.items():
        args += ["--listener", f"{name}=reverse:http://127.0.0.1:{target}@127.0.0.1:{port}"]
    proc = Proc([*HOPMETER, *args], tmp / f"hopmeter-{config}-{attempt}.log")
    stack.callback(proc.stop)
    return Route(config, ports["edge"], ports["edge_f"], records), proc, list(ports.values())


@contextlib.contextmanager
def _processes(tmp: Path) -> Iterator[list[Route]]:
    """The upstreams, and per nginx config two nginx servers and one hopmeter process, started
    together so that their start-up overlaps; one that lost a port to another process is
    started again on fresh ports."""
    with contextlib.ExitStack() as stack:
        framed = stack.enter_context(ScriptedUpstream(_serve_framed))
        demo = _listening(_start_demo(stack, tmp, 0), functools.partial(_start_demo, stack, tmp))
        upstreams = (demo, framed.port)
        starting = [_start_route(stack, tmp, config, upstreams, 0) for config in CONFIGS]
        routes = [
            _listening(first, functools.partial(_start_route, stack, tmp, config, upstreams))
            for config, first in zip(CONFIGS, starting, strict=True)
        ]
        yield routes


def _wave(route: Route, pool: concurrent.futures.Executor, wave: int) -> dict[str, Cell]:
    """Every case through one nginx config at once; the cells, by case name."""
    got = pool.map(functools.partial(_send, route, wave=wave), CASES)
    clients = dict(zip((c.name for c in CASES), got, strict=True))
    recs = read_records(route.records, 2 * len(CASES) * wave, RECORDS_TIMEOUT_S)
    by = {(r["trace_id"], r["hop"].split("-")[0]): r for r in recs}
    cells = {}
    for case in CASES:
        tid = _trace_id(route.config, case.name, wave)
        cells[case.name] = Cell(clients[case.name], by[tid, "edge"], by[tid, "origin"])
    return cells


def _host_paused(config: str, cells: dict[str, Cell]) -> bool:
    """Whether a listener saw stalls other than the one a scenario plays.

    No nginx config and no case but `stall` makes a gap of half a second on a 100 tokens/s
    clock, and the origin listener has no nginx before it at all. Such a gap means the host
    starved a process (other work on a shared 2-CPU box does that now and then): hopmeter rightly
    reports it, but the verdicts under test are about nginx, not about the host.
    """
    for name, cell in cells.items():
        played = 1 if "stall" in CASE[name].at_origin else 0
        if cell.origin["figures"]["stalls"] != played:
            return True
        want = "stall" in expected(CASE[name], config, "edge").required
        stalls = [f["evidence"]["stalls"] for f in cell.edge["findings"] if f["kind"] == "stall"]
        if stalls != ([played] if want else []):
            return True
    return False


def _run_matrix(tmp: Path) -> Run:
    """Start everything, run each config's wave of cases, and collect the cells."""
    run = Run()
    t0 = time.monotonic()
    with (
        _processes(tmp) as routes,
        concurrent.futures.ThreadPoolExecutor(len(CASES)) as pool,
    ):
        # One config at a time, its cases at once: all four at once would push ~12,000 events/s
        # through two cores, and a starved process is a real stall that spoils the verdicts.
        for route in routes:
            for wave in range(1, MAX_WAVES + 1):
                cells = _wave(route, pool, wave)
                run.waves[route.config] = wave
                if not _host_paused(route.config, cells):
                    break
            run.cells.update(((route.config, name), cell) for name, cell in cells.items())
    run.seconds = time.monotonic() - t0
    return run


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every case behind every nginx config (a config again after a host pause), and the
    report written from what was measured (docs/scenarios.md when HOPMETER_WRITE_SCENARIOS=1)."""
    tmp = tmp_path_factory.mktemp("scenarios")
    run = _run_matrix(tmp)
    doc = DOC if os.environ.get("HOPMETER_WRITE_SCENARIOS") == "1" else tmp / DOC.name
    doc.write_text(render(run))
    return run


# -- the verdicts ----------------------------------------------------------------------------------


def _size(cell: Cell) -> int:
    """The body the edge handed to the client (decoded, as httpx reports it, when not gzip)."""
    resp = cell.edge["response"]
    return int(resp["bytes_decoded"] if resp.get("content_encoding") else resp["bytes_out"])


def kinds(rec: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in rec["findings"]]


def finding(rec: dict[str, Any], kind: str) -> dict[str, Any]:
    """The evidence of the one finding of `kind` in a record."""
    return next(f["evidence"] for f in rec["findings"] if f["kind"] == kind)


def _mismatch(rec: dict[str, Any], want: Expect) -> str | None:
    got = set(kinds(rec))
    missing, extra = want.required - got, got - want.required - want.optional
    if not missing and not extra:
        return None
    return ", ".join([*(f"missing {k}" for k in sorted(missing)), *(f"not {k}" for k in extra)])


CELLS = [(config, case.name) for config in CONFIGS for case in CASES]


@pytest.mark.parametrize(("config", "name"), CELLS, ids=[f"{a}-{b}" for a, b in CELLS])
def test_verdict(matrix: Run, config: str, name: str) -> None:
    """Each listener's findings are exactly the expected verdict for the case, worst first, and
    the client got the whole reply unless the upstream cut it."""
    cell, case = matrix.cells[config, name], CASE[name]
    for hop in ("origin", "edge"):
        rec = getattr(cell, hop)
        assert _mismatch(rec, expected(case, config, hop)) is None, (hop, rec["findings"])
        assert rec["response"]["status"] == 200
        severities = [SEVERITY_ORDER[f["severity"]] for f in rec["findings"]]
        assert severities == sorted(severities)
    assert cell.client == ("RemoteProtocolError" if name == "cut" else f"200, {_size(cell)} B")


def test_steady_streams_draw_no_hold_through_a_streaming_nginx(matrix: Run) -> None:
    """Clean, jittered, coalesced and stalled streams draw neither hold nor burst finding."""
    for config in ("streaming", "buffer_bursts"):
        for name in ("clean", "jittered", "coalesced", "stall", "crlf", "emoji_split", "fffd"):
            cell = matrix.cells[config, name]
            for rec in (cell.edge, cell.origin):
                assert not {"whole_body_hold", "burst_gaps"} & set(kinds(rec)), (config, name)
    stall = matrix.cells["streaming", "stall"].edge
    assert kinds(stall) == ["stall"]
    assert finding(stall, "stall")["stalls"] == 1


def test_gzip_hold_releases_everything_after_the_origin_ended(matrix: Run) -> None:
    """Behind gzip_hold nearly every byte comes in one burst, after the origin saw its last."""
    for name in ("clean", "jittered", "stall", "coalesced", "crlf", "fffd"):
        cell = matrix.cells["gzip_hold", name]
        hold = finding(cell.edge, "whole_body_hold")
        assert hold["final_burst_share"] > 0.95
        assert finding(cell.edge, "compression_on_stream")["content_encoding"] == "gzip"
        assert cell.edge["response"]["t_first_byte"] >= cell.origin["response"]["t_last_byte"]


def test_gzip_bursts_are_byte_windows_before_the_end(matrix: Run) -> None:
    """Behind gzip_bursts the stream comes in equal compressed windows, the first long before
    the origin's last byte, with a stall period shorter than the stream."""
    cell = matrix.cells["gzip_bursts", "clean"]
    burst = finding(cell.edge, "burst_gaps")
    assert burst["pattern"] == "byte_window"
    assert burst["bursts"] > THRESHOLDS["burst_min_stalls"]
    origin = cell.origin["response"]
    assert 0 < burst["stall_period_s"] < origin["t_last_byte"] - origin["t_first_byte"]
    first_token = cell.edge["request"]["t_start"] + cell.edge["figures"]["ttft_s"]
    assert first_token < origin["t_last_byte"]


def test_proxy_buffers_burst_unchunked_bodies_only(matrix: Run) -> None:
    """buffer_bursts releases close-delimited and Content-Length streams in full proxy buffers
    and passes the chunked demo upstream through event by event."""
    for name in ("close_delimited", "content_length"):
        cell = matrix.cells["buffer_bursts", name]
        burst = finding(cell.edge, "burst_gaps")
        assert burst["pattern"] == "byte_window"
        origin = cell.origin["response"]
        assert 0 < burst["stall_period_s"] < origin["t_last_byte"] - origin["t_first_byte"]
        assert "burst_gaps" not in kinds(cell.origin)
    assert stream_kinds(matrix.cells["buffer_bursts", "clean"].edge) == []


def test_origin_faults_carry_their_evidence(matrix: Run) -> None:
    """Each fault the upstream plays is reported at the edge of a streaming nginx with the
    evidence that names it."""
    cells = {name: matrix.cells["streaming", name].edge for name in CASE}
    problems = finding(cells["buffered"], "buffering_headers")["problems"]
    assert {"Content-Length on a stream", "ETag on a stream"} <= set(problems)
    assert finding(cells["buffered"], "whole_body_hold")["final_burst_share"] == 1.0
    assert finding(cells["gzip"], "compression_on_stream")["content_encoding"] == "gzip"
    endings = finding(cells["crlf"], "line_endings")
    assert endings["crlf"] > 0 and endings["lf"] == endings["cr"] == 0
    assert finding(cells["emoji_split"], "split_utf8")["chunks"] > 0
    assert finding(cells["fffd"], "replacement_char")["in_text"] > 0
    assert "error event in a 200 stream" in finding(cells["error"], "truncated")["reasons"]
    assert finding(cells["not_streamed"], "not_streamed")["stream_requested"] is True
    assert finding(cells["document"], "not_streamed")["stream_requested"] is False
    severities = {n: cells[n]["findings"][0]["severity"] for n in ("not_streamed", "document")}
    assert severities == {"not_streamed": "error", "document": "warning"}


def test_nginx_gzip_drops_content_length_but_not_etag(matrix: Run) -> None:
    """Behind a gzipping nginx a body-hashing upstream is still named by its ETag alone."""
    for config in ("gzip_hold", "gzip_bursts"):
        edge = matrix.cells[config, "buffered"].edge
        assert finding(edge, "buffering_headers")["problems"] == ["ETag on a stream"]
        origin = matrix.cells[config, "buffered"].origin
        problems = finding(origin, "buffering_headers")["problems"]
        assert problems == ["Content-Length on a stream", "ETag on a stream"]


def test_cut_connection_is_an_upstream_reset_at_every_hop(matrix: Run) -> None:
    """A connection cut mid-body ends the flow as upstream_reset on both sides of any nginx."""
    for config in CONFIGS:
        cell = matrix.cells[config, "cut"]
        for rec in (cell.edge, cell.origin):
            assert rec["response"]["ended"] == "upstream_reset", config
            truncated = finding(rec, "truncated")
            assert truncated["ended"] == "upstream_reset"
            assert "upstream reset the connection" in truncated["reasons"]


# -- docs/scenarios.md -----------------------------------------------------------------------------


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _evidence(f: dict[str, Any]) -> str:
    """A finding and its key numbers, in a few words."""
    kind, ev = f["kind"], f["evidence"]
    if kind == "whole_body_hold":
        return f"{kind} (share {ev['final_burst_share']}, at {_seconds(ev['final_burst_at_s'])})"
    if kind == "burst_gaps":
        return (
            f"{kind} ({ev['bursts']} bursts of {ev['events_per_burst']:g} events, "
            f"{ev['bytes_per_burst']:g} B, every {_seconds(ev['stall_period_s'])}, "
            f"{ev['pattern']})"
        )
    if kind == "compression_on_stream":
        return f"{kind} ({ev['content_encoding']})"
    if kind == "buffering_headers":
        return f"{kind} ({'; '.join(ev['problems'])})"
    if kind == "line_endings":
        return f"{kind} (CRLF {ev['crlf']}, LF {ev['lf']})"
    if kind == "split_utf8":
        return f"{kind} ({ev['events']} events, {ev['chunks']} reads)"
    if kind == "replacement_char":
        return f"{kind} ({ev['in_text']} U+FFFD)"
    if kind == "truncated":
        return f"{kind} ({'; '.join(ev['reasons'])}; ended {ev['ended']})"
    if kind == "not_streamed":
        asked = "asked" if ev["stream_requested"] else "not asked"
        return f"{kind} ({ev['tokens']} tokens, stream {asked})"
    if kind == "stall":
        return f"{kind} ({ev['stalls']}, max gap {_seconds(ev['max_gap_s'])})"
    return str(kind)


def _findings(rec: dict[str, Any], want: Expect) -> str:
    text = "<br>".join(_evidence(f) for f in rec["findings"]) or "none"
    wrong = _mismatch(rec, want)
    return text if wrong is None else f"{text}<br>**not as expected: {wrong}**"


def _first_token_hold(rec: dict[str, Any]) -> str:
    hops = rec.get("hops") or []
    return _seconds(hops[0].get("first_token_hold_s")) if hops else "-"


def _nginx_version() -> str:
    done = subprocess.run([NGINX, "-v"], check=False, capture_output=True, text=True)
    return (done.stderr or done.stdout).strip().removeprefix("nginx version: ")


def render(run: Run) -> str:
    """docs/scenarios.md for one run of the matrix."""
    lines = [
        "# Scenario matrix: what hopmeter finds behind each nginx configuration",
        "",
        "Written by `tests/integration/test_scenarios.py` from what one run measured "
        "(`HOPMETER_WRITE_SCENARIOS=1 scripts/test tests/integration/test_scenarios.py`).",
        f"`{_nginx_version()}` (directives in `tests/harness/nginx.py`, measurements in "
        "`docs/nginx-holds.md`), one worker, everything on 127.0.0.1. Each request went",
        "",
        "    client ─► hopmeter edge ─► nginx ─► hopmeter origin ─► upstream",
        "",
        f"and every reply is {TOKENS} tokens at {RATE:g} tokens/s in OpenAI chat format, unless "
        "its row says otherwise. The upstream is `hopmeter upstream` with the row's scenario, "
        "except `close_delimited` and `content_length`, which come from a small upstream in the "
        "test (the demo upstream always sends chunked streams). The *origin* column is what the "
        "upstream did; the *edge* column is what a client behind nginx got; what differs is "
        "nginx's doing. *First-token hold* is how much later the edge saw the first token than "
        "the origin. All cases of a configuration ran at once; the numbers are from one run on "
        "a 2-CPU VM and vary from run to run, the verdicts do not (the test asserts them).",
        "",
    ]
    for config, nginx in CONFIGS.items():
        lines += [f"## `{config}`", "", nginx.effect.split(". ")[0].rstrip(".") + ".", ""]
        if run.waves.get(config, 1) > 1:
            lines += [
                f"(Run {run.waves[config]} times: in the earlier runs a listener saw a stall "
                "that no scenario plays, a pause of the host.)",
                "",
            ]
        lines += [
            "| scenario | upstream plays | edge findings | origin findings | first-token hold |",
            "| --- | --- | --- | --- | --- |",
        ]
        for case in CASES:
            cell = run.cells[config, case.name]
            lines.append(
                f"| `{case.name}` | {case.plays} "
                f"| {_findings(cell.edge, expected(case, config, 'edge'))} "
                f"| {_findings(cell.origin, expected(case, config, 'origin'))} "
                f"| {_first_token_hold(cell.edge)} |"
            )
        lines.append("")
    lines += [
        "## What it shows (each line is asserted by the test)",
        "",
        "- Nothing that streams draws a hold: clean, jittered, coalesced and stalled streams get "
        "neither `whole_body_hold` nor `burst_gaps` through `streaming` or `buffer_bursts`; the "
        "900 ms stall is one `stall` finding and nothing more.",
        "- `gzip_hold` turns every event stream into one read after the origin's last byte: "
        "`whole_body_hold` (share ≈ 1) and `compression_on_stream`. The hold explains the "
        "stall, which is no longer a finding of its own; the faults that live in the content "
        "(CRLF, U+FFFD, error event, cut) are still found.",
        "- `gzip_bursts` releases the stream in equal 256-byte compressed windows, the first long "
        "before the origin's last byte: `burst_gaps` with pattern `byte_window`.",
        "- `buffer_bursts` holds only bodies that are not chunked: 4 KiB windows for the "
        "close-delimited and Content-Length streams, while the demo upstream's chunked streams "
        "pass event by event.",
        "- nginx never forwards `X-Accel-Buffering`, so an edge sees only the origin's "
        "`Cache-Control`; `buffering_headers` asks for one of the two, not both. nginx's gzip "
        "drops Content-Length but passes the ETag on.",
        "- A cut upstream connection ends as `upstream_reset` on both sides of every config, and "
        "the client gets an incomplete chunked body.",
        "",
        f"The whole matrix took {run.seconds:.0f} s of wall time.",
    ]
    return "\n".join(lines) + "\n"
