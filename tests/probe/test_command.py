"""`hopmeter probe`: through a real nginx to a real `hopmeter upstream`, pass and fail for CI."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopmeter.errors import HopmeterError
from hopmeter.probe import command as probe
from hopmeter.probe.canary import CANARY_MODEL, RANDOM_CUTS_KEY
from tests.harness.nginx import NginxServer, available
from tests.harness.plain_upstream import PREFILL_S, PlainUpstream
from tests.harness.procs import HOPMETER, Proc, free_port, hopmeter

# 20 tokens at 20/s: a 1 s stream, above the 0.5 s a whole-body hold needs to be told apart.
SHORT = ["--tokens", "20", "--rate", "20"]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hopmeter")
    probe.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["probe", *argv])


def _probe(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    """Run the probe with --json; its exit status, JSON document and stderr."""
    status = probe.run(_args(*argv, "--json"))
    out, err = capsys.readouterr()
    return status, orjson.loads(out), err


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A `hopmeter upstream` process at the origin; its port."""
    tmp = tmp_path_factory.mktemp("upstream")
    port = free_port()
    with hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{port}", name="up", ports=(port,)):
        yield port


needs_nginx = pytest.mark.skipif(not available(), reason="nginx is not installed")


@pytest.mark.integration
@needs_nginx
def test_passes_through_a_streaming_nginx(
    upstream: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through nginx with buffering off, all three line endings arrive intact and unheld."""
    with NginxServer(upstream, "streaming", prefix=tmp_path) as nginx:
        status, doc, err = _probe(capsys, nginx.url, *SHORT)
    assert status == 0, doc["reason"]
    assert doc["ok"] and doc["reason"] is None and not err
    assert [s["line_ending"] for s in doc["streams"]] == ["lf", "crlf", "cr"]
    for s in doc["streams"]:
        assert s["bytes_intact"] and s["text_intact"] and s["problems"] == []
        assert s["events"] == s["events_expected"]
        assert s["holds"]["source"] == "token_clock"
        # unheld: the first word came before the upstream sent the last (the probe's own verdict
        # on how long each token was held is in `problems`)
        assert s["holds"]["first_event_before_last_send"] and not s["holds"]["whole_body"]
        assert s["reads"] >= s["events"]  # each event written in pieces, and delivered so
        assert s["bursts"] >= 15  # of 20 tokens on a 50 ms clock; a loaded box may merge a few


@pytest.mark.integration
@needs_nginx
def test_fails_through_a_holding_nginx_with_the_reason(
    upstream: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through nginx with gzip and buffering, exit 1 and one line saying the whole body was held."""
    with NginxServer(upstream, "gzip_hold", prefix=tmp_path) as nginx:
        status, doc, err = _probe(capsys, nginx.url, *SHORT)
    assert status == 1
    reason = doc["reason"]
    assert "\n" not in reason and reason.startswith("lf: held:") and "whole body" in reason
    assert err == f"hopmeter probe: FAIL {reason}\n"
    for s in doc["streams"]:
        assert s["content_encoding"] == "gzip"
        assert s["bytes_intact"]  # held, not damaged
        assert s["holds"]["whole_body"] and not s["holds"]["first_event_before_last_send"]
        assert s["first_word_s"] > 0.9 and s["bursts"] == 1


@pytest.mark.integration
def test_https_to_a_plain_http_port_says_to_try_http(
    upstream: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """https:// to a port that speaks plain HTTP (it waits for a request, never answering the
    TLS handshake): the failure says to probe http:// instead."""
    status, doc, _ = _probe(capsys, f"https://127.0.0.1:{upstream}/v1", "--timeout", "1")
    assert status == 1
    assert doc["reason"].endswith("(if that port speaks plain HTTP, probe http://...)")


@pytest.mark.integration
def test_an_admin_url_that_does_not_answer_names_the_flag(upstream: int) -> None:
    """--upstream-admin where nothing listens: a usage error naming that flag and address, not
    "no stream from" the probed URL, whose stream was fine."""
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(HopmeterError, match=f"--upstream-admin {dead}: cannot ask it what it"):
        probe.run(_args(f"http://127.0.0.1:{upstream}", *SHORT, "--upstream-admin", dead))


@pytest.mark.integration
@needs_nginx
def test_send_log_through_admin_url(
    upstream: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --upstream-admin the holds come from the upstream's send log."""
    admin = f"http://127.0.0.1:{upstream}"
    with NginxServer(upstream, "gzip_hold", prefix=tmp_path) as nginx:
        status, doc, _ = _probe(capsys, nginx.url, *SHORT, "--upstream-admin", admin)
    assert status == 1
    holds = doc["streams"][0]["holds"]
    assert holds["source"] == "upstream_sends"
    assert holds["first_word_s"] > 0.9 and not holds["first_event_before_last_send"]


@pytest.mark.integration
def test_text_output_ends_with_the_verdict(
    upstream: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --json: a header, one line per stream, then PASS; the random cuts are reported."""
    status = probe.run(_args(f"http://127.0.0.1:{upstream}", *SHORT, "--seed", "7"))
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert (
        out[0]
        == f"hopmeter probe http://127.0.0.1:{upstream}/v1/chat/completions model demo-1 (seed 7)"
    )
    assert out[-1].startswith("PASS 3 streams intact, first word by ")
    stream_lines = [line for line in out if line.startswith(("  lf ", "  crlf ", "  cr "))]
    assert len(stream_lines) == 3 and all("bytes intact" in line for line in stream_lines)
    fallback = any(RANDOM_CUTS_KEY in line for line in out)
    status = probe.run(_args(f"http://127.0.0.1:{upstream}", *SHORT, "--json"))
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["streams"][0]["random_cuts"] is not fallback


@pytest.mark.integration
def test_anthropic_api_and_a_single_line_ending(
    upstream: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """--api anthropic probes /v1/messages; --line-endings picks the streams."""
    url = f"http://127.0.0.1:{upstream}"
    status, doc, _ = _probe(capsys, url, *SHORT, "--api", "anthropic", "--line-endings", "cr")
    assert status == 0, doc["reason"]
    assert doc["url"].endswith("/v1/messages")
    assert [s["line_ending"] for s in doc["streams"]] == ["cr"]


@pytest.mark.integration
def test_a_path_that_is_not_the_upstream_fails_with_its_status(
    upstream: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 404 on the way is a failure naming the status and the body's first words."""
    url = f"http://127.0.0.1:{upstream}"
    status, doc, _ = _probe(capsys, url, *SHORT, "--path", "/nowhere", "--line-endings", "lf")
    assert status == 1
    assert doc["reason"].startswith("lf: status 404, expected 200: not found")


@pytest.mark.integration
def test_https_front(upstream: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An HTTPS front (hopmeter's own TLS) passes with --insecure and fails on its unknown CA."""
    port = free_port()
    with hopmeter(
        tmp_path,
        "run",
        f"http://127.0.0.1:{upstream}",
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics",
        "off",
        ports=(port,),
    ):
        url = f"https://127.0.0.1:{port}"
        ok, doc, _ = _probe(capsys, url, *SHORT, "--line-endings", "crlf", "--insecure")
        bad, refused, _ = _probe(capsys, url, *SHORT, "--line-endings", "crlf")
    assert ok == 0, doc["reason"]
    assert bad == 1 and "CERTIFICATE_VERIFY_FAILED" in refused["reason"]


@pytest.mark.loopback
def test_nothing_listening_fails_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """No server at URL: exit 1, the reason on one line, naming what was asked: the list of
    models when no --model was given (no stream was asked for yet, and no model is claimed),
    the stream when it was."""
    port = free_port()
    status, doc, err = _probe(capsys, f"http://127.0.0.1:{port}")
    assert status == 1 and doc["model"] == ""
    assert doc["reason"].startswith(f"no list of models from http://127.0.0.1:{port}/v1/models: ")
    assert err.count("\n") == 1 and err.startswith("hopmeter probe: FAIL no list of models")
    status, doc, err = _probe(capsys, f"http://127.0.0.1:{port}", "--model", "m")
    assert status == 1 and doc["model"] == "m"
    assert doc["reason"].startswith(f"no stream from http://127.0.0.1:{port}/v1/chat/completions")
    assert err.count("\n") == 1 and err.startswith("hopmeter probe: FAIL no stream")
    assert probe.run(_args(f"http://127.0.0.1:{port}")) == 1  # the text: no empty model named
    header, _ = capsys.readouterr().out.splitlines()
    assert header.startswith(f"hopmeter probe http://127.0.0.1:{port}/v1/chat/completions (seed ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ftp://example.com"], "expected http://HOST"),
        (["http://127.0.0.1:1", "--line-endings", "lf,crlf2"], "--line-endings"),
        (["http://127.0.0.1:1", "--header", "no-colon"], "--header 'no-colon'"),
        (["http://127.0.0.1:1", "--tokens", "1"], "--tokens must be 2 or more"),
        (["http://[::1/v1"], "URL 'http://\\[::1/v1': Invalid IPv6 URL; expected http://HOST"),
        (["http://127.0.0.1:99999/v1"], "URL 'http://127.0.0.1:99999/v1': Port out of range"),
    ],
)
def test_usage_errors_raise_before_any_request(argv: list[str], message: str) -> None:
    """A flag given wrong is a HopmeterError (the CLI's exit status 2), not a probe failure."""
    with pytest.raises(HopmeterError, match=message):
        probe.run(_args(*argv))


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--timeout", "-1"), ("--timeout", "nan"), ("--max-first-word", "0"),
     ("--max-first-word", "nan"), ("--max-first-word", "inf")],
)  # fmt: skip
def test_durations_that_are_none_are_refused_by_the_parser(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--timeout and --max-first-word take a finite number of seconds above 0 (`nan` could
    never fail a probe): argparse's one line naming the flag, exit status 2."""
    with pytest.raises(SystemExit) as info:
        _args("http://127.0.0.1:1", flag, value)
    assert info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_the_route_goes_on_the_path_and_a_query_string_stays_after_it() -> None:
    """A base URL with a query string gets the chat route on its path, not after the query."""
    spec = probe._specs(_args("http://h:1/v1?x=1"))[0]
    assert probe._target("http://h:1/v1?x=1", spec, "") == "http://h:1/v1/chat/completions?x=1"
    assert probe._target("http://h:1/v1/", spec, "") == "http://h:1/v1/chat/completions"
    assert probe._target("http://h:1", spec, "") == "http://h:1/v1/chat/completions"
    assert probe._target("http://h:1/x/y", spec, "") == "http://h:1/x/y"
    assert probe._target("http://h:1/a?k=v", spec, "b/c") == "http://h:1/a/b/c?k=v"


@pytest.mark.integration
def test_shipped_command(upstream: int, tmp_path: Path) -> None:
    """`hopmeter probe URL` exits 0 against the upstream (once cli.py wires the subcommand)."""
    helped = subprocess.run(
        [*HOPMETER, "probe", "--help"], check=False, capture_output=True, timeout=60
    )
    if helped.returncode != 0:
        pytest.skip("`hopmeter probe` is not wired into cli.py yet")
    proc = Proc([*HOPMETER, "probe", f"http://127.0.0.1:{upstream}", *SHORT], tmp_path / "p.log")
    assert proc.popen.wait(60) == 0, proc.output()
    proc.stop()
    assert proc.output().splitlines()[-1].startswith("PASS ")


@pytest.mark.integration
@needs_nginx
def test_a_plain_origin_behind_a_streaming_nginx_passes_on_timing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An origin that knows nothing of hopmeter, streamed by nginx: it says so once, judges
    timing with the proxy's detectors, and passes with the first word's time."""
    with PlainUpstream() as up, NginxServer(up.port, "streaming", prefix=tmp_path) as nginx:
        status = probe.run(_args(nginx.url))
        out = capsys.readouterr().out.splitlines()
        json_status, doc, _ = _probe(capsys, nginx.url, "--line-endings", "lf")
    assert status == 0 and json_status == 0, out
    head = f"hopmeter probe {nginx.url}/v1/chat/completions model plain-chat-1 (seed "
    assert out[0].startswith(head)
    assert out[1].startswith("the origin does not play the canary")
    assert sum("does not play the canary" in line for line in out) == 1
    assert out[-1].startswith("PASS 3 streams on timing, first word by ")
    assert out[-1].endswith("ms, no hold found")
    (stream,) = doc["streams"]
    assert doc["model"] == "plain-chat-1" and doc["notes"] == [out[1]]
    assert stream["check"] == "timing" and stream["findings"] == []
    # after the origin's prefill, and before it sent its last word: nothing held the body
    assert PREFILL_S < stream["first_word_s"] < PREFILL_S + (up.words - 1) / up.rate
    assert "holds" not in stream and "bytes_intact" not in stream
    assert stream["events"] == 40 + 4  # prelude, words, finish, usage, [DONE]


@pytest.mark.integration
@needs_nginx
def test_a_plain_origin_behind_a_gzip_buffering_nginx_fails_naming_the_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same origin behind an nginx that gzips and buffers: FAIL, the whole-body hold named."""
    with PlainUpstream() as up, NginxServer(up.port, "gzip_hold", prefix=tmp_path) as nginx:
        status, doc, err = _probe(capsys, nginx.url, "--line-endings", "lf")
    assert status == 1
    reason = doc["reason"]
    assert reason.startswith("lf: held: the whole body arrived in one burst ")
    assert "(whole_body_hold)" in reason and "\n" not in reason
    assert err == f"hopmeter probe: FAIL {reason}\n"
    (stream,) = doc["streams"]
    assert stream["check"] == "timing" and stream["content_encoding"] == "gzip"
    assert {"whole_body_hold", "compression_on_stream"} <= set(stream["findings"])
    assert "bytes changed" not in reason and "holds" not in stream


@pytest.mark.integration
def test_the_key_comes_from_the_environment_and_never_shows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--api-key-env sends the variable's key as a bearer token; a wrong key echoed back by the
    endpoint is redacted from everything the probe prints."""
    url = "/v1/chat/completions"
    with PlainUpstream(words=10, key="sk-right-key") as up:
        base = f"http://127.0.0.1:{up.port}"
        monkeypatch.setenv("PROBE_KEY", "sk-right-key")
        ok, doc, _ = _probe(capsys, base, "--api-key-env", "PROBE_KEY", "--line-endings", "lf")
        sent = {ex.path: ex.headers.get("authorization") for ex in up.requests}
        monkeypatch.setenv("PROBE_KEY", "sk-wrong-key-123")
        bad = probe.run(_args(base + url, "--model", "m", "--api-key-env", "PROBE_KEY", "--json"))
        out, err = capsys.readouterr()
    assert ok == 0, doc["reason"]
    assert sent == {"/v1/models": "Bearer sk-right-key", url: "Bearer sk-right-key"}
    assert "sk-right-key" not in orjson.dumps(doc).decode()
    assert bad == 1 and "sk-wrong-key-123" not in out + err
    assert "status 401, expected 200" in out and "[key redacted]" in out


def test_a_missing_key_variable_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming an environment variable that is not set is one line naming it (exit status 2)."""
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(HopmeterError, match="the environment variable NO_SUCH_KEY is not set"):
        probe.run(_args("http://127.0.0.1:1", "--api-key-env", "NO_SUCH_KEY"))


@pytest.mark.integration
def test_the_model_is_picked_from_the_endpoint_or_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One listed model is used; with several and no canary alias among them, one line says to
    pass --model; the canary alias is picked when listed."""
    models = ("gpt-a", "gpt-b", "embed-c")
    with PlainUpstream(words=10, models=models) as several:
        base = f"http://127.0.0.1:{several.port}/v1"
        with pytest.raises(
            HopmeterError, match=r"lists 3 models \(gpt-a, gpt-b, embed-c\); pass --model NAME"
        ):
            probe.run(_args(base))
        status, doc, _ = _probe(capsys, base, "--model", "gpt-b", "--line-endings", "lf")
    assert status == 0 and doc["model"] == "gpt-b"
    assert doc["url"] == f"http://127.0.0.1:{several.port}/v1/chat/completions"
    with PlainUpstream(words=10, models=("x", CANARY_MODEL)) as aliased:
        status, doc, _ = _probe(capsys, f"http://127.0.0.1:{aliased.port}", "--line-endings", "lf")
    assert status == 0 and doc["model"] == CANARY_MODEL


@pytest.mark.integration
def test_a_hopmeter_origin_keeps_the_byte_checks(
    upstream: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Straight to a `hopmeter upstream`: the canary is played and every byte is checked."""
    status, doc, _ = _probe(capsys, f"http://127.0.0.1:{upstream}", *SHORT)
    assert status == 0, doc["reason"]
    assert doc["notes"] == [] and doc["model"] == "demo-1"
    assert all(s["check"] == "bytes" and s["bytes_intact"] for s in doc["streams"])
