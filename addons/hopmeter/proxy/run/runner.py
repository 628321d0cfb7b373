"""Runs hopmeter: a mitmproxy master with hopmeter's addons, until a signal stops it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mitmproxy import exceptions

from hopmeter.errors import UsageError
from hopmeter.export.outlets import STDERR, STDOUT
from hopmeter.export.prometheus import ProcessCounters
from hopmeter.pidfile import REOPEN_SIGNALS
from hopmeter.proxy import fastpath
from hopmeter.proxy.addon.chain import default_addons
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.outlets import FLUSH_FLOOR_S, OutputQueues, QueuedTermLog
from hopmeter.proxy.addon.outputs import MetricsOutput
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.addon.tokenizer_load import QUIET_POLL_S, QUIET_WAIT_MAX_S, wait_for_quiet
from hopmeter.proxy.fastpath import relay
from hopmeter.proxy.options import OPTIONS, said_by_flag
from hopmeter.proxy.run.config import ProxyConfig
from hopmeter.proxy.run.drain import Drain
from hopmeter.proxy.run.master import LeanMaster, LeanOptions

# mitmproxy closes a client connection after this long without any event (`tcp_timeout`, 600 s
# by default); hopmeter's read timeout must come first, or a silent upstream ends as an empty
# reply recorded client_gone instead of a 504 recorded upstream_timeout.
TCP_TIMEOUT_MARGIN_S = 60
# The longest another thread of the process (a long flow's record, built beside the loop:
# hopmeter.proxy.addon.aside) holds the interpreter while the loop has a read to handle: Python's
# default is 5 ms. Threads take turns this often only while both have work (bench/long_end.py).
SWITCH_INTERVAL_S = 0.001


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


MALLOC_TRIM = _malloc_trim()


def trim_heap() -> None:
    """Give the C heap's free pages back to the system. Importing hopmeter's modules and
    mapping the tokenizer leave ~0.9 MiB of freed memory in glibc's heap, resident until
    something reuses it (bare mitmdump leaves none): `malloc_trim` returns the whole free pages
    in it, in ~0.3 ms. Called at moments when no flow waits on it (FreezeAtStart)."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


