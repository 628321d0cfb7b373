"""The canary's expectations and verdicts, from literal bytes and times (no sockets)."""

from __future__ import annotations

import gzip
import random

from hopmeter.probe.judge import MAX_HOLD_S, RANDOM_CUTS_KEY, Spec, judge
from hopmeter.upstream.scenario import Scenario, from_request, parse_pairs

SSE = {"content-type": "text/event-stream; charset=utf-8", "x-hopmeter-request-id": "7"}
PATH_DELAY_S = 0.002  # request out plus reply back, on loopback


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


def test_unheld_stream_passes_with_no_hold() -> None:
    """Each event arriving on the token clock passes: bytes, events and text intact, no hold."""
    spec = Spec(line_ending="crlf")
    v = judge(spec, 200, SSE, _events(spec))
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
    v = judge(spec, 200, SSE, reads)
    assert v.ok, v.problems
    assert v.figures["reads"] == 4 * len(events)


def test_whole_body_at_the_end_fails_as_held() -> None:
    """Every event in one read after the last token's time fails, naming the whole-body hold."""
    spec = Spec(line_ending="lf")
    events = _events(spec)
    end = events[-1][0]
    body = b"".join(b for _, b in events)
    v = judge(spec, 200, {**SSE, "content-encoding": "gzip"}, [(end, gzip.compress(body))])
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
    v = judge(spec, 200, SSE, [(events[half - 1][0], first), (events[-1][0], second)])
    assert not v.ok
    assert "bursts" in v.problems[0] and v.figures["bursts"] == 2
    assert v.figures["holds"]["max_s"] > MAX_HOLD_S and not v.figures["holds"]["whole_body"]


def test_send_log_gives_the_holds_when_known() -> None:
    """With the upstream's send times the holds are arrival minus send, on the wall clock."""
    spec = Spec(line_ending="lf")
    events = _events(spec)
    wall = 1796000000.0
    sends = [wall + c for c in spec.clock_s()]
    v = judge(spec, 200, SSE, events, sends=sends, t_wall_start=wall)
    assert v.ok, v.problems
    holds = v.figures["holds"]
    assert holds["source"] == "upstream_sends"
    assert abs(holds["max_s"] - PATH_DELAY_S) < 1e-6
    assert holds["first_event_before_last_send"]


def test_rewritten_line_endings_fail_the_byte_check() -> None:
    """A path turning CRLF into LF changes bytes: the byte and line-ending checks say so."""
    spec = Spec(line_ending="crlf")
    reads = [(t, b.replace(b"\r\n", b"\n")) for t, b in _events(spec)]
    v = judge(spec, 200, SSE, reads)
    assert v.problems[0].startswith("bytes changed: byte ")
    assert any(p.startswith("line endings changed") for p in v.problems)
    assert v.figures["text_intact"]


def test_a_cut_stream_fails_with_what_is_missing() -> None:
    """A stream cut before its end reports the short body, the missing events and no terminal."""
    spec = Spec(line_ending="lf")
    reads = _events(spec)[:-5]
    v = judge(spec, 200, SSE, reads)
    assert "the body ended after" in v.problems[0]
    assert any("events arrived, the upstream sent" in p for p in v.problems)
    assert any("no terminal event" in p for p in v.problems)
    assert "holds" not in v.figures  # tokens cannot be paired once events are missing


def test_a_split_character_decoded_alone_fails() -> None:
    """A path that replaced a split emoji's bytes with U+FFFD fails with the replacement named."""
    spec = Spec(line_ending="lf")
    reads = [(t, b.replace("🦙".encode(), b"\xf0\x9f")) for t, b in _events(spec)]
    v = judge(spec, 200, SSE, reads)
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
    v = judge(spec, 200, SSE, _events(spec))
    assert v.ok, v.problems
