"""`hopmeter run`: its flags, checked into a ProxyConfig before anything starts, and the run."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from hopmeter.argtypes import check_port_free, parse_hostport, parse_listener
from hopmeter.env import bind_env, source
from hopmeter.errors import UsageError
from hopmeter.pidfile import ignore_hangup, pid_file
from hopmeter.proxy.options import FLAGS, OPTIONS, add_flags, run_options
from hopmeter.proxy.run.config import ProxyConfig, listen_addresses
from hopmeter.proxy.run.listen import tune_listeners
from hopmeter.proxy.run.loops import loop_factory

# With --workers, the parent waits this long past the drain timeout for its workers to end the
# streams still in flight, write their records and exit, before it kills them.
STOP_MARGIN_S = 10.0
# --listen's default: told apart from a --listen that was given
LISTEN_DEFAULT = next(s.default for s in FLAGS if s.flag == "--listen")
# addresses that listen on every interface: a port bound there is bound on each address
ANY_HOST = frozenset({"0.0.0.0", "::", ""})


def add_parser(sub: Any) -> None:
    """The `run` subcommand, added to an argparse subparsers object: its flags are the table of
    settings' (hopmeter.proxy.options), each also read from its HOPMETER_* variable."""
    p = sub.add_parser("run", help="measure a reverse proxy in front of UPSTREAM_URL")
    add_flags(p)
    p.set_defaults(func=run)
    bind_env(p)


def proxy_config(args: argparse.Namespace, upstream: str) -> ProxyConfig:
    """Validate `run`'s flags into a ProxyConfig."""
    if args.listener:
        flag = source(args, "listener", "--listener")
        if args.upstream is not None or args.listen != LISTEN_DEFAULT:
            given = (
                "UPSTREAM_URL" if args.upstream is not None else source(args, "listen", "--listen")
            )
            raise UsageError(
                f"{given} and {flag} do not go together: each listener's mode names its own "
                f"address and upstream (NAME=reverse:http://UPSTREAM@HOST:PORT); drop {given} "
                f"or add it as one more {flag}"
            )
        modes = [parse_listener(pair, flag)[1] for pair in args.listener]
    else:
        if not upstream.startswith(("http://", "https://")):
            raise UsageError(
                f"{source(args, 'upstream', 'upstream')} {upstream!r}: expected an http:// or "
                f"https:// URL"
            )
        host, port = parse_hostport(args.listen, source(args, "listen", "--listen"))
        modes = [f"reverse:{upstream}@{host}:{port}"]
    for pair in args.set_:
        if "=" not in pair:
            raise UsageError(
                f"{source(args, 'set_', '--set')} {pair!r}: expected NAME=VALUE, e.g. --set "
                f"keep_host_header=true"
            )
    if args.chaos_seed and not args.chaos:
        raise UsageError(
            f"{source(args, 'chaos_seed', '--chaos-seed')} seeds --chaos, which is not on: give "
            "--chaos ACTIONS too, or drop the seed"
        )
    if args.metrics.lower() != "off":
        parse_hostport(args.metrics, source(args, "metrics", "--metrics"))
    if args.records and args.records != "-":
        parent = Path(args.records).expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(
                f"{source(args, 'records', '--records')} {args.records}: folder {parent} does "
                f"not exist"
            )
    return ProxyConfig(modes=modes, options=run_options(args), extra=list(args.set_))


def check_ports(cfg: ProxyConfig) -> None:
    """Every port hopmeter will bind must be free, and bound once; say which is not."""
    listening = listen_addresses(cfg.modes)
    metrics = None if cfg.metrics.lower() == "off" else parse_hostport(cfg.metrics, "--metrics")
    if metrics is not None:  # before anything is bound: one port asked for twice
        host, port = metrics
        for lhost, lport in listening:
            if port == lport and (host == lhost or ANY_HOST & {host, lhost}):
                raise UsageError(
                    f"the metrics address {host}:{port} is also a listen address "
                    f"({lhost}:{lport}); give the metrics endpoint another port with "
                    f"--metrics HOST:PORT"
                )
    for host, port in listening:
        check_port_free(host, port, "listen address")
    if metrics is not None:
        check_port_free(*metrics, "metrics address")


def run(args: argparse.Namespace) -> int:
    """`hopmeter run`: one proxy process, or `--workers N` of them."""
    ignore_hangup()  # until the loop's handler reopens the records on it
    with pid_file(args.pid_file if args.worker_index is None else ""):
        if args.workers > 1 and args.worker_index is None:
            return _run_workers(args)
        factory = loop_factory(args.loop)  # uvloop missing: one line before anything starts
        return asyncio.run(_run(args), loop_factory=factory)


async def _run(args: argparse.Namespace) -> int:
    # mitmproxy takes most of a second to import: only the command that runs it pays for it
    from hopmeter.proxy.run.runner import quiet_mitmproxy_logs, run_proxy  # noqa: PLC0415

    # validate everything before starting anything
    cfg = proxy_config(args, args.upstream or "http://127.0.0.1:9")
    if args.worker_index is None:
        check_ports(cfg)
    tune_listeners(reuse_port=args.worker_index is not None)
    notice = None
    if args.upstream is None and not args.listener:
        # only here: a proxy in front of a real upstream never holds the demo's modules
        from hopmeter.upstream.server import UpstreamServer  # noqa: PLC0415

        demo = UpstreamServer()
        port = await demo.start("127.0.0.1", 0)
        cfg = proxy_config(args, f"http://127.0.0.1:{port}")
        notice = (
            f"hopmeter: no upstream given; forwarding to the built-in demo upstream at "
            f"http://127.0.0.1:{port}"
        )
    if args.worker_index is not None:
        # a worker shares the listen ports; its metrics port is its own
        cfg.options["hopmeter_metrics"] = _worker_metrics(cfg.metrics, args.worker_index)

    async def announce() -> None:
        if notice:
            print(notice, file=sys.stderr)

    quiet_mitmproxy_logs(args.verbose)
    return await run_proxy(cfg, before=announce)


def _worker_metrics(metrics: str, index: int) -> str:
    if metrics.lower() == "off":
        return metrics
    host, port = parse_hostport(metrics, "--metrics")
    return f"{host}:{port + index}"


def _run_workers(args: argparse.Namespace) -> int:
    cfg = proxy_config(args, args.upstream or "http://127.0.0.1:9")
    loop_factory(args.loop)  # uvloop missing: say so once, before any worker starts
    check_ports(cfg)
    if cfg.metrics.lower() != "off":
        for i in range(1, args.workers):
            check_port_free(
                *parse_hostport(_worker_metrics(cfg.metrics, i), "--metrics"), "metrics address"
            )
    drain_s = OPTIONS["hopmeter_drain_timeout"].read(args.drain_timeout)
    from hopmeter.proxy.run.workers import run_workers  # noqa: PLC0415 - only with --workers

    return run_workers(args.argv, args.workers, stop_timeout_s=drain_s + STOP_MARGIN_S)
