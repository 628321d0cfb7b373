"""`hopmeter probe` through a real LiteLLM gateway with a `hopmeter upstream` behind it.

LiteLLM routes by model name (the probe must ask for one it serves), re-frames every event,
renames the upstream's response headers (`llm_provider-x-hopmeter-request-id`) and, as shipped,
drops the client's X-Hopmeter-Scenario header. The probe passes on the route that forwards the
header (the canary is played: its text and holds are checked, from the upstream's send log), and
on the route that drops it judges timing only, saying so, with no hold invented against the clock
it asked for.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import orjson
import pytest

from hopmeter.errors import HopmeterError
from hopmeter.probe import command as probe
from tests.harness.litellm import Gateway

pytestmark = pytest.mark.integration
SHORT = ["--tokens", "20", "--rate", "20"]  # a 1 s canary, long enough to see a hold
KEY_VAR = "HOPMETER_TEST_GATEWAY_KEY"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    parser = argparse.ArgumentParser(prog="hopmeter")
    probe.add_parser(parser.add_subparsers(dest="command"))
    status = probe.run(parser.parse_args(["probe", *argv, "--json"]))
    out, err = capsys.readouterr()
    return status, orjson.loads(out), out + err


@pytest.fixture
def key(litellm_gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> str:
    """The gateway's master key, in the environment variable the probe is told to read."""
    monkeypatch.setenv(KEY_VAR, litellm_gateway.litellm.key)
    return litellm_gateway.litellm.key


def test_the_canary_through_the_gateway_passes_on_text_and_holds(
    litellm_gateway: Gateway, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Via the route that forwards headers, the upstream plays the canary; the gateway's
    re-framing is said once, the text arrives intact and no token is held."""
    gw = litellm_gateway
    status, doc, printed = _run(
        capsys,
        gw.litellm.url,
        *SHORT,
        *("--model", "demo-fwd", "--api-key-env", KEY_VAR),
        *("--upstream-admin", gw.upstream_url),
    )
    assert status == 0, doc["reason"]
    assert doc["model"] == "demo-fwd" and len(doc["notes"]) == 1
    assert "re-frames the canary's events" in doc["notes"][0]
    for stream in doc["streams"]:
        assert stream["check"] == "text" and stream["text_intact"]
        assert stream["request_id"]  # read from llm_provider-x-hopmeter-request-id
        assert stream["holds"]["source"] == "upstream_sends"
        assert stream["holds"]["first_event_before_last_send"]
        assert not stream["holds"]["whole_body"]
        assert stream["line_endings"]["lf"] > 0  # the gateway wrote LF whatever was asked
    assert key not in printed and "bytes changed" not in printed


def test_a_gateway_that_drops_the_canary_is_judged_on_timing_only(
    litellm_gateway: Gateway, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Via the route as LiteLLM ships it, the upstream plays its default script: one line says
    the scenario did not arrive, the stream passes on timing, and no hold is reported."""
    status, doc, printed = _run(
        capsys,
        litellm_gateway.litellm.url,
        *SHORT,
        *("--model", "demo", "--api-key-env", KEY_VAR, "--line-endings", "lf"),
    )
    assert status == 0, doc["reason"]
    assert doc["notes"] == [
        "the origin is a hopmeter upstream but did not get the X-Hopmeter-Scenario header "
        "(a gateway on the way drops it): judged on timing only, with hopmeter's detectors"
    ]
    (stream,) = doc["streams"]
    assert stream["check"] == "timing" and stream["findings"] == []
    assert "holds" not in stream and "bytes_intact" not in stream
    assert stream["first_word_s"] is not None and stream["events"] > 40
    assert key not in printed


def test_the_model_must_be_named_when_the_gateway_serves_several(
    litellm_gateway: Gateway, key: str
) -> None:
    """Asked without --model, the probe reads the gateway's /v1/models and, with several models
    and no canary alias, says in one line to pass --model."""
    del key
    parser = argparse.ArgumentParser(prog="hopmeter")
    probe.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["probe", litellm_gateway.litellm.url, "--api-key-env", KEY_VAR])
    names = [r.name for r in litellm_gateway.litellm.routes]
    listed = re.escape(f"lists {len(names)} models ({', '.join(names)}); pass --model")
    with pytest.raises(HopmeterError, match=listed):
        probe.run(args)
