"""Tests for hopmeter.probe.judge: verdicts from literal bytes and times (no sockets)."""

from __future__ import annotations

import gzip
import random

from hopmeter.probe.judge import MAX_HOLD_S, Spec, judge

PATH_DELAY_S = 0.002  # request out plus reply back, on loopback
SPEC = Spec()


def canary(spec: Spec = SPEC) -> dict[str, str]:
    """The headers of a `hopmeter upstream` that played `spec`'s scenario."""
    return {
        "content-type": "text/event-stream; charset=utf-8",
        "x-hopmeter-request-id": "7",
        "x-hopmeter-scenario": spec.header(),
    }


def _events(spec: Spec) -> list[tuple[float, bytes]]:
    """The upstream's events with the time each reaches an unheld client, as the clock says."""
    ending = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}[spec.line_ending]
    clock = iter(spec.clock_s())
    t = spec.scenario().ttft_s
    out = []
    for planned in spec.plan():
        if planned.last_token is not None:
            t = next(clock)
        out.append((t + PATH_DELAY_S, planned.body.replace(b"\n", ending)))
    return out


def test_unheld_stream_passes_with_no_hold() -> None:
    """Each event arriving on the token clock passes: bytes, events and text intact, no hold."""
    spec = Spec(line_ending="crlf")
    v = judge(spec, 200, canary(spec), _events(spec))
    assert v.ok, v.problems
    assert v.figures["bytes_intact"] and v.figures["text_intact"]
    assert v.figures["events"] == v.figures["events_expected"] == len(spec.plan())
    assert v.figures["line_endings"]["crlf"] > 0 and v.figures["line_endings"]["lf"] == 0
    assert v.figures["holds"]["source"] == "token_clock"
    assert v.figures["holds"]["max_s"] < 1e-9
    assert v.figures["bursts"] == spec.tokens
    assert abs(v.figures["first_word_s"] - (0.05 + PATH_DELAY_S)) < 1e-9


