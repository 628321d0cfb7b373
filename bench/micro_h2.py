"""Micro-benchmark of an HTTP/2 DATA frame's steps in the relay: h2's own, and h2_frames'.

    python bench/micro_h2.py            # warm, then cold (4 MiB copied between calls)
    python bench/micro_h2.py --json     # the same numbers as JSON, also written to bench/results

Each case works on real connections, as the relay finds them: mitmproxy's BufferedH2Connection
to an HTTP/2 client (server side), its streams open and their responses' headers sent, and one to
an HTTP/2 upstream (client side), with the upstream's frames of the bench upstream's chat chunk
(one SSE event of ~210 bytes). "received" is a DATA frame taken in and acknowledged, and what the
connection then has to send; "sent" a piece sent on a stream and the bytes to write. Timed as
bench/micro_feed.py times its cases: warm (best of rounds), and cold, each call after 4 MiB were
copied, 50 connections taking turns (the median of three rounds), which is how a proxy carrying
paced streams meets them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h2.config
import h2.connection

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addons"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from micro_feed import CHUNK, bench, bench_cold, nothing
from tests.harness.h2pair import shake

from hopmeter.proxy.fastpath import h2_frames
from hopmeter.proxy.fastpath.internals import BufferedH2Connection

RESULTS = Path(__file__).resolve().parent / "results"
HEAD = [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "https")]
HEAD += [(":authority", "upstream.bench")]
COLD_MIB = 4


def to_client() -> Any:
    """mitmproxy's connection to an HTTP/2 client, stream 1 open with its response's headers
    sent, the client's windows as large as HTTP/2 allows (no WINDOW_UPDATE in the loop)."""
    proxy = BufferedH2Connection(h2.config.H2Configuration(client_side=False))
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    proxy.initiate_connection()  # type: ignore[no-untyped-call]  # (mitmproxy's)
    shake(client, proxy)
    client.send_headers(1, HEAD, end_stream=True)
    client.increment_flow_control_window(2**31 - 1 - 65_535)
    shake(client, proxy)
    proxy.send_headers(1, [(":status", "200")])
    proxy.data_to_send()
    return proxy


def from_upstream() -> tuple[Any, bytes]:
    """mitmproxy's connection to an HTTP/2 upstream, stream 1's response headers received, and
    one DATA frame of the chat chunk as the upstream sends it."""
    proxy = BufferedH2Connection(h2.config.H2Configuration(client_side=True))
    upstream = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    proxy.initiate_connection()  # type: ignore[no-untyped-call]  # (mitmproxy's)
    upstream.initiate_connection()
    shake(proxy, upstream)
    proxy.send_headers(1, HEAD, end_stream=True)
    shake(proxy, upstream)
    upstream.send_headers(1, [(":status", "200")])
    shake(proxy, upstream)
    upstream.send_data(1, CHUNK)
    return proxy, upstream.data_to_send()


def received_h2() -> Callable[[int], object]:
    proxy, frame = from_upstream()

    def step(i: int) -> object:
        (event,) = proxy.receive_data(frame)
        proxy.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        return proxy.data_to_send()

    return step


def received_own() -> Callable[[int], object]:
    proxy, frame = from_upstream()
    stream, n = proxy.streams[1], len(frame) - 9

    def step(i: int) -> object:
        h2_frames.received(proxy, [(stream, n)])
        return frame[9:]

    return step


def sent_h2() -> Callable[[int], object]:
    proxy = to_client()

    def step(i: int) -> object:
        proxy.send_data(1, CHUNK)
        return proxy.data_to_send()

    return step


def sent_own() -> Callable[[int], object]:
    proxy = to_client()
    return lambda i: h2_frames.send(proxy, 1, CHUNK)


CASES: list[tuple[str, Callable[[], Callable[[int], object]]]] = [
    ("received and acknowledged: h2 (receive_data, acknowledge_received_data)", received_h2),
    ("received and acknowledged: h2_frames.received", received_own),
    ("sent: h2 (BufferedH2Connection.send_data, data_to_send)", sent_h2),
    ("sent: h2_frames.send", sent_own),
    ("(a call that does nothing: the timing's floor)", nothing),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    for name, setup in CASES:
        warm, cold = bench(setup), bench_cold(setup, COLD_MIB)
        rows.append(
            {"what": name, "us_per_call": round(warm, 2), "cold_us_per_call": round(cold, 2)}
        )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    doc = {"kind": "micro-h2", "time": stamp, "cold_mib_between_calls": COLD_MIB, "rows": rows}
    if args.json:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"micro-h2-{stamp}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(doc, indent=1))
        return
    print(f"warm, then cold ({COLD_MIB} MiB copied between calls)")
    for r in rows:
        print(f"{r['us_per_call']:8.2f} µs {r['cold_us_per_call']:8.2f} µs  {r['what']}")


if __name__ == "__main__":
    main()
