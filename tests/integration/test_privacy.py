"""Privacy on real processes: planted keys, cookies, prompt and reply never reach records, logs
or metrics (reply text only with --log-content, keys not even then); admin endpoints on loopback."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import orjson
import pytest

from hopmeter.cli import build_parser
from tests.harness.procs import free_port, hopmeter, measuring, read_records, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration

# Each secret is a string no hopmeter code or log line would produce by itself.
BEARER = "sk-proj-PLANTEDbearer7f3a9c1e"
X_API_KEY = "PLANTEDxapikey5b2d8e"
COOKIE = "PLANTEDcookie4c1f0a"
SET_COOKIE = "PLANTEDsetcookie9e7b3d"
QUERY_KEY = "AIzaPLANTEDquerykey2a6c"
PROMPT = "PLANTEDprompt tell me the launch codes"
REPLY = "PLANTEDreply the codes are 0000"
KEYS = (BEARER, X_API_KEY, COOKIE, SET_COOKIE, QUERY_KEY)


def _event(text: str) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"delta": {"content": text}}]}) + b"\n\n"


async def _serve(ex: Exchange) -> None:
    headers = {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        "set-cookie": f"session={SET_COOKIE}; HttpOnly",
    }
    if ex.path.startswith("/v1/chat/completions/echo"):  # errors that quote the request
        await ex.head(headers)
        await ex.chunk(_event("Sure. "))
        for error in (
            # a gateway's 401 that quotes the key it got, and a validator that quotes the prompt
            {"type": "auth_error", "code": 401, "message": f"Invalid key {BEARER} ({X_API_KEY})"},
            {
                "type": "invalid_request_error",
                "message": f"extra field in {{'content': '{PROMPT}'}}",
            },
            {"param": X_API_KEY, "detail": f"expired; cookie {COOKIE}"},  # no kind, no message
        ):
            await ex.chunk(b"data: " + orjson.dumps({"error": error}) + b"\n\n")
        await ex.end()
        return
    if ex.path.startswith("/v1/chat/completions/cut"):  # an error path logs too
        await ex.head(headers)
        await ex.chunk(_event(REPLY))
        ex.writer.transport.abort()
        return
    await ex.head(headers)
    for text in ("Sure. ", REPLY, " Anything else?"):
        await ex.chunk(_event(text))
    await ex.chunk(b"data: [DONE]\n\n")
    await ex.end()


def _send_secrets(port: int) -> None:
    """A streamed chat request and a cut one, each carrying every planted secret."""
    headers = {
        "authorization": f"Bearer {BEARER}",
        "x-api-key": X_API_KEY,
        "cookie": f"sid={COOKIE}",
    }
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as c:
        r = c.post(f"/v1/chat/completions?key={QUERY_KEY}", json=body)
        assert REPLY.encode() in r.content and r.headers["set-cookie"].startswith("session=")
        with pytest.raises(httpx.RemoteProtocolError):
            c.post(f"/v1/chat/completions/cut?key={QUERY_KEY}", json=body)
        assert (
            BEARER.encode()
            in c.post(f"/v1/chat/completions/echo?key={QUERY_KEY}", json=body).content
        )


def _run(tmp: Path, *extra: str) -> tuple[str, str, str]:
    """Proxy the planted requests; (records, the proxy's whole output, a /metrics scrape)."""
    metrics = free_port()
    with (
        ScriptedUpstream(_serve) as up,
        measuring(
            tmp,
            f"http://127.0.0.1:{up.port}",
            *("--metrics", f"127.0.0.1:{metrics}", *extra),
            ports=(metrics,),
        ) as running,
    ):
        proxy, records = running.proc, running.records
        _send_secrets(running.port)
        read_records(records, 3)

        def scraped() -> str | None:
            text = httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
            return text if "hopmeter_flows_total{" in text else None

        scrape = wait_for(scraped, what="flows in /metrics")
        assert proxy.stop(signal.SIGTERM) == 0  # every log line written
    return records.read_text(), proxy.output(), scrape


def test_no_secret_or_content_anywhere_by_default(tmp_path: Path) -> None:
    """Without --log-content no key, cookie, prompt or reply is in records, logs or metrics."""
    records, logs, metrics = _run(tmp_path, "--verbose")  # the most talkative console
    for secret in (*KEYS, PROMPT, REPLY):
        assert secret not in records, secret
        assert secret not in logs, secret
        assert secret not in metrics, secret
    assert '"/v1/chat/completions"' in records  # the path is kept, its query is not
    (echoed,) = [r for r in map(orjson.loads, records.splitlines()) if r["stream"]["errors"]]
    # the upstream's error messages quoted the key, the prompt and a cookie: their kinds only
    assert echoed["stream"]["errors"] == ["auth_error: 401", "invalid_request_error", "error"]
    assert echoed["stream"]["errors_seen"] == 3
    assert "client connect" in logs  # the console did speak about these flows


def test_each_flow_is_a_console_line_without_secrets(tmp_path: Path) -> None:
    """Each finished flow is one console line (README), and that line carries no secret."""
    _records, logs, _metrics = _run(tmp_path)
    for secret in (*KEYS, PROMPT, REPLY):
        assert secret not in logs, secret
    assert "ended=complete" in logs and "ended=upstream_reset" in logs


def test_log_content_adds_the_reply_and_never_a_key(tmp_path: Path) -> None:
    """With --log-content the reply text is in the records; keys and cookies still are not."""
    records, logs, metrics = _run(tmp_path, "--log-content", "--verbose")
    assert REPLY in records
    for rec in map(orjson.loads, records.splitlines()):
        assert REPLY in rec["content"] or rec["request"]["path"].endswith("/echo")
    for secret in KEYS:
        assert secret not in records, secret
        assert secret not in logs, secret
        assert secret not in metrics, secret
    (echoed,) = [r for r in map(orjson.loads, records.splitlines()) if r["stream"]["errors"]]
    # the messages now, the request's own key, x-api-key and cookie taken out of them
    assert echoed["stream"]["errors"][0] == "auth_error: 401: Invalid key [redacted] ([redacted])"
    assert PROMPT in echoed["stream"]["errors"][1]  # the prompt is content: --log-content asked
    for secret in (PROMPT, REPLY):
        assert secret not in logs, secret
        assert secret not in metrics, secret


def _listening(pid: int, port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(address)
    return found


LOOPBACK = "0100007F"  # 127.0.0.1, little-endian hex
ANY = "00000000"  # 0.0.0.0


def test_admin_endpoints_bind_loopback_by_default(tmp_path: Path) -> None:
    """--metrics and --listen default to 127.0.0.1; a bare port also means 127.0.0.1."""
    args = build_parser().parse_args(["run"])
    assert args.metrics == "127.0.0.1:9464" and args.listen.startswith("127.0.0.1:")
    port, metrics = free_port(), free_port()
    with hopmeter(
        tmp_path,
        "run",
        "http://127.0.0.1:9",
        "--listen",
        str(port),
        "--metrics",
        str(metrics),
        ports=(port, metrics),
    ) as proxy:
        assert _listening(proxy.popen.pid, metrics) == {LOOPBACK}
        assert _listening(proxy.popen.pid, port) == {LOOPBACK}
        assert httpx.get(f"http://127.0.0.1:{metrics}/healthz").status_code == 200
    assert "WARNING" not in proxy.output()


def test_metrics_on_every_interface_warns_loudly(tmp_path: Path) -> None:
    """--metrics 0.0.0.0:PORT binds as asked and says, in one WARNING line, what it exposes."""
    port, metrics = free_port(), free_port()
    with hopmeter(
        tmp_path,
        "run",
        "http://127.0.0.1:9",
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics",
        f"0.0.0.0:{metrics}",
        ports=(port, metrics),
    ) as proxy:
        assert _listening(proxy.popen.pid, metrics) == {ANY}
        line = wait_for(
            lambda: next(
                (ln for ln in proxy.output().splitlines() if "WARNING" in ln and "metrics" in ln),
                None,
            ),
            what="the warning",
        )
    assert "listens beyond this host" in line and f"0.0.0.0:{metrics}" in line
