"""`hopmeter`: the command line (DESIGN.md §3). Errors here are one line and an exit code."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hopmeter import __version__, join, probe, report
from hopmeter.core.frames import HopmeterError
from hopmeter.listen import tune_listeners
from hopmeter.runner import (
    ProxyConfig,
    UsageError,
    check_port_free,
    listen_addresses,
    parse_hostport,
    quiet_mitmproxy_logs,
    run_proxy,
)
from hopmeter.workers import run_workers

DEFAULT_LISTEN = "127.0.0.1:8080"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it and the fix, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"hopmeter: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    p = _Parser(prog="hopmeter", description="A transparent measuring proxy for LLM token streams.")
    p.add_argument("--version", action="version", version=f"hopmeter {__version__}")
    p.add_argument(
        "--addon-path", action="store_true", help="print the script path for `mitmdump -s` and exit"
    )
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="measure a reverse proxy in front of UPSTREAM_URL")
    run.add_argument(
        "upstream",
        nargs="?",
        metavar="UPSTREAM_URL",
        help="where to forward (default: a built-in demo upstream)",
    )
    _proxy_flags(run)

    up = sub.add_parser("upstream", help="the synthetic LLM upstream alone")
    up.add_argument("--listen", default="127.0.0.1:9000", metavar="HOST:PORT")
    up.add_argument(
        "--scenario",
        default="",
        metavar="KEY=VALUE;...",
        help="server-wide defaults, e.g. 'rate=30;coalesce=3;stall_at=20'",
    )
    up.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="FILE",
        help="load a recorded .sse/.ndjson transcript, chosen per request by "
        "?replay=NAME (repeatable)",
    )

    join.add_parser(sub)
    report.add_parser(sub)
    probe.add_parser(sub)

    up.add_argument(
        "--tls-dir",
        default="",
        metavar="DIR",
        help="serve HTTPS with a self-signed certificate written to DIR/cert.pem",
    )

    demo = sub.add_parser("demo", help="demo upstream + proxy + sample streams; print the figures")
    demo.add_argument("--records", default="", metavar="PATH")
    return p


def _proxy_flags(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--stall-threshold", type=_positive_float, default=0.5, metavar="SECONDS")
    p.add_argument("--tokenizer", default="", metavar="NAME|PATH")
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
        "--no-trace-header", action="store_true", help="do not add a traceparent header to requests"
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
        type=_positive_int,
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
    p.add_argument("--verbose", action="store_true", help="mitmproxy's own connection logs too")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        dest="set_",
        help="any mitmproxy option, passed through",
    )


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be 1 or more")
    return n


def _positive_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if f <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be above 0")
    return f


def proxy_config(args: argparse.Namespace, upstream: str) -> ProxyConfig:
    """Validate `run`'s flags into a ProxyConfig."""
    if args.listener:
        modes = []
        for pair in args.listener:
            name, sep, mode = pair.partition("=")
            if not sep or not name or not mode:
                raise UsageError(
                    f"--listener {pair!r}: expected NAME=MODE, e.g. "
                    f"edge=reverse:http://127.0.0.1:9000@8081"
                )
            modes.append(mode)
    else:
        if not upstream.startswith(("http://", "https://")):
            raise UsageError(f"upstream {upstream!r}: expected an http:// or https:// URL")
        host, port = parse_hostport(args.listen, "--listen")
        modes = [f"reverse:{upstream}@{host}:{port}"]
    for pair in args.set_:
        if "=" not in pair:
            raise UsageError(
                f"--set {pair!r}: expected NAME=VALUE, e.g. --set keep_host_header=true"
            )
    if args.metrics.lower() != "off":
        parse_hostport(args.metrics, "--metrics")
    if args.records and args.records != "-":
        parent = Path(args.records).expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--records {args.records}: folder {parent} does not exist")
    return ProxyConfig(
        modes=modes,
        listener_names=list(args.listener),
        hop=args.hop,
        records=args.records,
        metrics=args.metrics,
        stall_threshold_s=args.stall_threshold,
        tokenizer=args.tokenizer,
        log_content=args.log_content,
        trace_header=not args.no_trace_header,
        otel_endpoint=args.otel_endpoint,
        chaos=args.chaos,
        chaos_seed=args.chaos_seed,
        console="off" if args.quiet else "json" if args.json else "text",
        summary_interval_s=args.summary_interval,
        extra=list(args.set_),
    )


