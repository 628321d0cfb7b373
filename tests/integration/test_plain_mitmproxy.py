"""What mitmproxy's own users keep with hopmeter loaded (docs/mitmproxy.md): saved
bodies, their own stream callables and edits, and honest records of mitmproxy's own failures.

Real mitmdump (and mitmweb), loaded with `-s "$(hopmeter --addon-path)"` as a user loads it, in
front of the demo upstream or a scripted one on loopback; real HTTP clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mitmproxy import io as mitmio

from hopmeter.cli import addon_path
from tests.harness.mitmweb import MitmWeb
from tests.harness.procs import Proc, free_port, hopmeter, read_records, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream
from tests.integration.test_smoke import MITMDUMP

pytestmark = pytest.mark.integration
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
# a user's own addon: upper-cases "data" in every chunk, and counts the chunks it saw
UPPER = """
from pathlib import Path
SEEN = Path({seen!r})
def responseheaders(flow):
    def upper(data):
        with SEEN.open("a") as f:
            f.write(f"{{len(data)}}\\n")
        return data.replace(b"data:", b"DATA:")
    flow.response.stream = upper
"""


class Dump:
    """A mitmdump with hopmeter, saving flows (-w) and writing records."""

    def __init__(self, tmp: Path, upstream: int, *args: str, before: str = "", after: str = ""):
        self.port = free_port()
        self.saved = tmp / "flows.mitm"
        self.records = tmp / "records.jsonl"
        scripts = [*(("-s", before) if before else ()), "-s", str(addon_path())]
        scripts += ["-s", after] if after else []
        self.proc = Proc(
            [
                MITMDUMP,
                *("--mode", f"reverse:http://127.0.0.1:{upstream}@127.0.0.1:{self.port}"),
                *scripts,
                *("-w", str(self.saved), "--set", f"confdir={tmp / 'mitm'}"),
                *("--set", "hopmeter_metrics=off", "--set", f"hopmeter_records={self.records}"),
                *args,
            ],
            tmp / "mitmdump.log",
        )
        self.proc.wait_port(self.port, 60)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop mitmdump (the save file is complete once it has exited)."""
        self.proc.stop()

    def saved_flows(self) -> dict[str, Any]:
        """The flows `-w` saved, by request path."""
        with self.saved.open("rb") as f:
            return {flow.request.path: flow for flow in mitmio.FlowReader(f).stream()}


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[int]:
    """The demo upstream: streamed replies, and one JSON document when `stream` is false."""
    port = free_port()
    with hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{port}", name="up", ports=(port,)):
        yield port


