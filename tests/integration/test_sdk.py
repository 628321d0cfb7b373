"""Official SDKs stream through hopmeter intact, and hopmeter's figures match what upstream sent."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from hopmeter.upstream.formats import reply_tokens
from hopmeter.upstream.scenario import Scenario, apply, parse_pairs
from tests.harness.procs import demo_path, measuring, read_records, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

pytestmark = pytest.mark.integration
SECRET = "sk-hopmeter-test-0123456789abcdef"


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The demo upstream and hopmeter in front of it, as two real processes."""
    tmp = tmp_path_factory.mktemp("sdk")
    with demo_path(tmp) as p:
        up_port, port, records = p.upstream_port, p.port, p.records
        yield {
            "proxy": f"http://127.0.0.1:{port}",
            "upstream": f"http://127.0.0.1:{up_port}",
            "records": records,
            "count": [0],
        }


def _next_record(path: dict[str, Any]) -> dict[str, Any]:
    path["count"][0] += 1
    return read_records(path["records"], path["count"][0])[-1]


def _sent(path: dict[str, Any], request_id: str) -> dict[str, Any]:
    return httpx.get(f"{path['upstream']}/_hopmeter/sends/{request_id}").json()


def _expected_text(scenario: str) -> str:
    return "".join(reply_tokens(apply(Scenario(), parse_pairs(scenario)))[1])


def _check_against_upstream(rec: dict[str, Any], sent: dict[str, Any]) -> None:
    token_sends = [e for e in sent["events"] if e[1] > 0]
    first_seen = rec["request"]["t_start"] + rec["figures"]["ttft_s"]
    # the first visible token hopmeter saw is the one upstream sent first, not the prelude
    assert token_sends[0][0] <= first_seen < token_sends[1][0]
    assert rec["figures"]["tokens"] == sent["tokens"]
    assert rec["figures"]["tokens_source"] == "usage"


def test_openai_sdk_streams_intact_and_measured(path: dict[str, Any]) -> None:
    """openai's SDK gets the whole reply; TTFT is the first token's, tokens match the send log."""
    scenario = "tokens=30;rate=20;prelude_s=0.3;emoji=1"
    client = openai.OpenAI(
        base_url=f"{path['proxy']}/v1",
        api_key=SECRET,
        max_retries=0,
        default_headers={"x-hopmeter-scenario": scenario},
    )
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "a secret prompt"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    request_id = raw.headers["x-hopmeter-request-id"]
    text, usage = "", None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    rec = _next_record(path)
    assert text == _expected_text(scenario)
    assert usage is not None and usage.completion_tokens == 30
    assert rec["api"] == "openai.chat" and rec["model"] == "gpt-4o-mini"
    _check_against_upstream(rec, _sent(path, request_id))
    # the prelude's 0.3 s wait (the prelude itself may reach the proxy a little late on a busy
    # host, which shortens what the proxy sees of the wait, never lengthens it past it)
    assert rec["figures"]["ttft_s"] - rec["figures"]["ttfb_s"] >= 0.25
    line = path["records"].read_text()
    assert SECRET not in line and "a secret prompt" not in line and "Bearer" not in line


def test_anthropic_sdk_streams_intact_and_measured(path: dict[str, Any]) -> None:
    """anthropic's SDK gets the whole reply with thinking; tokens match the send log."""
    scenario = "tokens=24;reasoning=6;rate=20"
    client = anthropic.Anthropic(
        base_url=path["proxy"],
        api_key=SECRET,
        max_retries=0,
        default_headers={"x-hopmeter-scenario": scenario},
    )
    with client.messages.stream(
        model="claude-demo-1", max_tokens=200, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        request_id = stream.response.headers["x-hopmeter-request-id"]
    rec = _next_record(path)
    assert text == _expected_text(scenario)
    assert final.usage.output_tokens == 30
    assert rec["api"] == "anthropic.messages" and rec["model"] == "claude-demo-1"
    _check_against_upstream(rec, _sent(path, request_id))
    # reasoning first: the first non-reasoning token comes after the first visible one
    assert rec["figures"]["ttft_content_s"] > rec["figures"]["ttft_s"]


def test_coalesced_events_give_the_token_clock(path: dict[str, Any]) -> None:
    """Four tokens per event at 20 tokens/s is an inter-token latency of ~50 ms, not ~200 ms."""
    r = httpx.post(
        f"{path['proxy']}/v1/chat/completions",
        json={"model": "m", "stream": True},
        headers={"x-hopmeter-scenario": "tokens=40;rate=20;coalesce=4"},
        timeout=30,
    )
    assert r.status_code == 200
    rec = _next_record(path)
    fig = rec["figures"]
    assert fig["tokens"] == 40
    assert 0.5 * 0.05 < fig["itl_p50_s"] < 2 * 0.05
    assert fig["max_gap_s"] > 3 * 0.05  # the raw gap between events is k times the clock
    assert not [f for f in rec["findings"] if f["kind"] in ("burst_gaps", "whole_body_hold")]


def test_an_sdk_that_hangs_up_at_the_terminal_event_records_a_complete_reply(
    tmp_path: Path,
) -> None:
    """openai's SDK closes the response at `data: [DONE]`. When the body's end (the last chunk)
    comes after that, the client has hung up before the body ended, with the whole reply: the
    record says `complete`, not `client_gone`, and detects nothing cut."""
    closed = threading.Event()  # the SDK's loop has returned: it closed the response
    waited: list[bool] = []

    async def reply(ex: Exchange) -> None:
        await ex.head({"content-type": "text/event-stream"})
        for word in ("Hello", " there", "!"):
            doc = {"model": "m", "choices": [{"index": 0, "delta": {"content": word}}]}
            await ex.chunk(b"data: " + orjson.dumps(doc) + b"\n\n")
        await ex.chunk(b"data: [DONE]\n\n")
        # the body's end only after the client has hung up (and the proxy has had time to see it)
        waited.append(await asyncio.to_thread(closed.wait, 30))
        await asyncio.sleep(0.5)
        with contextlib.suppress(ConnectionError):  # the proxy may have dropped it by now
            await ex.end()

    with (
        ScriptedUpstream(reply) as up,
        measuring(tmp_path, f"http://127.0.0.1:{up.port}") as proxy,
    ):
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=SECRET, max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[], stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        closed.set()
        rec = read_records(proxy.records, 1)[0]
        assert wait_for(lambda: waited, what="the upstream to send the body's end") == [True]
    assert text == "Hello there!"
    assert rec["response"]["ended"] == "complete" and rec["ended"] == "complete"
    assert rec["stream"]["terminal_seen"] is True
    assert not [f for f in rec["findings"] if f["kind"] == "truncated"]
