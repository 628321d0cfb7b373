"""What the canary asks of a `hopmeter upstream`, what it expects back, and how it judges a reply.

Sans-I/O: `hopmeter probe` (probe.py) does the HTTP; this module turns what arrived — status,
headers, each body read with its time — into verdicts, with literal bytes and times in tests.

The upstream is deterministic for a scenario (hopmeter.upstream.formats), so the probe knows every
byte it should receive: emoji and CJK tokens, the line ending asked for, and (where the upstream
supports it) each event written in pieces cut at random byte offsets. A path that changes a byte,
drops an event, re-encodes a line ending or splits a character wrongly fails the byte check; a path
that holds the stream fails the hold check (seed "GPU to pixel": "nothing, then everything").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hopmeter.core.apis import make_parser
from hopmeter.core.decoding import make_decoder
from hopmeter.core.figures import weighted_quantile
from hopmeter.core.frames import Frame
from hopmeter.core.hops import WHOLE_BODY_MIN_SPAN_S, WHOLE_BODY_SHARE
from hopmeter.core.sse import SseDecoder
from hopmeter.core.vocab import Api
from hopmeter.errors import DecodingError, StreamLimitError
from hopmeter.upstream import formats
from hopmeter.upstream.scenario import Scenario, apply

# A token held longer than this on its way is a failure: the stall threshold (docs/design.md §3),
# the gap a reader notices. A streaming nginx holds ~0.2 ms (docs/nginx-holds.md).
MAX_HOLD_S = 0.5
# The scenario key asking the upstream to cut each event's write at random byte offsets (not yet
# known to every upstream: the probe falls back to the fixed cut of `split_writes`).
RANDOM_CUTS_KEY = "split_cuts"
RANDOM_CUTS = 3  # cuts per event: enough to land inside a 4-byte emoji and between CR and LF
# Token arrivals closer than this share of the clock's interval belong to one burst: an unheld
# stream has one burst per token, a whole-body hold one burst in all.
BURST_SHARE = 0.25
MODEL = "hopmeter-probe"
DEFAULT_TOKENS = 40
DEFAULT_RATE = 20.0  # tokens per second: 40 tokens span ~2 s, long enough to see a hold
_CREATED = re.compile(rb'"created":\d+')  # the one field of a reply that depends on the clock
_ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """One probe request: the API spoken and the reply the upstream is asked for."""

    api: str = "openai"  # "openai" | "anthropic"
    tokens: int = DEFAULT_TOKENS
    rate: float = DEFAULT_RATE
    line_ending: str = "crlf"
    seed: int = 1
    random_cuts: bool = True

    @property
    def path(self) -> str:
        """The upstream route of this API."""
        return _PATHS[self.api]

    def pairs(self) -> list[tuple[str, str]]:
        """Every scenario key that shapes the reply, so no server-wide default can change it."""
        return [
            *(("tokens", str(self.tokens)), ("rate", repr(self.rate)), ("ttft_s", "0.05")),
            *(("prelude_s", "0"), ("coalesce", "1"), ("reasoning", "0"), ("jitter", "0")),
            *(("seed", str(self.seed)), ("stall_at", "-1"), ("emoji", "1"), ("fffd", "0")),
            *(("split_writes", "1"), ("line_ending", self.line_ending), ("gzip", "0")),
            *(("gzip_flush", "0"), ("buffered", "0"), ("error_at", "-1"), ("cut_at", "-1")),
            *(("stream", "1"), ("usage", "1"), ("headers", "good"), ("replay", "")),
        ]

    def header(self) -> str:
        """The X-Hopmeter-Scenario header value."""
        extra = [(RANDOM_CUTS_KEY, str(RANDOM_CUTS))] if self.random_cuts else []
        return ";".join(f"{k}={v}" for k, v in [*self.pairs(), *extra])

    def scenario(self) -> Scenario:
        """The scenario the upstream plays (the cut key changes write boundaries, not bytes)."""
        return apply(Scenario(), self.pairs())

    def request(self) -> dict[str, object]:
        """The JSON body of the request."""
        doc: dict[str, object] = {
            "model": MODEL,
            "stream": True,
            "messages": [{"role": "user", "content": "hopmeter probe: say something"}],
        }
        if self.api == "openai":
            doc["stream_options"] = {"include_usage": True}
        else:
            doc["max_tokens"] = self.tokens
        return doc

    def plan(self) -> list[formats.Planned]:
        """The events the upstream sends, in order."""
        s = self.scenario()
        if self.api == "anthropic":
            return formats.anthropic_messages(s, MODEL)
        return formats.openai_chat(s, MODEL, True)

    def expected_body(self) -> bytes:
        """The decoded body the client should receive, `created` zeroed."""
        body = b"".join(p.body for p in self.plan()).replace(b"\n", _ENDINGS[self.line_ending])
        return _CREATED.sub(b'"created":0', body)

    def clock_s(self) -> list[float]:
        """When the upstream sends each token-carrying event, seconds after it got the request."""
        s = self.scenario()
        due = [0.0]
        for gap in s.intervals():
            due.append(due[-1] + gap)
        return [
            s.ttft_s + s.prelude_s + due[p.last_token]
            for p in self.plan()
            if p.last_token is not None
        ]

    def expected_text(self) -> str:
        """The visible reply."""
        return "".join(formats.reply_tokens(self.scenario())[1])


@dataclass(slots=True, kw_only=True)
class Verdict:
    """What one probe stream showed: its figures and every problem found (none: it passed)."""

    line_ending: str
    status: int
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        """The verdict for `--json`."""
        return {
            "line_ending": self.line_ending,
            "ok": self.ok,
            "status": self.status,
            "problems": self.problems,
            **self.figures,
        }


def _first_difference(want: bytes, got: bytes) -> str:
    n = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if n is None and len(got) < len(want):
        return f"the body ended after {len(got)} of {len(want)} bytes"
    if n is None:
        return f"{len(got) - len(want)} bytes more than expected after the end"
    lo = max(0, n - 12)
    return f"byte {n} differs: expected {want[lo : n + 12]!r}, got {got[lo : n + 12]!r}"


def _decode(
    headers: Mapping[str, str], reads: Sequence[tuple[float, bytes]]
) -> tuple[list[tuple[float, bytes]], str | None]:
    """(decoded reads with their times, error) after undoing Content-Encoding."""
    decoder = make_decoder(headers.get("content-encoding"))
    out: list[tuple[float, bytes]] = []
    try:
        for t, data in reads:
            out.append((t, decoder.decode(data)))
        out.append((reads[-1][0] if reads else 0.0, decoder.flush()))
    except (DecodingError, StreamLimitError) as exc:
        return out, str(exc)
    return out, None


def judge(
    spec: Spec,
    status: int,
    headers: Mapping[str, str],
    reads: Sequence[tuple[float, bytes]],
    *,
    sends: Sequence[float] | None = None,
    t_wall_start: float = 0.0,
) -> Verdict:
    """The verdict on one reply: `reads` are (seconds since the request, bytes) as they arrived;
    `sends` the upstream's wall-clock send time of each token-carrying event, when known."""
    v = Verdict(line_ending=spec.line_ending, status=status)
    ctype = headers.get("content-type", "")
    v.figures.update(content_type=ctype, content_encoding=headers.get("content-encoding"))
    v.figures["request_id"] = headers.get("x-hopmeter-request-id")
    if status != 200:
        v.problems.append(f"status {status}, expected 200")
        return v
    if not ctype.lower().startswith("text/event-stream"):
        v.problems.append(f"content type {ctype!r}, expected text/event-stream")
    decoded, error = _decode(headers, reads)
    if error:
        v.problems.append(f"body could not be decoded: {error}")
    body = _CREATED.sub(b'"created":0', b"".join(d for _, d in decoded))
    want = spec.expected_body()
    v.figures["bytes_intact"] = body == want
    if body != want:
        v.problems.append(f"bytes changed: {_first_difference(want, body)}")
    frames = _frames(decoded, v)
    _check_events(spec, frames, v)
    _timing(spec, reads, frames, v)
    _holds(spec, sends, t_wall_start, v)
    return v