def _ask(base: str, path: str, stream: bool, scenario: str = "tokens=30;rate=200") -> bytes:
    r = httpx.post(
        f"{base}{path}",
        json={**CHAT, "stream": stream},
        headers={"x-hopmeter-scenario": scenario},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.content


def test_saved_flows_hold_the_bodies_the_client_got(tmp_path: Path, upstream: int) -> None:
    """`mitmdump -w` with hopmeter keeps every response body as the client got it: streamed,
    gzipped and not streamed; the records say what was kept."""
    dump = Dump(tmp_path, upstream)
    try:
        got = {
            "/v1/chat/completions?a": _ask(dump.url, "/v1/chat/completions?a", True),
            "/v1/chat/completions?b": _ask(dump.url, "/v1/chat/completions?b", False),
            "/v1/chat/completions?c": _ask(dump.url, "/v1/chat/completions?c", True, "gzip=1"),
        }
        records = read_records(dump.records, 3)
    finally:
        dump.stop()
    saved = dump.saved_flows()
    for path, body in got.items():
        response = saved[path].response
        assert response is not None and response.content == body, path
    by_stream = {r["mitmproxy"]["stream"]: r["mitmproxy"] for r in records}
    assert by_stream["hopmeter"]["body_kept_bytes"] == by_stream["hopmeter"]["body_bytes"] > 0
    assert by_stream["buffered"]["buffered_by"] == "not_a_stream"  # a JSON reply of known size


def test_a_body_past_the_cap_keeps_what_fits_and_says_so(tmp_path: Path, upstream: int) -> None:
    """With hopmeter_keep_body=1k a longer streamed body is saved cut at 1 KiB, and both the
    flow and the record say it was clipped; the client still gets all of it."""
    dump = Dump(tmp_path, upstream, "--set", "hopmeter_keep_body=1k")
    try:
        body = _ask(dump.url, "/v1/chat/completions", True)
        (record,) = read_records(dump.records, 1)
    finally:
        dump.stop()
    (flow,) = dump.saved_flows().values()
    assert len(body) > 1024 and flow.response is not None
    assert flow.response.raw_content == body[:1024]
    assert flow.metadata["hopmeter_body"] == f"clipped (flow_cap): kept 1024 of {len(body)} bytes"
    section = record["mitmproxy"]
    assert (section["body_kept_bytes"], section["body_bytes"]) == (1024, len(body))
    assert section["body_clipped"] == "flow_cap"


def test_a_users_stream_callable_runs_on_every_chunk(tmp_path: Path, upstream: int) -> None:
    """A user's addon loaded before hopmeter keeps its stream callable: it sees every chunk, its
    changes reach the client, and hopmeter measures the bytes as they leave."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "upper.py"
    script.write_text(UPPER.format(seen=str(seen)))
    dump = Dump(tmp_path, upstream, before=str(script))
    try:
        body = _ask(dump.url, "/v1/chat/completions", True)
        (record,) = read_records(dump.records, 1)
    finally:
        dump.stop()
    assert body.startswith(b"DATA: ") and b"\ndata:" not in body
    sizes = [int(n) for n in seen.read_text().split()]
    assert sum(sizes) == len(body) and sizes[-1] == 0  # every chunk, then the end call
    assert len(record["chunks"]) == len(sizes) - 1
    assert record["mitmproxy"]["stream"] == "chained" and record["ended"] == "complete"


def test_an_addon_loaded_after_hopmeter_that_replaces_its_tap_is_said(
    tmp_path: Path, upstream: int
) -> None:
    """A user's addon loaded after hopmeter replaces its stream callable: the user's runs, the
    record says hopmeter's was replaced, and one line says how to load them."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "upper.py"
    script.write_text(UPPER.format(seen=str(seen)))
    dump = Dump(tmp_path, upstream, after=str(script))
    try:
        body = _ask(dump.url, "/v1/chat/completions", True)
        (record,) = read_records(dump.records, 1)
    finally:
        dump.stop()
    assert body.startswith(b"DATA: ")
    assert record["mitmproxy"]["stream"] == "replaced"
    assert "load hopmeter after it" in dump.proc.output()
    # nothing of the body was measured: no figures, no finding drawn from an empty stream
    # not measured: the API its request's path names, as for any flow whose body was not
    assert record["api"] == "openai.chat" and record["findings"] == []
    assert record["delivery"]["measured"] is False


def test_modify_body_on_a_json_reply_is_applied(tmp_path: Path, upstream: int) -> None:
    """modify_body edits a JSON reply (hopmeter leaves it to mitmproxy to buffer) in the client's
    bytes and the saved flow, and the record says it was edited."""
    dump = Dump(tmp_path, upstream, "--set", "modify_body=/~s/chatcmpl/CHATCMPL")
    try:
        body = _ask(dump.url, "/v1/chat/completions", False)
        (record,) = read_records(dump.records, 1)
    finally:
        dump.stop()
    assert b"CHATCMPL" in body and b"chatcmpl" not in body
    (flow,) = dump.saved_flows().values()
    assert flow.response is not None and flow.response.content == body
    section = record["mitmproxy"]
    assert section == {
        **section,
        "stream": "buffered",
        "buffered_by": "modify_body",
        "edited": "response",
    }
    assert record["ended"] == "complete" and record["figures"]["tokens"] > 0


def test_hopmeter_buffer_lets_a_script_edit_a_stream(tmp_path: Path, upstream: int) -> None:
    """A response hook can edit a stream hopmeter_buffer names (mitmproxy buffers it); without
    it the edit cannot reach the client, and the record says so with the fix."""
    script = tmp_path / "edit.py"
    script.write_text(
        "def response(flow):\n"
        "    if flow.response.content:\n"
        "        flow.response.content = flow.response.content.replace(b'data:', b'DATA:')\n"
    )
    buffered = Dump(tmp_path, upstream, "--set", "hopmeter_buffer=~s", after=str(script))
    try:
        body = _ask(buffered.url, "/v1/chat/completions", True)
        (record,) = read_records(buffered.records, 1)
    finally:
        buffered.stop()
    assert body.startswith(b"DATA: ")
    assert record["mitmproxy"]["buffered_by"] == "hopmeter_buffer"
    assert record["mitmproxy"]["edited"] == "response"
    (tmp_path / "again").mkdir()
    streamed = Dump(tmp_path / "again", upstream, after=str(script))
    try:
        body = _ask(streamed.url, "/v1/chat/completions", True)
        (record,) = read_records(streamed.records, 1)
    finally:
        streamed.stop()
    assert body.startswith(b"data: ")  # streamed before the hook ran
    assert record["mitmproxy"]["edited"] == "after_streaming"
    (finding,) = [f for f in record["findings"] if f["kind"] == "edited_after_streaming"]
    assert "hopmeter_buffer" in finding["fix"]


async def _trailers(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream", "trailer": "x-checksum"})
    await ex.chunk(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n')
    ex.writer.write(b"0\r\nx-checksum: abc\r\n\r\n")  # mitmproxy 12 cannot forward trailers
    await ex.writer.drain()


async def _early_hints(ex: Exchange) -> None:
    ex.writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\n\r\n")
    await ex.writer.drain()
    await asyncio.sleep(0.05)
    body = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
    ex.writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    await ex.writer.drain()


@pytest.mark.parametrize(
    ("handler", "detail"),
    [
        (_trailers, "NotImplementedError: HTTP trailers are not implemented yet."),
        (_early_hints, "HTTP/1 103 Early Hints taken for the final response"),
    ],
)
def test_what_mitmproxy_cannot_forward_is_never_complete(
    tmp_path: Path, handler: Any, detail: str
) -> None:
    """A response mitmproxy fails on (HTTP/1 trailers) or takes a 1xx for (103 Early Hints) is
    recorded as an error with the cause, and the client's connection is closed: the client can
    tell, instead of waiting for the end of a reply that never comes."""
    with ScriptedUpstream(handler) as up:
        dump = Dump(tmp_path, up.port)
        try:
            with pytest.raises(httpx.HTTPError):  # cut (no last chunk) or closed unanswered
                httpx.post(f"{dump.url}/v1/chat/completions", json=CHAT, timeout=20).read()
            (record,) = read_records(dump.records, 1)
        finally:
            dump.stop()
    assert record["ended"] == "error" and record["mitmproxy"]["error"] == detail
    assert record["findings"][0]["kind"] == "proxy_failed"
    assert ("response" in record) is (handler is _trailers)  # a 1xx is no final response
    if handler is _early_hints:
        assert record["mitmproxy"]["informational"] == [103]


# a user's own addon: kills in `request` the requests whose path says so
KILL = """
def request(flow):
    if "kill" in flow.request.path:
        flow.kill()
"""


async def _answer(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream"})
    await ex.chunk(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    await ex.chunk(b"data: [DONE]\n\n")
    await ex.end()


def test_a_request_hook_acts_before_anything_goes_upstream(tmp_path: Path) -> None:
    """With the addon, a request body stays buffered as mitmproxy has it: a user's `request`
    hook that kills the flow stops it before the upstream sees anything, as without hopmeter;
    a request that goes on reaches the upstream whole, its size and model in the record, and
    the saved flow keeps its body (replay needs it)."""
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    with ScriptedUpstream(_answer) as up:
        dump = Dump(tmp_path, up.port, before=str(script))
        try:
            with pytest.raises(httpx.HTTPError):
                httpx.post(f"{dump.url}/v1/chat/completions/kill", json=CHAT, timeout=20)
            body = _ask(dump.url, "/v1/chat/completions", True)
            records = read_records(dump.records, 2)
        finally:
            dump.stop()
        assert [ex.path for ex in up.requests] == ["/v1/chat/completions"]
        sent = up.requests[0].body
    assert body.endswith(b"data: [DONE]\n\n")
    killed = next(r for r in records if r["request"]["path"].endswith("/kill"))
    assert killed["ended"] == "error" and killed["mitmproxy"]["killed"] is True
    rec = next(r for r in records if r["request"]["path"] == "/v1/chat/completions")
    assert rec["request"]["bytes"] == len(sent) and rec["model"] == "gpt-4o-mini"
    assert rec["mitmproxy"]["request_buffered_by"] == "not_a_stream"
    saved = dump.saved_flows()["/v1/chat/completions"]
    assert saved.request.content == sent


def test_mitmweb_shows_the_body_and_hopmeters_view(tmp_path: Path, upstream: int) -> None:
    """In mitmweb a streamed flow shows its body (hopmeter's copy) and hopmeter's view."""
    port = free_port()
    with MitmWeb(tmp_path, f"reverse:http://127.0.0.1:{upstream}@127.0.0.1:{port}") as web:
        assert web.proc is not None
        web.proc.wait_port(port, 60)
        body = _ask(f"http://127.0.0.1:{port}", "/v1/chat/completions", True)
        (flow,) = wait_for(
            lambda: [f for f in web.api.flows() if f.get("comment")], 20, "the flow's verdict"
        )
        raw = web.api.view(flow["id"], "raw")
        view = web.api.view(flow["id"], "hopmeter")
    assert raw["text"] == body.decode()
    assert "ttft" in view["text"].lower()