def test_reads_cut_anywhere_give_the_same_verdict() -> None:
    """Reads cut at random byte offsets (inside emoji, between CR and LF) change nothing."""
    spec = Spec(line_ending="crlf")
    events = _events(spec)
    rng = random.Random(3)
    reads = []
    for t, body in events:
        cuts = sorted(rng.sample(range(1, len(body)), 3))
        reads += [(t, body[a:b]) for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    v = judge(spec, 200, canary(spec), reads)
    assert v.ok, v.problems
    assert v.figures["reads"] == 4 * len(events)


def test_whole_body_at_the_end_fails_as_held() -> None:
    """Every event in one read after the last token's time fails, naming the whole-body hold."""
    spec = Spec(line_ending="lf")
    events = _events(spec)
    end = events[-1][0]
    body = b"".join(b for _, b in events)
    v = judge(spec, 200, {**canary(spec), "content-encoding": "gzip"}, [(end, gzip.compress(body))])
    assert v.figures["bytes_intact"] and v.figures["text_intact"]
    assert not v.ok
    assert v.problems[0].startswith("held:") and "whole body" in v.problems[0]
    holds = v.figures["holds"]
    assert holds["whole_body"] and not holds["first_event_before_last_send"]
    assert v.figures["bursts"] == 1
    assert abs(holds["first_word_s"] - (spec.clock_s()[-1] - spec.clock_s()[0])) < 1e-6


def test_bursts_fail_with_the_longest_hold() -> None:
    """Events released in two bursts fail as held, above the hold limit, but not whole-body."""
    spec = Spec(line_ending="lf")
    events = _events(spec)
    half = len(events) // 2
    first = b"".join(b for _, b in events[:half])
    second = b"".join(b for _, b in events[half:])
    v = judge(spec, 200, canary(spec), [(events[half - 1][0], first), (events[-1][0], second)])
    assert not v.ok
    assert "bursts" in v.problems[0] and v.figures["bursts"] == 2
    assert v.figures["holds"]["max_s"] > MAX_HOLD_S and not v.figures["holds"]["whole_body"]


def test_send_log_gives_the_holds_when_known() -> None:
    """With the upstream's send times the holds are arrival minus send, on the wall clock."""
    spec = Spec(line_ending="lf")
    events = _events(spec)
    wall = 1796000000.0
    sends = [wall + c for c in spec.clock_s()]
    v = judge(spec, 200, canary(spec), events, sends=sends, t_wall_start=wall)
    assert v.ok, v.problems
    holds = v.figures["holds"]
    assert holds["source"] == "upstream_sends"
    assert abs(holds["max_s"] - PATH_DELAY_S) < 1e-6
    assert holds["first_event_before_last_send"]


def test_rewritten_line_endings_fail_the_byte_check() -> None:
    """A path turning CRLF into LF changes bytes: the byte and line-ending checks say so."""
    spec = Spec(line_ending="crlf")
    reads = [(t, b.replace(b"\r\n", b"\n")) for t, b in _events(spec)]
    v = judge(spec, 200, canary(spec), reads)
    assert v.problems[0].startswith("bytes changed: byte ")
    assert any(p.startswith("line endings changed") for p in v.problems)
    assert v.figures["text_intact"]


def test_a_cut_stream_fails_with_what_is_missing() -> None:
    """A stream cut before its end reports the short body, the missing events and no terminal."""
    spec = Spec(line_ending="lf")
    reads = _events(spec)[:-5]
    v = judge(spec, 200, canary(spec), reads)
    assert "the body ended after" in v.problems[0]
    assert any("events arrived, the upstream sent" in p for p in v.problems)
    assert any("no terminal event" in p for p in v.problems)
    assert "holds" not in v.figures  # tokens cannot be paired once events are missing


def test_a_split_character_decoded_alone_fails() -> None:
    """A path that replaced a split emoji's bytes with U+FFFD fails with the replacement named."""
    spec = Spec(line_ending="lf")
    reads = [(t, b.replace("🦙".encode(), b"\xf0\x9f")) for t, b in _events(spec)]
    v = judge(spec, 200, canary(spec), reads)
    assert any("U+FFFD" in p for p in v.problems)
    assert not v.figures["text_intact"]


def test_wrong_status_and_content_type_fail_early() -> None:
    """A non-200 reply fails on its status; a 200 that is not an event stream on its type."""
    spec = Spec()
    assert judge(spec, 502, {"content-type": "text/html"}, [(0.1, b"<h1>bad</h1>")]).problems == [
        "status 502, expected 200"
    ]
    v = judge(spec, 200, {"content-type": "application/json"}, [(0.1, b"{}")])
    assert v.problems[0] == "content type 'application/json', expected text/event-stream"


def test_anthropic_reply_is_judged_too() -> None:
    """An Anthropic Messages probe passes on its own event stream."""
    spec = Spec(api="anthropic", line_ending="cr")
    assert spec.path == "/v1/messages"
    v = judge(spec, 200, canary(spec), _events(spec))
    assert v.ok, v.problems


def _plain_stream(words: int = 30, gap_s: float = 0.05) -> list[tuple[float, bytes]]:
    """A reply from an origin that knows nothing of hopmeter: one chat chunk per word."""
    out = []
    for i in range(words):
        payload = b'{"choices":[{"index":0,"delta":{"content":" w%d \xf0\x9f\x90\xb1"}}]}' % i
        out.append((0.3 + i * gap_s, b"data: " + payload + b"\n\n"))
    return [*out, (out[-1][0] + 0.001, b"data: [DONE]\n\n")]


PLAIN = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def test_a_reframed_canary_is_judged_on_text_and_holds_not_bytes() -> None:
    """Behind a gateway that renames the upstream's headers and turns CRLF into LF, the canary
    passes on its text and its holds against the clock; its bytes are not compared."""
    spec = Spec(line_ending="crlf")
    headers = {
        "content-type": "text/event-stream",
        "llm_provider-x-hopmeter-request-id": "9",
        "llm_provider-x-hopmeter-scenario": spec.header(),
    }
    reads = [(t, b.replace(b"\r\n", b"\n")) for t, b in _events(spec)]
    v = judge(spec, 200, headers, reads)
    assert v.ok, v.problems
    assert v.figures["check"] == "text" and "re-frames" in v.figures["check_note"]
    assert v.figures["text_intact"] and "bytes_intact" not in v.figures
    assert v.figures["request_id"] == "9" and v.figures["holds"]["max_s"] < 1e-9


def test_a_reframed_canary_that_lost_a_character_fails() -> None:
    """Re-framed or not, a canary whose emoji became U+FFFD on the way fails on its text."""
    spec = Spec(line_ending="lf")
    headers = {
        "content-type": "text/event-stream",
        "llm_provider-x-hopmeter-scenario": spec.header(),
    }
    reads = [(t, b.replace("🦙".encode(), "\ufffd".encode())) for t, b in _events(spec)]
    v = judge(spec, 200, headers, reads)
    assert "the reply text differs from what the upstream sent" in v.problems
    assert any("U+FFFD" in p for p in v.problems)


def test_an_origin_without_the_canary_is_timed_only_and_passes() -> None:
    """A plain OpenAI-compatible origin, unheld: timing only, said once, first word timed, no
    byte check and no holds against a clock the probe did not set."""
    v = judge(SPEC, 200, PLAIN, _plain_stream())
    assert v.ok, v.problems
    assert v.figures["check"] == "timing"
    assert v.figures["check_note"].startswith("the origin does not play the canary")
    assert abs(v.figures["first_word_s"] - 0.3) < 1e-9
    assert "holds" not in v.figures and "bytes_intact" not in v.figures
    assert v.figures["events_expected"] is None and v.figures["findings"] == []


def test_an_origin_without_the_canary_held_whole_fails_naming_the_hold() -> None:
    """The same reply gzipped and released in one read at the end fails as a whole-body hold."""
    stream = _plain_stream()
    body = gzip.compress(b"".join(b for _, b in stream))
    headers = {**PLAIN, "content-encoding": "gzip"}
    v = judge(SPEC, 200, headers, [(stream[-1][0], body)])
    assert v.figures["check"] == "timing"
    assert v.problems[0].startswith("held: the whole body arrived in one burst 1.75s after")
    assert "(whole_body_hold)" in v.problems[0]
    assert {"whole_body_hold", "compression_on_stream"} <= set(v.figures["findings"])


def test_a_hopmeter_origin_that_lost_the_scenario_invents_no_holds() -> None:
    """A hopmeter upstream behind a gateway that dropped the scenario plays its default script:
    said in one line, judged on timing, no 'bytes changed' and no hold against the asked clock."""
    from hopmeter.upstream import formats
    from hopmeter.upstream.scenario import Scenario

    default = Scenario()
    clock = iter(Spec(tokens=default.tokens, rate=default.rate).clock_s())
    reads, t = [], default.ttft_s
    for planned in formats.openai_chat(default, "demo", True):
        if planned.last_token is not None:
            t = next(clock)
        reads.append((t, planned.body))
    headers = {"content-type": "text/event-stream", "llm_provider-x-hopmeter-request-id": "4"}
    v = judge(SPEC, 200, headers, reads)
    assert v.ok, v.problems
    assert v.figures["check"] == "timing" and "drops it" in v.figures["check_note"]
    assert "holds" not in v.figures
