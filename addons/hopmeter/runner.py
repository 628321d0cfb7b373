"""Runs hopmeter: a mitmproxy master with the HopMeter addon, and optionally the demo upstream."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hopmeter.core.frames import HopmeterError


class UsageError(HopmeterError):
    """A flag or value the user gave that cannot work; the message names the fix."""


@dataclass(slots=True, kw_only=True)
class ProxyConfig:
    """What `hopmeter run` was asked to do, validated."""

    modes: list[str]
    listener_names: list[str] = field(default_factory=list)  # NAME=MODE, as given
    hop: str = "proxy"
    records: str = ""
    metrics: str = "127.0.0.1:9464"
    stall_threshold_s: float = 0.5
    tokenizer: str = ""
    log_content: bool = False
    trace_header: bool = True
    otel_endpoint: str = ""
    chaos: str = ""
    chaos_seed: int = 0
    console: str = "text"  # "text" | "json" | "off"
    summary_interval_s: float = 60.0
    extra: list[str] = field(default_factory=list)  # --set NAME=VALUE


def parse_hostport(value: str, flag: str) -> tuple[str, int]:
    """HOST:PORT (or PORT alone, on 127.0.0.1) as a pair; a clear error otherwise."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        host, port_s = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_s)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise UsageError(f"{flag} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080") from None
    return host, port


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail early, with the fix, when a port is taken (mitmproxy would only log and exit)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"{what} {host}:{port} is already in use; stop what listens there or pick "
                    f"another port"
                ) from None
            raise UsageError(f"{what} {host}:{port} cannot be opened: {exc.strerror}") from None


def mode_listen_address(mode: str) -> tuple[str, int] | None:
    """The address a mitmproxy mode spec listens on, when it names one."""
    from mitmproxy.proxy.mode_specs import ProxyMode  # noqa: PLC0415 - mitmproxy is heavy

    try:
        spec = ProxyMode.parse(mode)
    except ValueError as exc:
        raise UsageError(
            f"listener mode {mode!r}: {exc}; e.g. reverse:http://127.0.0.1:9000@8081"
        ) from None
    port = spec.listen_port()
    if port is None:
        return None
    return spec.listen_host("127.0.0.1"), port


async def run_proxy(
    cfg: ProxyConfig,
    *,
    before: Callable[[], Awaitable[None]] | None = None,
    on_master: Callable[[Any], None] | None = None,
) -> int:
    """Run the proxy until SIGINT/SIGTERM (or until `on_master`'s caller shuts it down)."""
    from mitmproxy import exceptions, options  # noqa: PLC0415
    from mitmproxy.tools.dump import DumpMaster  # noqa: PLC0415

    from hopmeter.metrics_addon import make_addons  # noqa: PLC0415

    opts = options.Options()
    master = DumpMaster(opts, with_termlog=True, with_dumper=False)
    drop_legacy_log_events()
    master.addons.add(*make_addons())
    try:
        opts.update(
            # mitmproxy listens on every interface by default; hopmeter on loopback unless told
            listen_host="127.0.0.1",
            mode=cfg.modes,
            hopmeter_hop=cfg.hop,
            hopmeter_listeners=cfg.listener_names,
            hopmeter_records=cfg.records,
            hopmeter_metrics=cfg.metrics,
            hopmeter_stall_threshold=cfg.stall_threshold_s,
            hopmeter_tokenizer=cfg.tokenizer,
            hopmeter_log_content=cfg.log_content,
            hopmeter_trace_header=cfg.trace_header,
            hopmeter_otel_endpoint=cfg.otel_endpoint,
            hopmeter_chaos=cfg.chaos,
            hopmeter_chaos_seed=cfg.chaos_seed,
            hopmeter_console=cfg.console,
            hopmeter_summary_interval=cfg.summary_interval_s,
        )
        if cfg.extra:
            opts.set(*cfg.extra)
    except exceptions.OptionsError as exc:
        raise UsageError(str(exc)) from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, master.shutdown)
    if on_master is not None:
        on_master(master)
    if before is not None:
        await before()
    await master.run()
    # asyncio.run cancels the connection tasks still open at exit; on Python 3.12 the stream
    # protocol then reports each cancellation as an error. They are not errors: stay quiet.
    loop.set_exception_handler(_quiet_cancellations)
    return 0


def drop_legacy_log_events() -> None:
    """Stop mitmproxy turning every log record into an `add_log` event.

    A Master installs a handler that, for each record, wakes the event loop through its self-pipe
    and calls every addon's `add_log` hook, a hook deprecated since mitmproxy 9 that no addon here
    implements. hopmeter logs a line per flow: that cost ~70 µs of CPU per flow of ~1,950 (five-
    event flows, as in the bench soak). The records still reach the console through mitmproxy's
    terminal log handler.
    """
    from mitmproxy import log as mitmlog  # noqa: PLC0415

    legacy = getattr(mitmlog, "LegacyLogEvents", None)  # gone in a later mitmproxy: nothing to do
    if legacy is None:
        return
    for handler in list(logging.getLogger().handlers):
        if isinstance(handler, legacy):
            logging.getLogger().removeHandler(handler)


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def quiet_mitmproxy_logs(verbose: bool) -> None:
    """Let hopmeter's INFO lines through; keep mitmproxy's per-connection chatter out unless asked.

    mitmproxy's own main() sets the root logger to DEBUG and filters in its console handler; a
    master built here must do the same, or every INFO line (the per-flow summary) is dropped.
    """
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in ("asyncio", "hpack", "urwid", "tornado", "quic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    level = logging.DEBUG if verbose else logging.WARNING
    for name in ("mitmproxy.proxy.server", "mitmproxy.proxy.layers"):
        logging.getLogger(name).setLevel(level)


def listen_addresses(modes: Sequence[str]) -> list[tuple[str, int]]:
    """Every address the given modes will listen on."""
    out = []
    for mode in modes:
        addr = mode_listen_address(mode)
        if addr is not None:
            out.append(addr)
    return out
