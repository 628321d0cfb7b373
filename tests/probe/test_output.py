"""Tests for hopmeter.probe.output: the probe's lines, its JSON and the key never shown."""

from __future__ import annotations

import orjson
import pytest

from hopmeter.probe.judge import Verdict
from hopmeter.probe.output import Run, document, emit, secrets_of, shown_url, stream_line, text

TIMED = Verdict(
    line_ending="lf",
    status=200,
    figures={
        "check": "timing",
        "check_note": "the origin does not play the canary (...)",
        "first_byte_s": 0.052,
        "first_word_s": 0.061,
        "events": 44,
        "reads": 42,
        "itl_p50_s": 0.025,
        "itl_p99_s": 0.03,
        "max_gap_s": 0.031,
        "findings": [],
    },
)
CANARY = Verdict(
    line_ending="crlf",
    status=200,
    figures={
        "check": "bytes",
        "check_note": None,
        "first_byte_s": 0.05,
        "first_word_s": 0.055,
        "events": 44,
        "events_expected": 44,
        "reads": 130,
        "bursts": 40,
        "last_event_s": 2.1,
        "bytes_intact": True,
        "holds": {"source": "token_clock", "first_word_s": 0.0, "p50_s": 0.0002, "max_s": 0.001},
    },
)


def test_a_timed_stream_shows_its_figures_and_findings() -> None:
    """Timing only: first byte and word, events, inter-token latency, findings."""
    assert stream_line(TIMED) == (
        "  lf   200 identity first byte 52ms, first word 61ms, 44 events in 42 reads, "
        "itl p50 25ms p99 30ms, max gap 31ms; findings: none"
    )


def test_a_canary_stream_shows_its_byte_and_hold_checks() -> None:
    """The canary: events against what was sent, bytes intact, holds and their source."""
    line = stream_line(CANARY)
    assert "44/44 events in 130 reads, tokens in 40 bursts" in line
    assert line.endswith("bytes intact; hold first word 0ms p50 0ms max 1ms (token_clock)")


def test_the_note_is_said_once_and_the_verdict_names_what_was_judged() -> None:
    """One note line for many timed streams; PASS on timing, or PASS intact for the canary."""
    timed = Run(
        url="http://x/v1/chat/completions", model="m", seed=3, verdicts=[TIMED, TIMED], reason=""
    )
    lines = text(timed).splitlines()
    assert lines[0] == "hopmeter probe http://x/v1/chat/completions model m (seed 3)"
    assert lines[1] == "the origin does not play the canary (...)"
    assert lines[-1] == "PASS 2 streams on timing, first word by 61ms, no hold found"
    canary = Run(url="u", model="m", seed=3, verdicts=[CANARY], reason="")
    assert text(canary).splitlines()[-1] == "PASS 1 stream intact, first word by 55ms, no holds"
    failed = Run(url="u", model="m", seed=3, verdicts=[CANARY], reason="crlf: held: ...")
    assert text(failed).splitlines()[-1] == "FAIL crlf: held: ..."


def test_json_document_and_redaction(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON names schema, model, notes and streams; an echoed key is replaced everywhere."""
    run = Run(url="u", model="m", seed=1, verdicts=[TIMED], reason="lf: status 401: bad key sk-9")
    doc = document(run)
    assert doc["schema"] == "hopmeter.probe/1" and doc["notes"] == [TIMED.figures["check_note"]]
    emit(run, as_json=True, secrets=("sk-9",))
    out, err = capsys.readouterr()
    assert "sk-9" not in out + err and "[key redacted]" in out and "[key redacted]" in err
    assert orjson.loads(out)["ok"] is False
    emit(run, as_json=False, secrets=("sk-9",))
    assert "sk-9" not in capsys.readouterr().out


def test_every_secret_the_probe_was_given_is_kept_out(capsys: pytest.CaptureFixture[str]) -> None:
    """The key, every --header value (whole and after its scheme), the URL's user, password and
    query values, as given and as an upstream may encode them; never the probe's own headers.
    A secret JSON would escape is redacted before encoding; the URL is shown without them."""
    headers = {
        "accept": "text/event-stream",
        "authorization": "Bearer sk-live-1",
        "x-goog-api-key": 'AIza"quoted\\key',
    }
    url = "https://me:p%40ss-word@host:8443/v1/chat/completions?key=q+1234&v=1"
    secrets = secrets_of(headers, url)
    assert set(secrets) == {
        "Bearer sk-live-1",
        "sk-live-1",
        'AIza"quoted\\key',
        "p%40ss-word",
        "p@ss-word",
        "q 1234",
        "q+1234",
        "q%201234",
    }  # the user "me" and the value "1" are under the minimum: ordinary words stay readable
    assert "text/event-stream" not in secrets
    assert shown_url(url) == (
        "https://host:8443/v1/chat/completions?key=[key redacted]&v=[key redacted]"
    )
    echoed = 'bad key AIza"quoted\\key and sk-live-1 from p@ss-word, q+1234'
    run = Run(url=url, model="m", seed=1, verdicts=[TIMED], reason=echoed)
    emit(run, as_json=True, secrets=secrets)
    out, err = capsys.readouterr()
    for secret in ("quoted", "sk-live-1", "ss-word", "1234"):
        assert secret not in out + err, secret
    assert orjson.loads(out)["url"] == shown_url(url)
    emit(run, as_json=False, secrets=secrets)
    shown = capsys.readouterr().out
    assert "quoted" not in shown and "ss-word" not in shown and shown_url(url) in shown
