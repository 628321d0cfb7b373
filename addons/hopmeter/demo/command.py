"""`hopmeter demo`: the demo upstream, the proxy and a few sample streams, in one process.

It shows on a fresh machine, with nothing else running, what hopmeter measures: a clean stream,
one with a role prelude and coalesced events, one with a stall, one a compressor holds, one not
streamed at all, an Anthropic and an Ollama stream.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

from hopmeter.core.record import FlowResult, summary_line
from hopmeter.errors import UsageError
from hopmeter.export import FlowObserver
from hopmeter.probe.http import post_stream
from hopmeter.proxy.options import run_options
from hopmeter.proxy.run.config import ProxyConfig
from hopmeter.upstream.server import UpstreamServer

SAMPLES: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "clean OpenAI stream",
        "/v1/chat/completions",
        "tokens=30;rate=40",
        {"model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True}},
    ),
    (
        "role prelude, then 4 tokens per event",
        "/v1/chat/completions",
        "tokens=32;rate=40;prelude_s=0.3;coalesce=4",
        {"model": "gpt-4o-mini", "stream": True},
    ),
    (
        "one 900 ms stall",
        "/v1/chat/completions",
        "tokens=30;rate=40;stall_at=15;stall_s=0.9",
        {"model": "gpt-4o-mini", "stream": True},
    ),
    (
        "gzip on the event stream",
        "/v1/chat/completions",
        "tokens=40;rate=40;gzip=1",
        {"model": "gpt-4o-mini", "stream": True},
    ),
    (
        "not streamed",
        "/v1/chat/completions",
        "tokens=30;rate=40",
        {"model": "gpt-4o-mini", "stream": False},
    ),
    (
        "Anthropic with thinking",
        "/v1/messages",
        "tokens=20;reasoning=8;rate=40",
        {"model": "claude-sonnet-4-5", "stream": True, "max_tokens": 256},
    ),
    ("Ollama chat", "/api/chat", "tokens=20;rate=40", {"model": "llama3.2", "stream": True}),
]


def add_parser(sub: Any) -> None:
    """The `demo` subcommand, added to an argparse subparsers object."""
    p = sub.add_parser("demo", help="demo upstream + proxy + sample streams; print the figures")
    p.add_argument(
        "--records",
        default="",
        metavar="PATH",
        help="also append each flow's record to this file, one JSON line per flow (as hopmeter "
        "run --records; the input of hopmeter report)",
    )
    p.add_argument(
        "--browser",
        action="store_true",
        help="serve a chat page through a browser-measuring proxy (a good client and each bad "
        "one) and print its URL; runs until Ctrl-C",
    )
    p.add_argument(
        "--headless",
        nargs="?",
        const="all",
        default="",
        metavar="CLIENTS",
        help="with --browser: open the page in headless Chromium, run CLIENTS (a comma list, "
        "default all) and stop once each reply's record was written",
    )
    p.add_argument("--port", type=int, default=0, help="with --browser: the proxy's port")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`hopmeter demo`."""
    if args.headless and not args.browser:
        raise UsageError("--headless works with --browser: hopmeter demo --browser --headless")
    if args.browser:
        from hopmeter.demo.chat_page import run_browser_demo  # noqa: PLC0415

        port = args.port or _free_port()
        return asyncio.run(
            run_browser_demo(records=args.records, port=port, headless=args.headless)
        )
    return asyncio.run(run_demo(records=args.records))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_demo(records: str = "") -> int:
    """Run the samples through a real proxy and print one line per measured flow."""
    from hopmeter.proxy.run.runner import quiet_mitmproxy_logs, run_proxy  # noqa: PLC0415 - heavy

    upstream = UpstreamServer()
    up_port = await upstream.start("127.0.0.1", 0)
    proxy_port = _free_port()
    cfg = ProxyConfig(
        modes=[f"reverse:http://127.0.0.1:{up_port}@127.0.0.1:{proxy_port}"],
        options=run_options(
            hopmeter_hop="demo",
            hopmeter_records=records,
            hopmeter_metrics="off",
            hopmeter_console="off",
        ),
    )
    results: list[dict[str, Any]] = []
    master_box: list[Any] = []

    class Collect(FlowObserver):
        def observe(self, result: FlowResult) -> None:
            results.append(result.record)

    def on_master(master: Any) -> None:
        master_box.append(master)
        master.addons.get("hopmeter").add_observer(Collect())

    async def drive() -> None:
        await wait_port(proxy_port)
        print(f"hopmeter demo: upstream 127.0.0.1:{up_port}, proxy 127.0.0.1:{proxy_port}\n")
        for title, path, scenario, body in SAMPLES:
            got = await post_stream(
                f"http://127.0.0.1:{proxy_port}{path}", body, {"x-hopmeter-scenario": scenario}
            )
            for _ in range(100):
                if len(results) >= SAMPLES.index((title, path, scenario, body)) + 1:
                    break
                await asyncio.sleep(0.01)
            rec = results[-1] if results else None
            print(f"- {title}: client got {len(got.body)} bytes in {len(got.chunks)} chunks")
            if rec is not None:
                print(f"  {summary_line(rec)}")
        master_box[0].shutdown()

    quiet_mitmproxy_logs(False)
    task: asyncio.Task[None] | None = None

    async def before() -> None:
        nonlocal task
        task = asyncio.create_task(drive())

    await run_proxy(cfg, before=before, on_master=on_master)
    if task is not None and task.done() and task.exception() is not None:
        print(f"hopmeter demo: {task.exception()}", file=sys.stderr)
        return 1
    print(f"\n{len(results)} flows measured.")
    return 0 if len(results) == len(SAMPLES) else 1


async def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Wait until something accepts connections on 127.0.0.1:`port`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