class FreezeAtStart:
    """`hopmeter run` only: once every addon has loaded, move what lives as long as the process
    (mitmproxy, hopmeter's modules) out of the garbage collector's reach; again once the first
    flow has had the tokenizers' patterns compiled
    (hopmeter.proxy.addon.tokenizers.traffic_started), at a moment when no flow is in flight.

    A full collection over it takes ~25 ms, a pause every stream on the loop would feel, at a
    rate set by allocation, not by load; and every object in reach is visited again by each
    one: a tokenizer's compiled patterns, left in reach, cost instructions per event (the
    `regex` module's once cost ~3 kIr, ~1%, callgrind). The second freeze waits until no flow
    is in flight and no client connection is open: a frozen object is never collected, so a
    connection frozen open (a gateway's pooled HTTP/2 connection) would keep, once closed, all
    it ever referenced (its every flow, in mitmproxy). A connection that stays open past
    QUIET_WAIT_MAX_S leaves the patterns in reach: ~1% per event rather than memory for good.
    Each time, the C heap's free pages then go back to the system (`trim_heap`).
    It changes the whole interpreter, so the addon list that users load into their own mitmdump
    (`default_addons`) does not include it.
    """

    def __init__(self, meter: HopMeter) -> None:
        self.meter = meter
        self.loop: asyncio.AbstractEventLoop | None = None
        self.deadline = 0.0
        self.clients = 0  # client connections open now
        meter.after_patterns = self.freeze_when_quiet  # set before any flow can start

    def client_connected(self, client: Any) -> None:
        self.clients += 1

    def client_disconnected(self, client: Any) -> None:
        self.clients = max(0, self.clients - 1)

    def quiet(self) -> bool:
        """No flow in flight and no client connection open: nothing of a connection to freeze."""
        return not self.meter.live and not self.clients

    def running(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.loop = asyncio.get_running_loop()
        gc.collect()
        gc.freeze()
        trim_heap()

    def freeze_when_quiet(self) -> None:
        """From the thread that compiled the patterns: once `quiet` (within QUIET_WAIT_MAX_S,
        else never), collect and freeze on the loop's thread, where the finalizers of what a
        collection frees (asyncio's transports, streams) may run."""
        self.deadline = time.monotonic() + QUIET_WAIT_MAX_S
        wait_for_quiet(self.quiet)
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to freeze for
                self.loop.call_soon_threadsafe(self._freeze)

    def _freeze(self) -> None:
        if not self.quiet():
            if time.monotonic() < self.deadline and self.loop is not None:
                self.loop.call_later(QUIET_POLL_S, self._freeze)  # traffic came meanwhile
            return  # never quiet in time: the patterns stay in reach, no connection is frozen
        gc.collect()
        gc.freeze()
        trim_heap()


async def run_proxy(
    cfg: ProxyConfig,
    *,
    before: Callable[[], Awaitable[None]] | None = None,
    on_master: Callable[[Any], None] | None = None,
) -> int:
    """Run the proxy until SIGINT/SIGTERM (or until `on_master`'s caller shuts it down).

    The first signal drains (hopmeter.proxy.run.drain): no new connections, the flows in flight
    finish within the drain timeout; a second one stops at once. SIGHUP (or SIGUSR1, as for
    nginx) reopens the records file at its path (after a rotation) and never stops the proxy.
    Every line the process writes (records, console, mitmproxy's and hopmeter's log) goes
    through the outputs' queues (hopmeter.proxy.addon.outlets), so a stalled standard output or
    a full disk never holds a stream.
    """
    opts = LeanOptions()  # reads of immutable option values without deep copies
    queues = OutputQueues()
    # mitmdump's addons, only the live ones on the hook path (hopmeter.proxy.run.master); its log
    # lines written by the `log` output's thread, never by the loop; hopmeter's own addons where
    # `mitmdump -s` has them, but for the content views: nothing here shows a flow
    addons = default_addons(queues, views=False)
    meter, readiness, metrics = addons[0], addons[2], addons[4]
    assert isinstance(meter, HopMeter) and isinstance(readiness, Readiness)
    assert isinstance(metrics, MetricsOutput)
    metrics.setting = ("--metrics HOST:PORT", "--metrics off")  # errors name the flags
    master = LeanMaster(opts, QueuedTermLog(queues.outlets, log_target(cfg)), scripts=addons)
    drain = Drain(meter, readiness, queues.outlets)
    relays = relay.Relay(meter.relay_failed)
    master.addons.add(drain, FreezeAtStart(meter), relays)
    try:
        set_options(opts, cfg)
    except (exceptions.OptionsError, UsageError) as exc:
        # the master never runs, nor its `done`: write what was logged so far (a warning)
        queues.outlets.close(time.monotonic() + FLUSH_FLOOR_S)
        given = [item.partition("=")[0] for item in cfg.extra]
        raise UsageError(said_by_flag(str(exc), given)) from None
    # mitmproxy's connection bookkeeping mended (its list of a client connection's upstream
    # connections, a cancelled read loop's end): with or without the relay; not if the gate does
    # not know the installed mitmproxy (said when the proxy runs, as the relay's line is)
    mend_off = fastpath.mend(meter.observers.fast_path_failed)
    if not opts.hopmeter_relay:
        relays.mend_off_because = mend_off
    if opts.hopmeter_relay:
        # a streamed HTTP/1 body's reads moved past mitmproxy's layers, mitmproxy's per-read
        # drain step only when a writer could need it, its HTTP/1 framing decision kept per
        # response: all three, or none if the installed mitmproxy, h11 or Python is not one
        # they were read against (said once when the proxy runs); none with --no-relay
        relays.started(fastpath.install(meter.observers.fast_path_failed))
    if metrics.metrics is not None:
        metrics.metrics.registry.register(ProcessCounters(relay.counts))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, drain.signal)
    for sig in REOPEN_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, queues.reopen)
    if on_master is not None:
        on_master(master)
    if before is not None:
        await before()
    # the vocabulary before the listeners open (mitmproxy opens them before its `running` hook),
    # so that no request that comes early waits for it
    meter.preload()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        await master.run()
    finally:
        sys.setswitchinterval(switch)
    # asyncio.run cancels the connection tasks still open at exit; on Python 3.12 the stream
    # protocol then reports each cancellation as an error. They are not errors: stay quiet.
    loop.set_exception_handler(_quiet_cancellations)
    return 0


