"""How a probe reply is judged: what arrived (status, headers, each timed read) to a verdict.

Sans-I/O: `hopmeter probe` (command.py) does the HTTP. Every reply is read the way the proxy
reads a stream: the core's meter (one decoder per content coding, SSE framing on CR, LF or CRLF,
one streaming UTF-8 decoder) and the proxy's own detectors and figures (hopmeter.core.record),
with the first visible word timed at the client. How strictly it is then judged depends on what
the origin did with the canary (hopmeter.probe.canary):

- `bytes`: a `hopmeter upstream` played it and its reply came through unframed: every byte, event
  and line ending is checked, and holds are measured against the upstream's send log or its known
  token clock (seed "GPU to pixel": "nothing, then everything").
- `text`: it played it behind a gateway that re-frames events (LiteLLM re-serialises each chunk):
  the text, the events' UTF-8 and the holds against the clock are checked, not the bytes.
- `timing`: the origin does not play the canary (a real model server, or a gateway dropped the
  header): said in one line, and the path is judged by the detectors alone (a held or bursty body,
  U+FFFD, a cut stream, a reply not streamed), never against a clock the probe did not control.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import finish
from hopmeter.core.tokens import Counter, estimate_counter
from hopmeter.core.vocab import Api, FindingKind, ProbeCheck
from hopmeter.probe import strict
from hopmeter.probe.canary import RANDOM_CUTS_KEY, REQUEST_ID_HEADERS, Spec, header_of
from hopmeter.probe.strict import MAX_HOLD_S

__all__ = ["MAX_HOLD_S", "RANDOM_CUTS_KEY", "Spec", "Verdict", "judge"]

# The detectors' stall threshold for a probe reply: the hold a probe fails on.
STALL_THRESHOLD_S = MAX_HOLD_S
# Token arrivals closer than this share of the clock's interval belong to one burst: an unheld
# stream has one burst per token, a whole-body hold one burst in all.
BURST_SHARE = 0.25
# What the detectors find that fails a probe whatever the origin: the path held the body or
# released it in windows, damaged characters, cut the stream or did not stream it. The rest
# (headers, compression that still streams, CR line endings, a stall the model itself may have
# taken) is reported, not failed.
PATH_FAILURES = frozenset(
    {
        FindingKind.WHOLE_BODY_HOLD,
        FindingKind.BURST_GAPS,
        FindingKind.REPLACEMENT_CHAR,
        FindingKind.TRUNCATED,
        FindingKind.NOT_STREAMED,
    }
)
NOTES = {
    "not_hopmeter": "the origin does not play the canary (it is not a hopmeter upstream): "
    "judged on timing only, with hopmeter's detectors",
    "dropped": "the origin is a hopmeter upstream but did not get the X-Hopmeter-Scenario header "
    "(a gateway on the way drops it): judged on timing only, with hopmeter's detectors",
    "reframed": "a gateway re-frames the canary's events on the way: its text and timing are "
    "checked, not its bytes",
}


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


class _Estimates:
    """Token counts for the probe: the core's text-shape estimate, reconciled to usage."""

    def for_model(self, model: str | None) -> Counter:
        del model
        return estimate_counter()


def judge(
    spec: Spec,
    status: int,
    headers: Mapping[str, str],
    reads: Sequence[tuple[float, bytes]],
    *,
    sends: Sequence[float] | None = None,
    t_wall_start: float = 0.0,
    t_headers_s: float | None = None,
) -> Verdict:
    """The verdict on one reply: `reads` are (seconds since the request, bytes) as they arrived,
    still content-encoded; `sends` the upstream's wall-clock send time of each token-carrying
    event, when known."""
    v = Verdict(line_ending=spec.line_ending, status=status)
    ctype = headers.get("content-type", "")
    v.figures.update(content_type=ctype, content_encoding=headers.get("content-encoding"))
    v.figures["request_id"] = header_of(headers, REQUEST_ID_HEADERS)
    if status != 200:
        v.problems.append(f"status {status}, expected 200")
        return v
    if not ctype.lower().startswith("text/event-stream"):
        v.problems.append(f"content type {ctype!r}, expected text/event-stream")
    meter, record = _measure(spec, headers, reads, t_wall_start, t_headers_s)
    texts = meter.event_texts()
    text = "".join(texts)
    check, note = _check(spec, headers, text)
    v.figures.update(check=check, check_note=note)
    v.figures["findings"] = [f["kind"] for f in record.get("findings") or []]
    _events(spec, meter, texts, check, v)
    _timing(spec, reads, meter, record, v, check=check)
    if check is ProbeCheck.BYTES:
        strict.check_bytes(spec, headers, reads, v.figures, v.problems)
        strict.check_line_endings(spec, v.figures, v.problems)
    if check is ProbeCheck.TIMING:
        _path_findings(record, v)
    else:
        strict.check_holds(spec, sends, t_wall_start, v.figures, v.problems)
        strict.check_text(spec, text, meter, v.figures, v.problems)
    return v