def _frames(decoded: Sequence[tuple[float, bytes]], v: Verdict) -> list[Frame]:
    sse = SseDecoder()
    frames: list[Frame] = []
    for t, data in decoded:
        frames += sse.feed(data, t)
    frames += sse.close(decoded[-1][0] if decoded else 0.0)
    v.figures["line_endings"] = dict(sse.line_endings)
    return frames


def _check_events(spec: Spec, frames: Sequence[Frame], v: Verdict) -> None:
    parser = make_parser(Api.OPENAI_CHAT if spec.api == "openai" else Api.ANTHROPIC_MESSAGES)
    deltas = [parser.parse(f) for f in frames]
    text = "".join(d.content for d in deltas)
    expected = len(spec.plan())
    v.figures.update(events=len(frames), events_expected=expected)
    v.figures["text_intact"] = text == spec.expected_text()
    endings = v.figures["line_endings"]
    wrong = {k: n for k, n in endings.items() if n and k != spec.line_ending}
    if wrong:
        v.problems.append(f"line endings changed: asked for {spec.line_ending}, got {wrong}")
    if len(frames) != expected:
        v.problems.append(f"{len(frames)} events arrived, the upstream sent {expected}")
    if not v.figures["text_intact"]:
        v.problems.append("the reply text differs from what the upstream sent")
    if sum(f.replacement_chars for f in frames):
        v.problems.append("U+FFFD in the events: a character was split and decoded alone")
    if not any(d.terminal for d in deltas):
        v.problems.append("no terminal event: the stream was cut")
    firsts = [f.t_s for f, d in zip(frames, deltas, strict=True) if d.visible]
    v.figures["first_word_s"] = firsts[0] if firsts else None
    v.figures["token_arrivals_s"] = [
        round(f.t_s, 6) for f, d in zip(frames, deltas, strict=True) if d.content
    ]