def log_target(cfg: ProxyConfig) -> str:
    """Where the process's log lines (and the console's text lines) go: standard error when
    standard output carries the flows' JSON lines (`--json`, `--records -`), so that a reader
    of it (jq, a log shipper) gets nothing else; otherwise standard output, as mitmdump's."""
    chosen = dict(cfg.options)
    for item in cfg.extra:  # `--set NAME=VALUE`, applied last: it wins
        name, _, value = item.partition("=")
        chosen[name] = value
    json_lines = chosen.get("hopmeter_console") == "json"
    return STDERR if json_lines or _is_stdout(chosen.get("hopmeter_records")) else STDOUT


def _is_stdout(path: object) -> bool:
    """Whether records written to `path` land where standard output goes: `-`, or a path
    naming the same file (`/dev/stdout`, `/proc/self/fd/1`, the file stdout is redirected to)."""
    if path == STDOUT:
        return True
    if not isinstance(path, str) or not path:
        return False
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError):  # no such file yet, or no stdout to compare with
        return False


def set_options(opts: LeanOptions, cfg: ProxyConfig) -> None:
    """Set the master's options: mitmproxy's that `hopmeter run` sets otherwise than mitmdump,
    the hopmeter_* options of `cfg` (from the flags), then `--set`'s. A bad value raises
    mitmproxy's OptionsError (or a UsageError) naming the option."""
    read_timeout_s = OPTIONS["hopmeter_read_timeout"].read(cfg.options["hopmeter_read_timeout"])
    # mitmproxy rolls a failed update back by configuring every addon again with the values
    # before it: from the table's defaults, the metrics endpoint would bind 127.0.0.1:9464 on
    # the way out of a bad --chaos (and, with that port taken, say so in place of the real
    # error, to a user who gave --metrics off). It starts off; the update below turns it on.
    opts.update(hopmeter_metrics="off")
    opts.update(
        # mitmproxy listens on every interface by default; hopmeter on loopback unless told
        listen_host="127.0.0.1",
        mode=cfg.modes,
        # connect to the upstream when a request has come, not when a client connects: an
        # upstream that cannot be reached is then answered 502 and recorded, instead of the
        # client's connection being closed unanswered (`--set connection_strategy=eager` still
        # wins: `extra` is applied last)
        connection_strategy="lazy",
        tcp_timeout=int(max(600, read_timeout_s + TCP_TIMEOUT_MARGIN_S)),
        **cfg.options,
    )
    if cfg.extra:
        opts.set(*cfg.extra)


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def quiet_mitmproxy_logs(verbose: bool) -> None:
    """Let hopmeter's INFO lines through; keep mitmproxy's per-connection chatter out unless asked.

    mitmproxy's own main() sets the root logger to DEBUG and filters in its console handler; a
    master built here must do the same, or every INFO line (the per-flow summary) is dropped.
    mitmproxy's proxy core logs at WARNING per connection too ("Server TLS handshake failed"):
    under a flood of failures that is a line per request, and hopmeter reports each of them
    itself, once per cause per interval (hopmeter.proxy.addon.guard). ERROR stays visible: a crash.
    """
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in ("asyncio", "hpack", "urwid", "tornado", "quic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    level = logging.DEBUG if verbose else logging.ERROR
    for name in ("mitmproxy.proxy.server", "mitmproxy.proxy.layers"):
        logging.getLogger(name).setLevel(level)
