"""The runner's parts, in process: the addon list, what the runner alone changes in the process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.test import taddons

from hopmeter.errors import UsageError
from hopmeter.proxy import fastpath
from hopmeter.proxy.addon.chain import default_addons
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.fastpath.relay import Relay
from hopmeter.proxy.options import run_options
from hopmeter.proxy.run import runner
from hopmeter.proxy.run.config import ProxyConfig
from hopmeter.proxy.run.drain import Drain
from hopmeter.proxy.run.runner import (
    FreezeAtStart,
    log_target,
    quiet_mitmproxy_logs,
    set_options,
)
from tests.harness.procs import until

SSE = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"model":"gpt-4o"}\n\n'
DONE = b"data: [DONE]\n\n"


def test_freeze_at_start_moves_what_exists_out_of_the_collectors_reach() -> None:
    """Once running, what was allocated before is frozen, so full collections skip it."""
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    FreezeAtStart(HopMeter()).running()
    assert gc.get_freeze_count() > 0


def test_freeze_at_start_gives_the_heaps_free_pages_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once running, after the collection, the C heap is trimmed (glibc's malloc_trim, where
    the C library has it), and trimming is harmless to call again."""
    calls: list[int] = []
    monkeypatch.setattr(runner, "MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
    FreezeAtStart(HopMeter()).running()
    assert calls == [0]
    monkeypatch.undo()
    runner.trim_heap()  # the real one (or nothing, off glibc)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Gives back to the collector whatever a test froze."""
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_what_the_first_flow_compiled_is_frozen_once_no_flow_is_in_flight() -> None:
    """The tokenizers' patterns, compiled in a thread at the first flow, are frozen too: only
    once no flow is in flight (so a flow's own objects stay collectable), and on the loop's
    thread (where the finalizers a collection runs may touch the loop's transports)."""
    meter = HopMeter()
    freeze = FreezeAtStart(meter)
    assert meter.after_patterns == freeze.freeze_when_quiet  # what traffic_started will call
    frozen_on: list[str] = []
    really_freeze = freeze._freeze

    def freezing() -> None:
        frozen_on.append(threading.current_thread().name)
        really_freeze()

    freeze._freeze = freezing  # type: ignore[method-assign]

    async def scenario() -> None:
        freeze.running()
        gc.unfreeze()
        meter.live["f"] = None  # type: ignore[assignment]  # a flow in flight
        thread = threading.Thread(target=freeze.freeze_when_quiet, name="patterns")
        thread.start()
        await asyncio.sleep(0.3)
        assert thread.is_alive() and gc.get_freeze_count() == 0  # waits for the flow to end
        meter.live.clear()
        await until(gc.get_freeze_count, what="the heap frozen once no flow is in flight")
        thread.join(10)
        assert gc.get_freeze_count() > 0

    asyncio.run(scenario())
    assert frozen_on == [threading.main_thread().name]


@pytest.mark.usefixtures("unfrozen")
def test_a_client_connection_open_is_never_frozen() -> None:
    """A frozen object is never collected: a connection frozen open (a pooled HTTP/2 one)
    would keep all it ever referenced once closed. The second freeze waits for no flow in
    flight and no client connection open; never quiet in time, it does not freeze at all."""
    meter = HopMeter()
    freeze = FreezeAtStart(meter)

    async def scenario() -> None:
        freeze.running()
        gc.unfreeze()
        freeze.client_connected(object())  # a keep-alive connection between its requests
        thread = threading.Thread(target=freeze.freeze_when_quiet, name="patterns")
        thread.start()
        await asyncio.sleep(0.3)
        assert not meter.live and gc.get_freeze_count() == 0  # no flow, but a connection open
        freeze.client_disconnected(object())
        await until(gc.get_freeze_count, what="the heap frozen once the connection closed")
        thread.join(10)
        gc.unfreeze()
        freeze.client_connected(object())  # open past the deadline: never frozen
        freeze.deadline = 0.0
        freeze._freeze()
        await asyncio.sleep(0.1)
        assert gc.get_freeze_count() == 0

    asyncio.run(scenario())


NAMES = ("", "asyncio", "hpack", "mitmproxy.proxy.server", "mitmproxy.proxy.layers", "hopmeter")


@pytest.fixture
def log_levels() -> Iterator[None]:
    """Puts the loggers' levels back as they were."""
    before = {name: logging.getLogger(name).level for name in NAMES}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("log_levels")
def test_quiet_logs_let_hopmeters_lines_through_and_keep_connection_chatter_out() -> None:
    """Quiet: hopmeter's INFO lines pass; mitmproxy's per-connection INFO and WARNING lines (a
    "Server TLS handshake failed" per request under a failure flood) and asyncio's do not; its
    errors (a crash) do."""
    quiet_mitmproxy_logs(False)
    assert logging.getLogger("hopmeter").isEnabledFor(logging.INFO)
    assert not logging.getLogger("hopmeter").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("mitmproxy.proxy.server").isEnabledFor(logging.INFO)
    assert not logging.getLogger("mitmproxy.proxy.layers.http").isEnabledFor(logging.INFO)
    assert not logging.getLogger("asyncio").isEnabledFor(logging.INFO)
    assert not logging.getLogger("mitmproxy.proxy.layers.tls").isEnabledFor(logging.WARNING)
    assert logging.getLogger("mitmproxy.proxy.server").isEnabledFor(logging.ERROR)


@pytest.mark.usefixtures("log_levels")
def test_verbose_logs_let_mitmproxys_connection_lines_through() -> None:
    """Verbose: mitmproxy's connection logs pass down to DEBUG; asyncio's chatter stays out."""
    quiet_mitmproxy_logs(True)
    assert logging.getLogger("hopmeter").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("mitmproxy.proxy.server").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("asyncio").isEnabledFor(logging.INFO)


@contextlib.contextmanager
def run_master_options() -> Iterator[Any]:
    """mitmproxy's options with hopmeter run's addons (and mitmproxy's proxy server) loaded."""
    addons = default_addons()
    meter = addons[0]
    assert isinstance(meter, HopMeter)
    drain, relay = Drain(meter), Relay(meter.relay_failed)
    with taddons.context(*addons, drain, relay, Proxyserver()) as tctx:
        yield tctx.options


MODES = ["reverse:http://127.0.0.1:9@127.0.0.1:0"]
QUIET = {"hopmeter_metrics": "off"}  # no metrics server on a port another test may hold


def test_hopmeter_run_sets_its_options_then_the_ones_passed_through() -> None:
    """The options made from the flags are set with mitmproxy's that `hopmeter run` changes
    (loopback, the lazy connection strategy), then `--set`'s values, which win."""
    cfg = ProxyConfig(
        modes=MODES,
        options=run_options(hopmeter_hop="edge", hopmeter_stall_threshold="300ms", **QUIET),
        extra=["hopmeter_chaos_seed=7", "hopmeter_hop=origin"],
    )
    with run_master_options() as opts:
        set_options(opts, cfg)
        assert (opts.listen_host, opts.connection_strategy) == ("127.0.0.1", "lazy")
        assert (opts.hopmeter_stream, opts.hopmeter_keep_body) == ("all", "0")
        assert opts.hopmeter_stall_threshold == "300ms"
        assert (opts.hopmeter_chaos_seed, opts.hopmeter_hop) == (7, "origin")


def test_a_refused_option_binds_no_metrics_endpoint_on_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mitmproxy undoes a failed update by configuring the addons with the values before it:
    with `--metrics off --chaos bogus` that bound the default 127.0.0.1:9464 (and with the port
    taken, the error said so instead of naming --chaos). The endpoint starts off: a refused
    update binds nothing."""
    bound: list[tuple[str, int]] = []

    def serve(metrics: object, host: str, port: int, *args: object, **kwargs: object) -> None:
        bound.append((host, port))

    monkeypatch.setattr("hopmeter.proxy.addon.outputs.serve", serve)
    bad = run_options(hopmeter_chaos="bogus", **QUIET)
    with run_master_options() as opts:
        with pytest.raises(exceptions.OptionsError, match=r"^hopmeter_chaos: unknown chaos"):
            set_options(opts, ProxyConfig(modes=MODES, options=bad))
        assert bound == [] and opts.hopmeter_metrics == "off"


def test_mitmproxys_tcp_timeout_outlasts_the_read_timeout() -> None:
    """mitmproxy's idle timeout stays past hopmeter's read timeout (600 s at least), so a silent
    upstream is answered 504 by hopmeter before mitmproxy closes the connection; a read timeout
    that is no duration is one line naming it."""
    with run_master_options() as opts:
        set_options(opts, ProxyConfig(modes=MODES, options=run_options(**QUIET)))
        assert opts.tcp_timeout == 660
        longer = run_options(hopmeter_read_timeout="900", **QUIET)
        set_options(opts, ProxyConfig(modes=MODES, options=longer))
        assert opts.tcp_timeout == 960
        bad = run_options(hopmeter_read_timeout="15m", **QUIET)
        with pytest.raises(UsageError, match=r"^hopmeter_read_timeout '15m'"):
            set_options(opts, ProxyConfig(modes=MODES, options=bad))


@pytest.mark.loopback
def test_the_interpreter_switches_threads_each_millisecond_while_hopmeter_runs() -> None:
    """While the proxy runs, another thread (a long flow's record, built beside the loop) holds
    the interpreter at most SWITCH_INTERVAL_S when the loop has work; Python's own interval is
    back once it stops."""
    before = sys.getswitchinterval()
    running: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    listened: list[tuple[str, int]] = []

    def on_master(master: Any) -> None:
        async def look() -> None:
            # once it listens, its listener closed first: mitmproxy closes none at shutdown (a
            # process's exit does), and a listening socket left to the collector warned in
            # whichever later test ran then
            servers = master.addons.get("proxyserver").servers
            while not (len(servers) and all(s.is_running for s in servers)):
                await asyncio.sleep(0.01)
            running.append(sys.getswitchinterval())
            listened.extend(master.addons.get("proxyserver").listen_addrs())
            await servers.update([])  # a process would exit here
            master.shutdown()

        tasks.append(asyncio.get_running_loop().create_task(look()))

    # no relay: installing it changes mitmproxy's classes for the rest of the process; the mend
    # of mitmproxy's connection list is installed either way, and taken away again here
    cfg = ProxyConfig(modes=MODES, options=run_options(hopmeter_relay=False, **QUIET))
    try:
        assert asyncio.run(runner.run_proxy(cfg, on_master=on_master)) == 0
        assert fastpath.installed() == ["connections"]
    finally:
        fastpath.uninstall()
    assert running == [runner.SWITCH_INTERVAL_S]
    assert sys.getswitchinterval() == before != runner.SWITCH_INTERVAL_S
    with pytest.raises(ConnectionRefusedError):  # nothing left listening
        socket.create_connection(listened[0][:2], timeout=5).close()


def test_the_log_goes_to_stderr_when_stdout_carries_the_flows_json_lines() -> None:
    """--json and --records - put JSON lines on stdout: the log moves to stderr (a `--set`
    of either option counts, and wins over the flags, as it is applied last)."""

    def target(extra: list[str] | None = None, **options: Any) -> str:
        return log_target(
            ProxyConfig(modes=[], options={**run_options(), **options}, extra=extra or [])
        )

    assert target() == "-"
    assert target(hopmeter_console="json") == "stderr"
    assert target(hopmeter_records="-") == "stderr"
    assert target(hopmeter_records="flows.jsonl") == "-"
    assert target(["hopmeter_console=json"]) == "stderr"
    assert target(["hopmeter_console=text"], hopmeter_console="json") == "-"


def test_a_records_path_naming_stdout_counts_as_stdout(tmp_path: Path) -> None:
    """`--records /dev/stdout` (or any path to the file stdout writes to) moves the log to
    stderr as `-` does; another file does not."""
    redirected = tmp_path / "out.jsonl"
    other = tmp_path / "flows.jsonl"
    other.touch()

    def target(records: str) -> str:
        cfg = ProxyConfig(modes=[], options={**run_options(), "hopmeter_records": records})
        return log_target(cfg)

    saved = os.dup(1)
    try:
        with redirected.open("w") as out:
            os.dup2(out.fileno(), 1)  # the process's stdout is the file, as with `> out.jsonl`
        with open(1, "w", closefd=False) as fd1, contextlib.redirect_stdout(fd1):
            assert target("/dev/stdout") == "stderr"
            assert target("/proc/self/fd/1") == "stderr"
            assert target(str(redirected)) == "stderr"
            assert target(str(other)) == "-"
            assert target(str(tmp_path / "not-yet.jsonl")) == "-"
    finally:
        os.dup2(saved, 1)
        os.close(saved)