def check_ports(cfg: ProxyConfig) -> None:
    """Every port hopmeter will bind must be free; say which is not."""
    for host, port in listen_addresses(cfg.modes):
        check_port_free(host, port, "listen address")
    if cfg.metrics.lower() != "off":
        check_port_free(*parse_hostport(cfg.metrics, "--metrics"), "metrics address")


async def _run(args: argparse.Namespace) -> int:
    from hopmeter.upstream.server import UpstreamServer  # noqa: PLC0415

    # validate everything before starting anything
    cfg = proxy_config(args, args.upstream or "http://127.0.0.1:9")
    if args.worker_index is None:
        check_ports(cfg)
    else:
        # a worker shares the listen ports; its metrics port is its own
        cfg.metrics = _worker_metrics(cfg.metrics, args.worker_index)
    tune_listeners(reuse_port=args.worker_index is not None)
    notice = None
    if args.upstream is None and not args.listener:
        demo = UpstreamServer()
        port = await demo.start("127.0.0.1", 0)
        cfg = proxy_config(args, f"http://127.0.0.1:{port}")
        if args.worker_index is not None:
            cfg.metrics = _worker_metrics(cfg.metrics, args.worker_index)
        notice = (
            f"hopmeter: no upstream given; forwarding to the built-in demo upstream at "
            f"http://127.0.0.1:{port}"
        )

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


def _run_workers(args: argparse.Namespace, argv: Sequence[str]) -> int:
    cfg = proxy_config(args, args.upstream or "http://127.0.0.1:9")
    check_ports(cfg)
    if cfg.metrics.lower() != "off":
        for i in range(1, args.workers):
            check_port_free(
                *parse_hostport(_worker_metrics(cfg.metrics, i), "--metrics"), "metrics address"
            )
    return run_workers(argv, args.workers)


async def _upstream(args: argparse.Namespace) -> int:
    from hopmeter.upstream.replay import Transcript  # noqa: PLC0415
    from hopmeter.upstream.scenario import Scenario, apply, parse_pairs  # noqa: PLC0415
    from hopmeter.upstream.server import UpstreamServer  # noqa: PLC0415

    host, port = parse_hostport(args.listen, "--listen")
    scenario = apply(Scenario(), parse_pairs(args.scenario))
    transcripts = {t.name: t for t in (Transcript.load(p) for p in args.replay)}
    check_port_free(host, port, "listen address")
    tls = None
    if args.tls_dir:
        from hopmeter.upstream.tls import make_self_signed, server_context  # noqa: PLC0415

        try:
            tls = server_context(*make_self_signed(Path(args.tls_dir), (host, "localhost")))
        except OSError as exc:
            raise UsageError(f"--tls-dir {args.tls_dir}: {exc.strerror}") from None
    server = UpstreamServer(scenario, transcripts)
    bound = await server.start(host, port, tls)
    scheme = "https" if tls else "http"
    print(f"hopmeter upstream listening on {scheme}://{host}:{bound}", file=sys.stderr, flush=True)
    await server.serve_forever()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hopmeter` command."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.addon_path:
        print(Path(__file__).with_name("script.py"))
        return 0
    try:
        if args.command == "run":
            if args.workers > 1 and args.worker_index is None:
                return _run_workers(args, argv)
            return asyncio.run(_run(args))
        if args.command == "upstream":
            return asyncio.run(_upstream(args))
        if args.command == "join":
            return join.run(args)
        if args.command == "report":
            return report.run(args)
        if args.command == "probe":
            return probe.run(args)
        if args.command == "demo":
            from hopmeter.demo import run_demo  # noqa: PLC0415

            return asyncio.run(run_demo(records=args.records))
        parser.print_help()
        return 2
    except HopmeterError as exc:
        print(f"hopmeter: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`hopmeter report ... | head`): not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
