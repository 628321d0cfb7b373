"""The LiteLLM harness: its config, and what the real gateway does to a stream, by behaviour."""

from __future__ import annotations

import httpx
import pytest

from tests.harness.litellm import Gateway, Route, config

SCENARIO = "tokens=8;rate=100;emoji=1;line_ending=crlf"


def test_config_forwards_headers_per_route_and_traceparent_when_asked() -> None:
    """Header forwarding is per model group; traceparent needs the otel callback with its flag."""
    routes = [Route("a", "http://u/v1"), Route("b", "http://u/v1", forward_headers=True)]
    plain = config(routes)
    assert [m["model_name"] for m in plain["model_list"]] == ["a", "b"]  # type: ignore[attr-defined]
    assert plain["litellm_settings"] == {
        "model_group_settings": {"forward_client_headers_to_llm_api": ["b"]}
    }
    traced = config(routes[:1], forward_traceparent=True)
    assert traced["litellm_settings"] == {
        "callbacks": ["otel"],
        "forward_traceparent_to_llm_provider": True,
    }


def _stream(gateway: Gateway, model: str) -> httpx.Response:
    gw = gateway.litellm
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {**gw.headers(), "x-hopmeter-scenario": SCENARIO}
    return httpx.post(gw.chat_url, json=body, headers=headers, timeout=60)


@pytest.mark.integration
def test_the_gateway_renames_headers_reframes_and_drops_the_scenario(
    litellm_gateway: Gateway,
) -> None:
    """Through `demo` the scenario header is dropped (no emoji, LF); through `demo-fwd` it is
    played, re-framed to LF; both replies name the upstream only under llm_provider- headers."""
    dropped = _stream(litellm_gateway, "demo")
    played = _stream(litellm_gateway, "demo-fwd")
    for r in (dropped, played):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert "x-hopmeter-request-id" not in r.headers
        assert r.headers["llm_provider-x-hopmeter-request-id"]
        assert b"\r" not in r.content  # every event rewritten with LF
    assert "llm_provider-x-hopmeter-scenario" not in dropped.headers
    assert played.headers["llm_provider-x-hopmeter-scenario"] == SCENARIO
    assert "🦙".encode() in played.content and "🦙".encode() not in dropped.content
    assert b'"model":"demo-fwd"' in played.content  # renamed to the route's name
