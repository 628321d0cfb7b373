"""Tests for hopmeter.export.server: /metrics and /healthz over real HTTP on 127.0.0.1."""

from __future__ import annotations

import errno
import gzip
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from hopmeter.errors import PortError, UsageError
from hopmeter.export import server as server_module
from hopmeter.export.prometheus import Metrics
from hopmeter.export.server import WithoutCreated, serve
from tests.export.test_prometheus import TRACE, flow_record

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"


def _get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    """Status, content type and body of one GET."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


@pytest.fixture
def metrics() -> Metrics:
    """Metrics on a fresh registry, with one flow and one segment's holds observed."""
    metrics = Metrics(CollectorRegistry())
    metrics.observe_flow(flow_record())
    metrics.observe_holds("edge>origin", [0.001, 0.5], TRACE)
    return metrics


@pytest.mark.loopback
def test_serve_binds_loopback_and_answers_metrics_and_healthz(metrics: Metrics) -> None:
    """serve() binds 127.0.0.1 by default and answers /metrics (both formats) and /healthz."""
    server = serve(metrics, port=0)
    try:
        assert server.host == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        base = f"http://127.0.0.1:{server.port}"
        status, ctype, body = _get(f"{base}/healthz")
        assert (status, body.strip()) == (200, "ok")
        status, ctype, body = _get(f"{base}/metrics")
        assert ctype.startswith("text/plain") and "hopmeter_flows_total" in body
        assert "trace_id" not in body
        status, ctype, body = _get(f"{base}/metrics", OPENMETRICS)
        assert ctype.startswith("application/openmetrics-text")
        assert f'trace_id="{TRACE}"' in body
        assert body.endswith("# EOF\n")
    finally:
        server.close()


@pytest.mark.loopback
def test_other_paths_are_not_found(metrics: Metrics) -> None:
    """A path other than /metrics and /healthz is a 404 naming the two."""
    server = serve(metrics, port=0)
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(f"http://127.0.0.1:{server.port}/")
        assert info.value.code == 404
        assert b"/metrics" in info.value.read()
    finally:
        server.close()


