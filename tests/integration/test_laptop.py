"""On a laptop: the openai SDK through hopmeter as an explicit HTTPS proxy, trusting its CA."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import openai
import pytest

from hopmeter.upstream.formats import reply_tokens
from hopmeter.upstream.scenario import Scenario
from tests.harness.procs import demo_path, free_port, hopmeter, read_records, wait_for

pytestmark = pytest.mark.integration


def test_openai_sdk_over_https_through_regular_mode(tmp_path: Path) -> None:
    """The SDK streams intact over HTTPS via HTTPS_PROXY-style config, and the flow is measured."""
    up, port = free_port(), free_port()
    confdir, certs = tmp_path / "mitmproxy", tmp_path / "upstream-tls"
    records = tmp_path / "records.jsonl"
    with (
        hopmeter(
            tmp_path,
            "upstream",
            "--listen",
            f"127.0.0.1:{up}",
            "--tls-dir",
            str(certs),
            name="upstream",
            ports=(up,),
        ),
        hopmeter(
            tmp_path,
            "run",
            "--listener",
            f"laptop=regular@127.0.0.1:{port}",
            "--records",
            str(records),
            "--metrics",
            "off",
            "--set",
            f"confdir={confdir}",
            # hopmeter checks the upstream's certificate like any client would: trust the demo's
            "--set",
            f"ssl_verify_upstream_trusted_ca={certs / 'cert.pem'}",
            ports=(port,),
        ),
    ):
        ca = wait_for(
            lambda: (
                (confdir / "mitmproxy-ca-cert.pem").exists() and confdir / "mitmproxy-ca-cert.pem"
            ),
            what="hopmeter's CA certificate",
        )
        trust = ssl.create_default_context(cafile=str(ca))
        http = httpx.Client(proxy=f"http://127.0.0.1:{port}", verify=trust)
        client = openai.OpenAI(
            base_url=f"https://127.0.0.1:{up}/v1",
            api_key="sk-laptop",
            http_client=http,
            max_retries=0,
        )
        stream = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        rec = read_records(records, 1)[0]
    assert text == "".join(reply_tokens(Scenario())[1])
    assert rec["hop"] == "laptop" and rec["request"]["scheme"] == "https"
    assert rec["api"] == "openai.chat" and rec["figures"]["tokens"] == Scenario().tokens
    assert rec["figures"]["ttft_s"] is not None and rec["response"]["ended"] == "complete"


def test_chaos_recuts_for_the_client_and_measures_the_original(tmp_path: Path) -> None:
    """--chaos crlf,rechunk changes what the client gets (same events) but not what is measured."""
    with demo_path(tmp_path, "--chaos", "crlf,rechunk,split_utf8", "--chaos-seed", "7") as path:
        proxy, records, port = path.proxy, path.records, path.port
        body = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"stream": True},
            headers={"x-hopmeter-scenario": "tokens=20;emoji=1"},
        ).content
        rec = read_records(records, 1)[0]
    assert b"\r\n\r\n" in body and b"\n\n" not in body.replace(b"\r\n", b"")
    assert rec["chaos"] == ["crlf", "rechunk", "split_utf8"]
    assert rec["response"]["bytes_out"] == len(body) > rec["response"]["bytes_wire"]
    assert "line_endings" not in [f["kind"] for f in rec["findings"]]  # upstream sent LF
    assert "CHAOS is on" in proxy.output()
