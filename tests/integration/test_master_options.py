"""mitmproxy options act the same through `hopmeter run` and mitmdump with hopmeter loaded.

`hopmeter run` builds its own master (hopmeter.proxy.run.master), which skips per flow the addons
whose options keep their defaults. Each case starts both as real processes in front of one echo
upstream, sends the same requests and compares what the client got, what the upstream saw, the
files mitmproxy wrote and the records hopmeter wrote.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from mitmproxy import certs

from hopmeter.cli import addon_path
from tests.harness.procs import Proc, free_port, measuring, read_records

pytestmark = pytest.mark.integration

# requestheaders: hopmeter streams request bodies, so a `request` hook comes after the request left
SCRIPT = "def requestheaders(flow):\n    flow.request.headers['x-script'] = '1'\n"
BASIC = "Basic " + base64.b64encode(b"u:p").decode()
# The record fields that do not hold times or ids (which differ between any two runs)
STABLE = {
    "request": ("method", "scheme", "host", "path", "bytes"),
    "response": ("status", "http_version", "content_type", "bytes_wire", "bytes_out", "ended"),
    "figures": ("tokens", "tokens_source", "events", "payload_bytes"),
}


class Echo(BaseHTTPRequestHandler):
    """Answers every request with what it received (method, path, headers, body) as JSON."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._echo(b"")

    def do_POST(self) -> None:
        self._echo(self.rfile.read(int(self.headers.get("content-length") or 0)))

    def _echo(self, body: bytes) -> None:
        # traceparent: hopmeter's, a new trace id per request
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() != "traceparent"}
        headers["host"] = headers.get("host", "").split(":")[0]  # the port differs per case
        seen = {"method": self.command, "path": self.path, "headers": headers, "body": body.hex()}
        out = json.dumps(seen, sort_keys=True).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("set-cookie", "session=1; Path=/")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mitmproxy CA for both processes of every case (made once, before they start)."""
    path = tmp_path_factory.mktemp("mitm")
    certs.CertStore.from_store(path, "mitmproxy", 2048)
    return path


@contextlib.contextmanager
def mitmdump(tmp: Path, upstream: str, sets: list[str]) -> Iterator[tuple[int, Path]]:
    """`mitmdump -s "$(hopmeter --addon-path)"` as a reverse proxy; its port and records."""
    port, records = free_port(), tmp / "records.jsonl"
    args = [
        str(Path(sys.executable).with_name("mitmdump")),
        *("-q", "-s", str(addon_path())),
        *("--mode", f"reverse:{upstream}@127.0.0.1:{port}"),
        *("--set", f"hopmeter_records={records}", "--set", "hopmeter_metrics=off"),
        # what `hopmeter run` sets for itself (a proxy in production: every response streamed,
        # no body kept), so that only mitmproxy's options differ from the plain addon's
        *("--set", "hopmeter_stream=all", "--set", "hopmeter_keep_body=0"),
    ]
    for value in sets:  # mitmdump's -s sets `scripts`: a user's scripts are more -s
        name, _, script = value.partition("=")
        args += ["-s", script] if name == "scripts" else ["--set", value]
    proc = Proc(args, tmp / "mitmdump.log")
    try:
        proc.wait_port(port)
        yield port, records
    finally:
        proc.stop()


def ask(port: int, requests: list[tuple[str, str, dict[str, str]]]) -> list[dict[str, Any]]:
    """Each (method, path, headers) in turn on one client: status, the body, what it set."""
    got = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        for method, path, headers in requests:
            body = b"hello" if method == "POST" else None
            r = client.request(method, path, headers=headers, content=body)
            try:
                seen: Any = r.json()
            except ValueError:
                seen = r.status_code  # an error page made by mitmproxy: its text has no value
            got.append(
                {"status": r.status_code, "body": seen, "cookie": r.headers.get("set-cookie")}
            )
    return got


def stable(record: dict[str, Any]) -> dict[str, Any]:
    """What a record says that does not differ between any two runs (times, ids)."""
    out = {part: {k: record.get(part, {}).get(k) for k in keys} for part, keys in STABLE.items()}
    out["ended"], out["api"] = record["ended"], record["api"]
    out["findings"] = sorted(f["kind"] for f in record["findings"])
    return out


def written(folder: Path) -> list[tuple[str, int]]:
    """The flow files a case wrote: HAR entries, or 1 for a non-empty mitmproxy flow file."""
    out = []
    for p in sorted(folder.glob("out.*")):
        if p.suffix == ".har":
            out.append((p.suffix, len(json.loads(p.read_text())["log"]["entries"])))
        else:
            out.append((p.suffix, int(p.stat().st_size > 0)))
    return out


def both(
    tmp: Path, upstream: str, sets: list[str], requests: list[tuple[str, str, dict[str, str]]]
) -> list[dict[str, Any]]:
    """Run the case through mitmdump and through `hopmeter run`; what each gave."""
    results = []
    flows = 0 if any(s.startswith("ignore_hosts=") for s in sets) else len(requests)  # TCP only
    for kind in ("mitmdump", "run"):
        folder = tmp / kind
        folder.mkdir()
        (folder / "script.py").write_text(SCRIPT)
        values = [s.replace("DIR", str(folder)) for s in sets]
        if kind == "mitmdump":
            with mitmdump(folder, upstream, values) as (port, records):
                answers = ask(port, requests)
                recs = read_records(records, flows) if flows else []
        else:
            flags = [a for v in values for a in ("--set", v)]
            with measuring(folder, upstream, *flags) as proxy:
                answers = ask(proxy.port, requests)
                recs = read_records(proxy.records, flows) if flows else []
        results.append(
            {"answers": answers, "records": [stable(r) for r in recs], "files": written(folder)}
        )
    return results


REWRITES = [
    "modify_headers=/~q/x-added/yes",
    "modify_body=/~q/hello/HELLO",
    "map_remote=|/v1/|/v2/",
    "anticache=true",
    "anticomp=true",
    "upstream_auth=a:b",
    "stickycookie=.*",
    "block_list=:~u blocked:418",
    "save_stream_file=DIR/out.flows",
    "hardump=DIR/out.har",
]
REQUESTS = [
    ("POST", "/v1/chat?x=1", {"if-none-match": "abc", "accept-encoding": "gzip, br"}),
    ("POST", "/v1/chat", {}),  # the sticky cookie of the first answer goes with this one
    ("GET", "/blocked", {}),
]
CASES: dict[str, tuple[list[str], list[tuple[str, str, dict[str, str]]]]] = {
    "defaults": ([], REQUESTS[:2]),
    "request and response rewrites, blocks, flow files": (REWRITES, REQUESTS),
    "proxyauth": (["proxyauth=u:p"], [("GET", "/a", {}), ("GET", "/b", {"authorization": BASIC})]),
    "scripts": (["scripts=DIR/script.py"], REQUESTS[:1]),
    # alone: with map_remote applied in time (modify_body buffers the request), mitmproxy sends
    # a reverse-proxied request that keeps its Host header back to the proxy, and refuses it
    "keep_host_header": (["keep_host_header=true"], REQUESTS[:1]),
    "ignore_hosts": (["ignore_hosts=.*"], REQUESTS[:1]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hopmeter_run_acts_on_mitmproxy_options_as_mitmdump(
    name: str, echo: int, confdir: Path, tmp_path: Path
) -> None:
    """The same `--set` options give the same answers, the same requests upstream, the same flow
    files and the same records through `hopmeter run` as through mitmdump with hopmeter loaded."""
    sets, requests = CASES[name]
    dump, run = both(tmp_path, f"http://127.0.0.1:{echo}", [*sets, f"confdir={confdir}"], requests)
    assert run == dump
    first = dump["answers"][0]
    if name == "request and response rewrites, blocks, flow files":
        assert first["body"]["headers"]["x-added"] == "yes"
        # modify_body matches the request, so hopmeter leaves its body to mitmproxy to buffer
        # and the edit applies; map_remote acts in time too
        assert bytes.fromhex(first["body"]["body"]) == b"HELLO"
        assert first["body"]["path"] == "/v2/chat?x=1"
        assert first["body"]["headers"]["authorization"] == "Basic YTpi"  # upstream_auth a:b
        assert dump["files"] == [(".flows", 1), (".har", 3)]
    if name == "proxyauth":
        assert [a["status"] for a in dump["answers"]] == [401, 200]
    if name == "scripts":
        assert first["body"]["headers"]["x-script"] == "1"


def test_a_reply_over_body_size_limit_is_said_in_its_record(
    echo: int, confdir: Path, tmp_path: Path
) -> None:
    """A JSON reply mitmproxy buffers (the addon's default leaves a reply of known length that is
    no stream to it) past `body_size_limit`: the client gets mitmproxy's 502, and the record
    says why (`mitmproxy.error`, finding proxy_failed with its cause and fix), not an error
    without a word."""
    port, records = free_port(), tmp_path / "records.jsonl"
    proc = Proc(
        [
            str(Path(sys.executable).with_name("mitmdump")),
            *("-q", "-s", str(addon_path())),
            *("--mode", f"reverse:http://127.0.0.1:{echo}@127.0.0.1:{port}"),
            *("--set", f"hopmeter_records={records}", "--set", "hopmeter_metrics=off"),
            *("--set", "body_size_limit=100", "--set", f"confdir={confdir}"),
        ],
        tmp_path / "mitmdump.log",
    )
    try:
        proc.wait_port(port)
        (answer,) = ask(port, [("GET", "/v1/models", {})])
        (rec,) = read_records(records, 1)
    finally:
        proc.stop()
    assert answer["status"] == 502
    assert rec["ended"] == "error"
    assert "body_size_limit" in rec["mitmproxy"]["error"]
    (finding,) = [f for f in rec["findings"] if f["kind"] == "proxy_failed"]
    assert finding["evidence"]["cause"] == "body_size_limit"
    assert "Raise body_size_limit" in finding["fix"]
