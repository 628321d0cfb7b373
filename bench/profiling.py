"""The soak (RSS over many short flows) and the py-spy profile of the proxy's per-event path."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import procs
from procs import BENCH, LAYOUT, Topology

from harness import Load, client, log, warm

# -- soak ----------------------------------------------------------------------------------------

SOAK_CONCURRENCY = 64
SOAK_EVENTS = 5  # token events per flow: a tiny stream, so the run is all per-flow cost
SOAK_PER_CONNECTION = 50  # flows per client connection, then a new one (connection churn too)
SOAK_EVERY = 10_000
FLAT_TOLERANCE = 0.10  # the target: RSS within ±10%


def soak(cls: type[Topology], up: procs.Upstream, flows: int, logdir: Path) -> dict[str, Any]:
    """`flows` short streams through a fresh proxy, RSS read at start, every 10k flows, end."""
    log(f"soak: {flows} flows via {cls.name}")
    with cls(up.port, logdir) as topo:
        warm(topo)
        pids = topo.pids()
        t0 = time.monotonic()
        samples = [{"flows": 0, "t_s": 0.0, "rss_kib": procs.rss_kib(pids)}]
        cpu0 = procs.cpu_s(pids)

        def progress(msg: dict[str, Any]) -> None:
            if "flows" in msg:
                rss = procs.rss_kib(pids)
                samples.append(
                    {"flows": msg["flows"], "t_s": time.monotonic() - t0, "rss_kib": rss}
                )
                log(f"  {msg['flows']} flows, RSS {rss} KiB")

        every = min(SOAK_EVERY, max(1, flows // 10))
        result = client(
            [
                "soak",
                "--target",
                f"127.0.0.1:{topo.port}",
                "--flows",
                str(flows),
                "--concurrency",
                str(SOAK_CONCURRENCY),
                "--events",
                str(SOAK_EVENTS),
                "--per-connection",
                str(SOAK_PER_CONNECTION),
                "--report-every",
                str(every),
            ],
            progress,
        )
        time.sleep(1.0)  # the last records are built just after their flows end
        cpu = procs.cpu_s(pids) - cpu0
        end = {
            "flows": result["done"],
            "t_s": time.monotonic() - t0,
            "rss_kib": procs.rss_kib(pids),
        }
        samples.append({**end, "end": True})
    ref = next((x["rss_kib"] for x in samples if x["flows"] >= every), samples[0]["rss_kib"])
    later = [x["rss_kib"] for x in samples if x["flows"] >= every]
    spread = max(abs(r - ref) / ref for r in later) if later else 0.0
    return {
        "topology": cls.name,
        "flows": flows,
        "concurrency": SOAK_CONCURRENCY,
        "events_per_flow": SOAK_EVENTS,
        "flows_per_connection": SOAK_PER_CONNECTION,
        "client": result,
        "samples": samples,
        "cpu_us_per_flow": round(cpu / max(1, result["done"]) * 1e6),
        "rss_growth_from_start": round(samples[-1]["rss_kib"] / samples[0]["rss_kib"] - 1, 3),
        "rss_max_deviation_from_first_mark": round(spread, 3),
        "flat": spread <= FLAT_TOLERANCE,
    }


# -- profile -------------------------------------------------------------------------------------

PROFILE_STREAMS = 100
PROFILE_RATE = 50.0
SAMPLE_HZ = 250

# Inclusive categories: a sample counts in a category when its stack holds the frame (or, for
# "a > b", frame b called directly from frame a). Function names with a file-path fragment.
CATEGORIES: list[tuple[str, str]] = [
    ("tap: ResponseTap.__call__ (stamp and queue)", "ResponseTap.__call__@proxy/addon/tap.py"),
    (
        "measuring, 1 ms later: MeasureQueue.measure",
        "MeasureQueue.measure@proxy/addon/tap.py",
    ),
    ("  FlowMeter.feed", "FlowMeter.feed@core/meter.py"),
    (
        "    plain chat path: SseDecoder.plain_data_events",
        "SseDecoder.plain_data_events@core/sse.py",
    ),
    ("    plain chat path: plain_chat_payload", "plain_chat_payload@core/apis/openai.py"),
    ("    SseDecoder.feed (framing, other events)", "SseDecoder.feed@core/sse.py"),
    ("      decode_payload (event UTF-8)", "decode_payload@core/decoding.py"),
    ("      Frame() construction", "SseDecoder._dispatch@core/sse.py > __init__@<string>"),
    ("    Utf8Decoder.count (whole-stream UTF-8)", "Utf8Decoder.count@core/decoding.py"),
    ("    ApiParser.parse (openai.chat, other events)", "ApiParser.parse@core/apis/_base.py"),
    ("      OpenAIChatParser.parse_object", "OpenAIChatParser.parse_object@core/apis/openai.py"),
    (
        "      Delta() construction",
        "OpenAIChatParser.parse_object@core/apis/openai.py > __init__@<string>",
    ),
    ("    FlowMeter._on_delta", "FlowMeter._on_delta@core/meter.py"),
    ("per flow: requestheaders", "HopMeter.requestheaders@proxy/addon/meter.py"),
    ("per flow: responseheaders", "HopMeter.responseheaders@proxy/addon/meter.py"),
    ("per flow: the flow's end (Ending.timed)", "Ending.timed@proxy/addon/ending.py"),
    ("  measure (tokens, figures, detectors)", "measure@core/measure.py"),
    ("  to_record (the record written)", "to_record@core/record.py"),
    ("  metrics observe", "MetricsOutput.observe@proxy/addon/outputs.py"),
    ("  observers (metrics, record line, console)", "Ending._observe@proxy/addon/ending.py"),
    ("bare addon: responseheaders", "StreamAll.responseheaders@bench/bare_addon.py"),
    (
        "mitmproxy: HTTP/1 parsing and layers",
        "Http1Connection@mitmproxy/proxy/layers/http/_http1.py",
    ),
    ("asyncio: socket reads and writes", "_SelectorSocketTransport@asyncio/selector_events.py"),
]
# py-spy counts a thread blocked in select() as active (the metrics server's thread, the event
# loop between events): such samples cost no CPU and are left out of the shares.
IDLE_LEAF = "select@selectors.py"
FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _frame_matches(frame: str, pattern: str) -> bool:
    """`Class.method@path-end` matches py-spy's "Class.method (path:line)"; a pattern without a
    method (`Class@path`) matches every method of the class."""
    fn, _, path = pattern.partition("@")
    m = FRAME.match(frame)
    if m is None or not m["file"].endswith(path):
        return False
    name = m["fn"]
    return name == fn or name.endswith("." + fn) or name.startswith(fn + ".")


def _stack_matches(frames: list[str], pattern: str) -> bool:
    parts = [p.strip() for p in pattern.split(" > ")]
    if len(parts) == 1:
        return any(_frame_matches(f, parts[0]) for f in frames)
    return any(
        _frame_matches(a, parts[0]) and _frame_matches(b, parts[1])
        for a, b in itertools.pairwise(frames)
    )


def breakdown(raw: Path, cpu_us_per_event: float) -> dict[str, Any]:
    """Share of samples per category, and that share of the measured CPU per event."""
    stacks: list[tuple[list[str], int]] = []
    idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            if _frame_matches(frames[-1], IDLE_LEAF):
                idle += int(count)  # waiting in epoll/poll: no CPU spent
            else:
                stacks.append((frames, int(count)))
    total = sum(c for _, c in stacks)
    rows = []
    for label, pattern in CATEGORIES:
        n = sum(c for frames, c in stacks if _stack_matches(frames, pattern))
        if n:
            share = n / total
            rows.append(
                {
                    "what": label,
                    "share": round(share, 4),
                    "us_per_event": round(share * cpu_us_per_event, 1),
                }
            )
    return {"samples": total, "idle_samples": idle, "categories": rows}


def spied_load(topo: Topology, load: Load, spy: list[str]) -> tuple[dict[str, Any], float]:
    """Run `load` through `topo` with py-spy (`spy`, a command) sampling the proxy throughout:
    flows start, stream and end inside the recording. The client's result and the proxy's CPU
    µs per event over the same run."""
    pid = topo.pids()[0]
    cpu0 = procs.cpu_s([pid])
    client_cmd = procs.client_command(load.args(topo.port))
    proc = subprocess.Popen(client_cmd, stdout=subprocess.PIPE)
    seconds = int(load.warmup_s + load.measure_s + 2)
    recorder = subprocess.Popen(
        [*LAYOUT.gen_pin, *spy[:2], "--pid", str(pid), "--duration", str(seconds), *spy[2:]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stdout, _ = proc.communicate()
    recorder.wait()
    cpu = procs.cpu_s([pid]) - cpu0
    result: dict[str, Any] = json.loads(stdout.splitlines()[-1])["result"]
    return result, cpu / max(1, result["events_received"]) * 1e6


def profile(
    up: procs.Upstream, results: Path, stamp: str, seconds: float, logdir: Path
) -> list[dict[str, Any]]:
    """py-spy on bare mitmproxy and on hopmeter while each carries 100 streams at 50 tokens/s.

    py-spy samples in its default blocking mode (it stops the proxy for each sample): without it
    the stacks it reads from a running interpreter are torn (callers paired with callees they
    never call). One load for the raw stacks the breakdown is computed from, a second for the
    flame graph, since one py-spy can attach at a time.
    """
    del stamp
    py_spy = shutil.which("py-spy") or str(procs.BIN / "py-spy")
    load = Load(PROFILE_STREAMS, PROFILE_RATE, "paced", 1.0, seconds, 3.0)
    out = []
    for cls in (procs.Mitmdump, procs.Hopmeter):
        log(f"profile via {cls.name}")
        files = {
            fmt: results / f"profile-{cls.name}.{ext}"
            for fmt, ext in (("raw", "txt"), ("flamegraph", "svg"))
        }
        runs = {}
        with cls(up.port, logdir) as topo:
            warm(topo)
            for fmt, path in files.items():
                spy = [py_spy, "record", "--rate", str(SAMPLE_HZ), "--function"]
                runs[fmt] = spied_load(topo, load, [*spy, "--format", fmt, "-o", str(path)])
        result, per_event = runs["raw"]
        out.append(
            {
                "topology": cls.name,
                "streams": PROFILE_STREAMS,
                "rate": PROFILE_RATE,
                "cpu_us_per_event": round(per_event, 1),
                "delay_ms": result["delay_ms"],
                "files": {k: str(v.relative_to(BENCH)) for k, v in files.items()},
                **breakdown(files["raw"], per_event),
            }
        )
    return out