def _timing(
    spec: Spec, reads: Sequence[tuple[float, bytes]], frames: Sequence[Frame], v: Verdict
) -> None:
    arrivals: list[float] = v.figures["token_arrivals_s"]
    close = BURST_SHARE / spec.rate
    v.figures.update(
        reads=len(reads),
        bursts=sum(1 for i, t in enumerate(arrivals) if i == 0 or t - arrivals[i - 1] >= close),
        first_byte_s=reads[0][0] if reads else None,
        first_event_s=frames[0].t_s if frames else None,
        last_event_s=frames[-1].t_s if frames else None,
        clock_span_s=round(spec.clock_s()[-1] - spec.clock_s()[0], 6),
    )


def _holds(spec: Spec, sends: Sequence[float] | None, t_wall_start: float, v: Verdict) -> None:
    """How long the path held each token: from the send log, else against the token clock."""
    arrivals: list[float] = v.figures["token_arrivals_s"]
    clock = spec.clock_s()
    if not arrivals or len(arrivals) != len(clock):
        return  # the event check already failed; holds would pair the wrong tokens
    if sends is not None and len(sends) == len(arrivals):
        # the upstream stamps a send after its write returns (and, with split writes, after a
        # 5 ms pause), so an unheld token can show a few ms below zero: that is no hold
        holds = [max(0.0, t_wall_start + a - s) for a, s in zip(arrivals, sends, strict=True)]
        source, before_last = "upstream_sends", t_wall_start + arrivals[0] < sends[-1]
    else:
        lags = [a - c for a, c in zip(arrivals, clock, strict=True)]
        holds = [lag - min(lags) for lag in lags]  # the least-held token bounds the path's delay
        # the upstream sent the last token at about its clock time plus the least lag
        source, before_last = "token_clock", arrivals[0] < clock[-1] + min(lags)
    span = clock[-1] - clock[0]
    whole = span >= WHOLE_BODY_MIN_SPAN_S and holds[0] >= WHOLE_BODY_SHARE * span
    p50 = weighted_quantile(holds, [1] * len(holds), 0.5)
    v.figures["holds"] = {
        "source": source,
        "first_word_s": round(holds[0], 6),
        "p50_s": None if p50 is None else round(p50, 6),
        "max_s": round(max(holds), 6),
        "whole_body": whole,
        "first_event_before_last_send": before_last,
    }
    if whole:
        v.problems.append(
            f"held: the first word arrived {holds[0]:.2f}s late, with the last ({source}); "
            "a hop buffers the whole body: turn off buffering and compression for event streams"
        )
    elif max(holds) > MAX_HOLD_S:
        v.problems.append(
            f"held: a token arrived {max(holds):.2f}s late ({source}), above {MAX_HOLD_S}s; "
            "a buffer or compressor on the path releases the stream in bursts"
        )