def _check(spec: Spec, headers: Mapping[str, str], text: str) -> tuple[ProbeCheck, str | None]:
    """How strictly the reply can be judged, and the one line saying why when not by bytes."""
    if spec.played(headers, text):
        if "x-hopmeter-request-id" in headers:
            return ProbeCheck.BYTES, None
        return ProbeCheck.TEXT, NOTES["reframed"]
    if header_of(headers, REQUEST_ID_HEADERS) is not None:
        return ProbeCheck.TIMING, NOTES["dropped"]
    return ProbeCheck.TIMING, NOTES["not_hopmeter"]


def _measure(
    spec: Spec,
    headers: Mapping[str, str],
    reads: Sequence[tuple[float, bytes]],
    t_wall_start: float,
    t_headers_s: float | None,
) -> tuple[FlowMeter, dict[str, Any]]:
    """The reply measured as the proxy measures a flow: the meter, and the record it makes."""
    api = Api.OPENAI_CHAT if spec.api == "openai" else Api.ANTHROPIC_MESSAGES
    meter = FlowMeter(
        api=api,
        content_type=headers.get("content-type", ""),
        content_encoding=headers.get("content-encoding"),
        headers=headers,
    )
    for t, data in reads:
        meter.feed(data, t)
    end = reads[-1][0] if reads else (t_headers_s or 0.0)
    meter.close(end)
    seen = Seen(
        flow_id="probe",
        trace_id=None,
        hop="probe",
        listener="probe",
        request=RequestInfo(
            method="POST",
            scheme="",
            host="",
            path=spec.path,
            t_start=t_wall_start,
            t_end=t_wall_start,
            bytes=0,
            model=spec.model,
            stream_requested=True,
        ),
        response=ResponseInfo(
            status=200, http_version="HTTP/1.1", headers=headers, t_headers_s=t_headers_s
        ),
        meter=meter,
        ended="complete",
        bytes_out=meter.bytes_wire,
        stall_threshold_s=STALL_THRESHOLD_S,
    )
    return meter, finish(seen, _Estimates()).record


def _events(
    spec: Spec, meter: FlowMeter, texts: Sequence[str], check: ProbeCheck, v: Verdict
) -> None:
    times = meter.events.t_s
    v.figures["events"] = meter.events_seen
    v.figures["events_expected"] = len(spec.plan()) if check is ProbeCheck.BYTES else None
    v.figures["first_word_s"] = meter.facts.first_visible_s
    v.figures["token_arrivals_s"] = [round(t, 6) for t, s in zip(times, texts, strict=False) if s]
    framer = meter.framer
    v.figures["line_endings"] = dict(getattr(framer, "line_endings", {}))


def _timing(
    spec: Spec,
    reads: Sequence[tuple[float, bytes]],
    meter: FlowMeter,
    record: Mapping[str, Any],
    v: Verdict,
    *,
    check: ProbeCheck,
) -> None:
    arrivals: list[float] = v.figures["token_arrivals_s"]
    fig = record.get("figures") or {}
    times = meter.events.t_s
    if check is not ProbeCheck.TIMING:  # bursts against the canary's known token clock
        close = BURST_SHARE / spec.rate
        v.figures["bursts"] = sum(
            1 for i, t in enumerate(arrivals) if i == 0 or t - arrivals[i - 1] >= close
        )
        v.figures["clock_span_s"] = round(spec.clock_s()[-1] - spec.clock_s()[0], 6)
    v.figures.update(
        reads=len(reads),
        first_byte_s=reads[0][0] if reads else None,
        first_event_s=times[0] if times else None,
        last_event_s=times[-1] if times else None,
        tokens=fig.get("tokens"),
        itl_p50_s=fig.get("itl_p50_s"),
        itl_p99_s=fig.get("itl_p99_s"),
        max_gap_s=fig.get("max_gap_s"),
    )


def _path_findings(record: Mapping[str, Any], v: Verdict) -> None:
    """Timing only: what the proxy's detectors find that the path did."""
    for f in record.get("findings") or []:
        if f["kind"] not in PATH_FAILURES:
            continue
        ev = f.get("evidence") or {}
        if f["kind"] == FindingKind.WHOLE_BODY_HOLD:
            v.problems.append(
                f"held: the whole body arrived in one burst {ev.get('final_burst_at_s', 0):.2f}s "
                f"after the request, after {ev.get('wait_before_burst_s', 0):.2f}s of silence "
                f"(whole_body_hold); {f['fix']}"
            )
        elif f["kind"] == FindingKind.BURST_GAPS:
            v.problems.append(
                f"held: tokens arrived in {ev.get('bursts')} bursts about "
                f"{ev.get('stall_period_s', 0):.2f}s apart (burst_gaps); {f['fix']}"
            )
        else:
            v.problems.append(f"{f['kind']}: {f['fix']}")
