"""The canary's strict checks: what a `hopmeter upstream` sent is known, so every difference is
the path's doing. Its bytes, line endings and events when it came through unframed; its text and
characters whatever framed it; how long each token was held, against the upstream's send log or
its known token clock (seed "GPU to pixel": "nothing, then everything").

Sans-I/O, called by hopmeter.probe.judge with the figures it measured; each check adds its
figures and, when it fails, a one-line problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hopmeter.core.decoding import make_decoder
from hopmeter.core.figures import weighted_quantile
from hopmeter.core.hops import WHOLE_BODY_MIN_SPAN_S, WHOLE_BODY_SHARE
from hopmeter.core.meter import FlowMeter
from hopmeter.errors import DecodingError, StreamLimitError
from hopmeter.probe.canary import Spec, without_created

# A token held longer than this on its way is a failure: the stall threshold (docs/design.md §3),
# the gap a reader notices. A streaming nginx holds ~0.2 ms (docs/nginx-holds.md).
MAX_HOLD_S = 0.5

Figures = dict[str, Any]


def decode(
    headers: Mapping[str, str], reads: Sequence[tuple[float, bytes]]
) -> tuple[bytes, str | None]:
    """(the body with its Content-Encoding undone, an error if it could not be)."""
    decoder = make_decoder(headers.get("content-encoding"))
    out = bytearray()
    try:
        for _, data in reads:
            out += decoder.decode(data)
        out += decoder.flush()
    except (DecodingError, StreamLimitError) as exc:
        return bytes(out), str(exc)
    return bytes(out), None


def _first_difference(want: bytes, got: bytes) -> str:
    n = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
    if n is None and len(got) < len(want):
        return f"the body ended after {len(got)} of {len(want)} bytes"
    if n is None:
        return f"{len(got) - len(want)} bytes more than expected after the end"
    lo = max(0, n - 12)
    return f"byte {n} differs: expected {want[lo : n + 12]!r}, got {got[lo : n + 12]!r}"


def check_bytes(
    spec: Spec,
    headers: Mapping[str, str],
    reads: Sequence[tuple[float, bytes]],
    figures: Figures,
    problems: list[str],
) -> None:
    """The decoded body is the canary's, byte for byte, in as many events as were sent."""
    body, error = decode(headers, reads)
    if error:
        problems.append(f"body could not be decoded: {error}")
    body, want = without_created(body), spec.expected_body()
    figures["bytes_intact"] = body == want
    if body != want:
        problems.append(f"bytes changed: {_first_difference(want, body)}")
    got, sent = figures["events"], figures["events_expected"]
    if got != sent:
        problems.append(f"{got} events arrived, the upstream sent {sent}")


def check_line_endings(spec: Spec, figures: Figures, problems: list[str]) -> None:
    """Only the line ending asked for arrived."""
    endings = figures["line_endings"]
    wrong = {k: n for k, n in endings.items() if n and k != spec.line_ending}
    if wrong:
        problems.append(f"line endings changed: asked for {spec.line_ending}, got {wrong}")


def check_text(
    spec: Spec, text: str, meter: FlowMeter, figures: Figures, problems: list[str]
) -> None:
    """The canary's text, its characters and its end, whatever framed it on the way."""
    figures["text_intact"] = text == spec.expected_text()
    if not figures["text_intact"]:
        problems.append("the reply text differs from what the upstream sent")
    if meter.facts.replacement_chars or meter.utf8.replacement_chars:
        problems.append("U+FFFD in the events: a character was split and decoded alone")
    if not meter.facts.terminal_seen:
        problems.append("no terminal event: the stream was cut")


def check_holds(
    spec: Spec,
    sends: Sequence[float] | None,
    t_wall_start: float,
    figures: Figures,
    problems: list[str],
) -> None:
    """How long the path held each token: from the send log, else against the token clock."""
    arrivals: list[float] = figures["token_arrivals_s"]
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
    figures["holds"] = {
        "source": source,
        "first_word_s": round(holds[0], 6),
        "p50_s": None if p50 is None else round(p50, 6),
        "max_s": round(max(holds), 6),
        "whole_body": whole,
        "first_event_before_last_send": before_last,
    }
    if whole:
        problems.append(
            f"held: the first word arrived {holds[0]:.2f}s late, with the last ({source}); "
            "a hop buffers the whole body: turn off buffering and compression for event streams"
        )
    elif max(holds) > MAX_HOLD_S:
        problems.append(
            f"held: a token arrived {max(holds):.2f}s late ({source}), above {MAX_HOLD_S}s; "
            "a buffer or compressor on the path releases the stream in bursts"
        )
