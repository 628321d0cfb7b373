"""Tests for hopmeter.probe.canary: what the probe asks for and what the canary sends back."""

from __future__ import annotations

from hopmeter.probe.canary import CANARY_MODEL, PROMPT, RANDOM_CUTS_KEY, Spec
from hopmeter.upstream.scenario import Scenario, from_request, parse_pairs


def test_every_reply_key_is_set_so_server_defaults_cannot_change_the_reply() -> None:
    """The header pins every key that shapes the reply, whatever the upstream's own defaults."""
    spec = Spec(line_ending="cr", seed=9)
    server_defaults = Scenario(coalesce=3, jitter=0.5, stall_at=4, gzip=True, reasoning=2)
    pairs = [kv for kv in parse_pairs(spec.header()) if kv[0] != RANDOM_CUTS_KEY]
    assert from_request(server_defaults, {}, ";".join(f"{k}={v}" for k, v in pairs)) == (
        spec.scenario()
    )
    assert f"{RANDOM_CUTS_KEY}=" in spec.header()
    assert f"{RANDOM_CUTS_KEY}=" not in Spec(random_cuts=False).header()


def test_expected_reply_has_emoji_and_the_line_ending_asked_for() -> None:
    """The expected body carries emoji and CJK and only CRLF line ends for a CRLF probe."""
    body = Spec(line_ending="crlf").expected_body()
    assert "🦙".encode() in body and "猫".encode() in body
    assert body.count(b"\r\n") == body.count(b"\n")
    assert "🦙" in Spec().expected_text()


def test_the_request_is_one_any_endpoint_answers() -> None:
    """The body names the model and asks a real model for emoji and CJK; Anthropic gets a
    max_tokens, OpenAI the usage chunk."""
    chat = Spec(model="gpt-4o-mini").request()
    assert chat["model"] == "gpt-4o-mini" and chat["stream"] is True
    assert chat["messages"] == [{"role": "user", "content": PROMPT}]
    assert chat["stream_options"] == {"include_usage": True} and "max_tokens" not in chat
    claude = Spec(api="anthropic", model="claude-x").request()
    assert isinstance(claude["max_tokens"], int) and "stream_options" not in claude
    assert "🐱" in PROMPT and "猫" in PROMPT
    assert Spec().model == CANARY_MODEL


def test_the_expected_body_names_the_model_asked_for() -> None:
    """The canary's events carry the model the request named, as the upstream echoes it."""
    assert b'"model":"demo-1"' in Spec(model="demo-1").expected_body()


def test_played_is_read_from_the_echoed_scenario_or_else_the_text() -> None:
    """An echoed scenario decides (also renamed by a gateway); without one, the canary's text
    from a hopmeter upstream does; a real origin never played it."""
    spec = Spec(line_ending="lf")
    text = spec.expected_text()
    assert spec.played({"x-hopmeter-scenario": spec.header()}, "anything")
    assert spec.played({"llm_provider-x-hopmeter-scenario": spec.header()}, "")
    assert not spec.played({"x-hopmeter-scenario": Spec(line_ending="cr").header()}, text)
    assert spec.played({"x-hopmeter-request-id": "3"}, text)
    assert not spec.played({"x-hopmeter-request-id": "3"}, "Hello there")
    assert not spec.played({}, text)