@pytest.mark.loopback
def test_readyz_answers_what_the_check_says(metrics: Metrics) -> None:
    """/readyz is 200 or 503 with the check's reason; without a check it does not exist."""
    answers = iter([(False, "127.0.0.1:8000 connect_refused (ECONNREFUSED)"), (True, "up")])
    server = serve(metrics, port=0, ready=lambda: next(answers))
    bare = serve(metrics, port=0)
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(f"http://127.0.0.1:{server.port}/readyz")
        assert info.value.code == 503
        body = info.value.read()
        info.value.close()
        assert body == b"not ready: 127.0.0.1:8000 connect_refused (ECONNREFUSED)\n"
        assert _get(f"http://127.0.0.1:{server.port}/readyz") == (
            200,
            "text/plain; charset=utf-8",
            "ready: up\n",
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(f"http://127.0.0.1:{bare.port}/readyz")
        assert info.value.code == 404
        info.value.close()
    finally:
        server.close()
        bare.close()


@pytest.mark.loopback
def test_no_created_series(metrics: Metrics) -> None:
    """No `_created` series is served, in either format (docs/design.md §8)."""
    assert "_created" in generate_latest(metrics.registry).decode()  # the registry has them
    view = WithoutCreated(metrics.registry)
    assert "_created" not in generate_latest(view).decode()
    assert "_created" not in generate_openmetrics(view).decode()
    server = serve(metrics, port=0)
    try:
        for accept in (None, OPENMETRICS):
            body = _get(f"http://127.0.0.1:{server.port}/metrics", accept)[2]
            assert "hopmeter_flows_total" in body and "_created" not in body
    finally:
        server.close()


def test_the_view_keeps_every_other_sample(metrics: Metrics) -> None:
    """Leaving out `_created` changes nothing else: same families, samples and exemplars."""
    families = {f.name: f for f in metrics.registry.collect()}
    shown = {f.name: f for f in WithoutCreated(metrics.registry).collect()}
    assert shown.keys() == families.keys()
    for name, family in families.items():
        kept = [s for s in family.samples if not s.name.endswith("_created")]
        assert shown[name].samples == kept, name
        assert (shown[name].type, shown[name].documentation) == (family.type, family.documentation)
    assert any(s.exemplar for f in shown.values() for s in f.samples)


@pytest.mark.loopback
def test_name_filtering_still_works(metrics: Metrics) -> None:
    """/metrics?name[]=... serves only the samples named, still without `_created`."""
    server = serve(metrics, port=0)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics?name[]=hopmeter_flows_total"
        for accept in (None, OPENMETRICS):
            body = _get(f"{url}&name[]=hopmeter_flows_created", accept)[2]
            names = {line.split("{")[0] for line in body.splitlines() if line[:1] not in "#"}
            assert names == {"hopmeter_flows_total"}, body
    finally:
        server.close()


@pytest.mark.loopback
def test_gzip_is_served_when_asked_for(metrics: Metrics) -> None:
    """A scraper that accepts gzip gets the same exposition compressed."""
    server = serve(metrics, port=0)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics", headers={"Accept-Encoding": "gzip"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            body = gzip.decompress(response.read()).decode()
        assert body == generate_latest(WithoutCreated(metrics.registry)).decode()
    finally:
        server.close()


@pytest.mark.loopback
def test_serve_accepts_a_bare_registry() -> None:
    """serve() takes a registry as well as a Metrics."""
    server = serve(CollectorRegistry(), "127.0.0.1", 0)
    try:
        assert _get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        server.close()


@pytest.mark.loopback
def test_a_port_in_use_raises_port_error() -> None:
    """Binding a taken port raises PortError (a UsageError) naming the port and the fix."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortError) as info:
            serve(CollectorRegistry(), "127.0.0.1", port)
    assert isinstance(info.value, UsageError)
    message = str(info.value)
    assert f"metrics port {port} on 127.0.0.1 is already in use" in message
    assert "--metrics HOST:PORT" in message and "--metrics off" in message


def test_an_address_that_does_not_resolve_raises_port_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host name that does not resolve raises PortError naming the address and the fix."""

    def unknown(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    with pytest.raises(PortError) as info:
        serve(CollectorRegistry(), "llm-metrics.internal", 9464)
    message = str(info.value)
    assert message.startswith("metrics address llm-metrics.internal:9464 does not resolve")
    assert "--metrics HOST:PORT" in message and "--metrics off" in message


@pytest.mark.loopback
def test_close_frees_the_port() -> None:
    """After close() the same port can be served again."""
    server = serve(CollectorRegistry(), port=0)
    port = server.port
    server.close()
    again = serve(CollectorRegistry(), port=port)
    again.close()
    assert not server._thread.is_alive()


def _wakeups(native_id: int) -> int:
    """How many times a thread of this process has been woken (gone to sleep and back)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(
        next(line for line in status.splitlines() if line.startswith("voluntary_ctxt")).split()[1]
    )


@pytest.mark.loopback
def test_an_idle_endpoint_sleeps_until_asked() -> None:
    """The endpoint's thread wakes for a request and for close(), never on a poll: an idle
    sidecar's metrics endpoint costs no wake-ups, and closing it waits for no poll interval."""
    server = serve(CollectorRegistry(), port=0)
    try:
        _get(f"http://127.0.0.1:{server.port}/healthz")
        native_id = server._thread.native_id
        assert native_id is not None
        before, deadline = _wakeups(native_id), time.monotonic() + 10
        while time.monotonic() < deadline:  # until the thread is back in its wait, settled
            time.sleep(0.1)
            if (now := _wakeups(native_id)) == before:
                break
            before = now
        time.sleep(1.2)  # socketserver's serve_forever would have polled twice
        assert _wakeups(native_id) == before
        _get(f"http://127.0.0.1:{server.port}/healthz")  # and it still answers
    finally:
        server.close()
    assert not server._thread.is_alive()


def _handler_threads() -> int:
    """Threads socketserver started to answer a connection (none for a silent one)."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


@pytest.mark.loopback
def test_silent_connections_never_keep_a_liveness_probe_from_its_answer(
    metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections that send nothing hold no thread and never keep /healthz or /readyz from
    their answer: past MAX_PENDING the one waiting longest is closed and counted."""
    monkeypatch.setattr(server_module, "MAX_PENDING", 40)
    server = serve(metrics, port=0, ready=lambda: (True, "up"))
    idle: list[socket.socket] = []
    threads = _handler_threads()
    try:
        for _ in range(server_module.MAX_PENDING):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        idle[-1].sendall(b"GET /metrics HTTP/1.1\r\n")  # half a head: waits as the others do
        base = f"http://127.0.0.1:{server.port}"
        assert _get(f"{base}/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        assert idle[0].recv(1) == b""  # the one waiting longest made room for the probe
        refused = "hopmeter_metrics_connections_refused_total"
        assert metrics.registry.get_sample_value(refused) == 1
        assert _get(f"{base}/readyz")[2] == "ready: up\n"  # the probe's place, free again
        assert metrics.registry.get_sample_value(refused) == 1
        assert _handler_threads() <= threads  # no thread for any silent one
        assert "hopmeter_flows_total" in _get(f"{base}/metrics")[2]
    finally:
        for conn in idle:
            conn.close()
        server.close()
    # closed, the endpoint's counter leaves the registry with it (a new endpoint brings its own)
    assert metrics.registry.get_sample_value("hopmeter_metrics_connections_refused_total") is None
    serve(metrics, port=0).close()


@pytest.mark.loopback
def test_a_connection_that_sends_nothing_is_closed_after_its_timeout(
    metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One that sends nothing (or half a head) is closed, silent as it was, once its timeout
    passed; that is no refusal."""
    monkeypatch.setattr(server_module, "CONNECTION_TIMEOUT_S", 0.5)
    server = serve(metrics, port=0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent:
            silent.sendall(b"GET /metri")
            assert silent.recv(1) == b""  # closed unanswered (recv waits up to 10 s for it)
        refused = "hopmeter_metrics_connections_refused_total"
        assert metrics.registry.get_sample_value(refused) == 0
    finally:
        server.close()


@pytest.mark.loopback
def test_scrapes_past_the_limit_are_answered_busy_and_counted(
    metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_CONNECTIONS scrapes at once hold a thread each; one more is answered 503 at once and
    counted, and /healthz is still answered meanwhile."""
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 2)
    release = threading.Event()

    class Slow:
        """A collector that takes as long as the test says."""

        def collect(self) -> Iterator[Metric]:
            release.wait(10)
            return iter(())

    metrics.registry.register(Slow())  # type: ignore[arg-type]
    server = serve(metrics, port=0)
    base = f"http://127.0.0.1:{server.port}"
    with ThreadPoolExecutor(2) as pool:
        try:
            slow = [pool.submit(_get, f"{base}/metrics") for _ in range(2)]
            deadline = time.monotonic() + 10
            while server._server.slots._value and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.01)  # until both are taken by their threads
            with pytest.raises(urllib.error.HTTPError) as busy:
                _get(f"{base}/metrics")
            assert busy.value.code == 503
            assert busy.value.read() == b"busy: too many scrapes at once\n"
            busy.value.close()
            assert _get(f"{base}/healthz")[0] == 200
        finally:
            release.set()
            statuses = [f.result(10)[0] for f in slow]
            server.close()
    assert statuses == [200, 200]
    assert metrics.registry.get_sample_value("hopmeter_metrics_connections_refused_total") is None


@pytest.mark.loopback
def test_a_failing_readiness_check_is_a_500_and_the_endpoint_goes_on(metrics: Metrics) -> None:
    """/readyz is answered by the endpoint's own thread: a check that raises is answered 500,
    and the endpoint still answers what comes next."""

    def broken() -> tuple[bool, str]:
        raise RuntimeError("bug")

    server = serve(metrics, port=0, ready=broken)
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            _get(f"http://127.0.0.1:{server.port}/readyz")
        assert failed.value.code == 500
        failed.value.close()
        assert _get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        server.close()


@pytest.mark.loopback
def test_with_no_descriptor_free_the_endpoint_waits_instead_of_spinning() -> None:
    """accept() failing for want of a descriptor leaves the listener readable: the endpoint's
    thread leaves it alone a while (ACCEPT_PAUSE_S) instead of trying again at once, a busy
    loop on a process already at its limit. Another failure (a client gone) is no reason."""
    listener = socket.create_server(("127.0.0.1", 0))
    calls: list[float] = []

    class Exhausted:
        """The listening socket, whose accept() fails as a process at its limit sees it."""

        def fileno(self) -> int:
            return listener.fileno()

        def setblocking(self, flag: bool) -> None:
            listener.setblocking(flag)

        def accept(self) -> tuple[socket.socket, Any]:
            calls.append(time.monotonic())
            raise OSError(errno.EMFILE, "Too many open files")

    server: Any = SimpleNamespace(socket=Exhausted(), refused=None, shutdown_request=None)
    wake, heard = socket.socketpair()
    thread = threading.Thread(target=server_module._serve, args=(server, heard), daemon=True)
    with listener, socket.create_connection(listener.getsockname()):  # readable from now on
        thread.start()
        time.sleep(1.5)
        wake.close()
        thread.join(5)
    assert not thread.is_alive()
    assert 1 <= len(calls) <= 3, len(calls)  # once, then once a second: never a busy loop
    gone = SimpleNamespace(socket=SimpleNamespace(accept=_raises(errno.ECONNABORTED)))
    assert server_module._Heads(gone, None).accept() is True  # type: ignore[arg-type]


def _raises(code: int) -> Any:
    def accept() -> None:
        raise OSError(code, "")

    return accept


@pytest.mark.loopback
def test_a_request_head_too_large_is_answered_431_and_counted(metrics: Metrics) -> None:
    """A head past MAX_HEAD_BYTES without its end is answered 431 and counted as refused."""
    server = serve(metrics, port=0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            conn.sendall(
                b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (server_module.MAX_HEAD_BYTES + 10)
            )
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 431 ")
        refused = "hopmeter_metrics_connections_refused_total"
        assert metrics.registry.get_sample_value(refused) == 1
    finally:
        server.close()
