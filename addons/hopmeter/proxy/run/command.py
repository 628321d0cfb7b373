"""`hopmeter run`: its flags, checked into a ProxyConfig before anything starts, and the run."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from hopmeter.argtypes import (
    check_port_free,
    parse_hostport,
    parse_listener,
    positive_int,
    positive_seconds,
    seconds,
)
from hopmeter.core.vocab import EventLoop
from hopmeter.env import bind_env, source
from hopmeter.errors import UsageError
from hopmeter.pidfile import ignore_hangup, pid_file
from hopmeter.proxy.run.config import ProxyConfig, listen_addresses
from hopmeter.proxy.run.listen import tune_listeners
from hopmeter.proxy.run.loops import default_loop, loop_factory
from hopmeter.proxy.run.workers import run_workers

DEFAULT_LISTEN = "127.0.0.1:8080"
# With --workers, the parent waits this long past the drain timeout for its workers to end the
# streams still in flight, write their records and exit, before it kills them.
STOP_MARGIN_S = 10.0


def add_parser(sub: Any) -> None:
    """The `run` subcommand, added to an argparse subparsers object."""
    p = sub.add_parser("run", help="measure a reverse proxy in front of UPSTREAM_URL")
    p.add_argument(
        "upstream",
        nargs="?",
        metavar="UPSTREAM_URL",
        help="where to forward (default: a built-in demo upstream)",
    )
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT")
    p.add_argument("--hop", default="proxy", metavar="NAME")
    p.add_argument(
        "--listener",
        action="append",
        default=[],
        metavar="NAME=MODE",
        help="a named listener with any mitmproxy mode spec (repeatable)",
    )
    p.add_argument("--records", default="", metavar="PATH", help='JSON lines file ("-" = stdout)')
    p.add_argument("--metrics", default="127.0.0.1:9464", metavar="HOST:PORT|off")
    p.add_argument("--stall-threshold", type=positive_seconds, default=0.5, metavar="SECONDS")
    p.add_argument("--tokenizer", default="", metavar="NAME|PATH")
    p.add_argument(
        "--lazy-tokenizer",
        action="store_true",
        help="make the tokenizer when the first flow starts, not at start-up (no longer saves "
        "memory: the default maps its table and idles as low); records of flows ending before "
        "it is ready are written once it is",
    )
    p.add_argument(
        "--log-content",
        action="store_true",
        help="include prompt/reply text in records (off by default)",
    )
    p.add_argument(
        "--otel-endpoint",
        default="",
        metavar="URL",
        help="export a span per flow to this OTLP/HTTP endpoint (pip install hopmeter[otel])",
    )
    p.add_argument(
        "--otel-timeline",
        choices=("on", "off"),
        default="on",
        help="carry each flow's token timeline in its span, for `hopmeter join` (default on)",
    )
    p.add_argument(
        "--no-trace-header",
        action="store_true",
        help="do not add or rewrite traceparent (by default it goes on with this hop's span as "
        "the parent)",
    )
    p.add_argument(
        "--fingerprint-key-env",
        default="",
        metavar="VAR",
        help="key the reply fingerprints in records with the secret in this environment variable "
        "(the same on every host whose records are joined)",
    )
    p.add_argument(
        "--no-content-pairing",
        action="store_true",
        help="with listeners of several hops, pair flows by trace id only, never by reply "
        "(for listeners of unrelated chains whose replies may be alike)",
    )
    p.add_argument(
        "--browser",
        action="store_true",
        help="browser measuring: serve the snippet at /_hopmeter/beacon.js, answer beacons at "
        "/_hopmeter/beacon, add the browser and screen lanes to records",
    )
    p.add_argument(
        "--chaos",
        default="",
        metavar="ACTIONS",
        help="staging only: rechunk,split_utf8,crlf,cr applied to responses sent to clients",
    )
    p.add_argument("--chaos-seed", type=int, default=0, metavar="N", help="seed for --chaos")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="N proxy processes on the same ports (SO_REUSEPORT); metrics port + index each",
    )
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no per-flow console line")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per finished flow on stdout"
    )
    p.add_argument(
        "--summary-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="seconds between compact console summaries, 0 for none (default 60)",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds to connect to the upstream (TCP and TLS) before answering 504 (default 10)",
    )
    p.add_argument(
        "--read-timeout",
        type=positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="longest upstream silence: before the response headers (answered 504) and between "
        "chunks (the stream is cut); default 600, the OpenAI and Anthropic SDKs' own",
    )
    p.add_argument(
        "--drain-timeout",
        type=seconds,
        default=20.0,
        metavar="SECONDS",
        help="on SIGTERM, seconds the streams in flight get to finish before the proxy stops "
        "(default 20; a second signal stops at once)",
    )
    p.add_argument(
        "--no-relay",
        action="store_true",
        help="move every read through mitmproxy's own layers: the relay and the other fast paths "
        "past them (the same bytes at less CPU) are not installed; mitmproxy's classes stay as "
        "they are",
    )
    p.add_argument(
        "--pid-file",
        default="",
        metavar="PATH",
        help="write the process id here (with --workers, the parent's), for `kill -HUP` after "
        "a log rotation: SIGHUP reopens the --records file (deploy/logrotate/hopmeter)",
    )
    p.add_argument("--verbose", action="store_true", help="mitmproxy's own connection logs too")
    p.add_argument(
        "--loop",
        type=EventLoop,
        choices=list(EventLoop),
        default=default_loop(),
        help="the event loop: uvloop (the default where it is installed: less CPU per event) or "
        "asyncio (the standard library's)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        dest="set_",
        help="any mitmproxy option, passed through: every addon of mitmdump is loaded and acts "
        "as in mitmdump once its option is set; nothing is left out",
    )
    p.set_defaults(func=run)
    bind_env(p)


def proxy_config(args: argparse.Namespace, upstream: str) -> ProxyConfig:
    """Validate `run`'s flags into a ProxyConfig."""
    if args.listener:
        flag = source(args, "listener", "--listener")
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
    if args.metrics.lower() != "off":
        parse_hostport(args.metrics, source(args, "metrics", "--metrics"))
    if args.records and args.records != "-":
        parent = Path(args.records).expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(
                f"{source(args, 'records', '--records')} {args.records}: folder {parent} does "
                f"not exist"
            )
    return ProxyConfig(
        modes=modes,
        listener_names=list(args.listener),
        hop=args.hop,
        records=args.records,
        metrics=args.metrics,
        stall_threshold_s=args.stall_threshold,
        tokenizer=args.tokenizer,
        lazy_tokenizer=args.lazy_tokenizer,
        log_content=args.log_content,
        trace_header=not args.no_trace_header,
        fingerprint_key_env=args.fingerprint_key_env,
        content_pairing=not args.no_content_pairing,
        otel_endpoint=args.otel_endpoint,
        otel_timeline=args.otel_timeline == "on",
        chaos=args.chaos,
        chaos_seed=args.chaos_seed,
        console="off" if args.quiet else "json" if args.json else "text",
        summary_interval_s=args.summary_interval,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.read_timeout,
        drain_timeout_s=args.drain_timeout,
        browser=args.browser,
        relay=not args.no_relay,
        extra=list(args.set_),
    )


def check_ports(cfg: ProxyConfig) -> None:
    """Every port hopmeter will bind must be free; say which is not."""
    for host, port in listen_addresses(cfg.modes):
        check_port_free(host, port, "listen address")
    if cfg.metrics.lower() != "off":
        check_port_free(*parse_hostport(cfg.metrics, "--metrics"), "metrics address")


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
        cfg.metrics = _worker_metrics(cfg.metrics, args.worker_index)

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
    return run_workers(args.argv, args.workers, stop_timeout_s=args.drain_timeout + STOP_MARGIN_S)
