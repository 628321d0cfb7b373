"""`hopmeter upstream`: the synthetic LLM upstream alone, on its own port."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from hopmeter.argtypes import check_port_free, parse_hostport
from hopmeter.errors import UsageError


def add_parser(sub: Any) -> None:
    """The `upstream` subcommand, added to an argparse subparsers object."""
    p = sub.add_parser("upstream", help="the synthetic LLM upstream alone")
    p.add_argument(
        "--listen",
        default="127.0.0.1:9000",
        metavar="HOST:PORT",
        help="where to serve (default: 127.0.0.1:9000)",
    )
    p.add_argument(
        "--scenario",
        default="",
        metavar="KEY=VALUE;...",
        help="server-wide defaults, e.g. 'rate=30;coalesce=3;stall_at=20'",
    )
    p.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="FILE",
        help="load a recorded .sse/.ndjson transcript, chosen per request by "
        "?replay=NAME (repeatable)",
    )
    p.add_argument(
        "--tls-dir",
        default="",
        metavar="DIR",
        help="serve HTTPS with a self-signed certificate written to DIR/cert.pem",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    from hopmeter.upstream.replay import Transcript  # noqa: PLC0415 - the CLI stays light
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
