"""What `hopmeter probe` prints: a line per stream and the verdict, or one JSON document.

The API key never appears: should an endpoint echo it in an error body, it is replaced before
anything is written.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from hopmeter.core.vocab import ProbeCheck
from hopmeter.probe.judge import Verdict

SCHEMA = "hopmeter.probe/1"
REDACTED = "[key redacted]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One probe run: where it went, what it asked, what it found."""

    url: str
    model: str
    seed: int
    verdicts: Sequence[Verdict]
    reason: str  # "" when every stream passed


def redact(text: str, key: str) -> str:
    """`text` without the API key."""
    return text.replace(key, REDACTED) if key else text


def ms(x: object) -> str:
    """Seconds as whole milliseconds, "-" when unknown."""
    return "-" if not isinstance(x, int | float) else f"{x * 1000:.0f}ms"


def notes(verdicts: Sequence[Verdict]) -> list[str]:
    """Each distinct line saying how the streams were judged, when not by their bytes."""
    return list(dict.fromkeys(n for v in verdicts if (n := v.figures.get("check_note"))))


def stream_line(v: Verdict) -> str:
    """One stream: status, encoding, first byte and word, and what was checked of it."""
    f = v.figures
    head = (
        f"  {v.line_ending:<4} {v.status} {f.get('content_encoding') or 'identity'} "
        f"first byte {ms(f.get('first_byte_s'))}, first word {ms(f.get('first_word_s'))}, "
    )
    return (
        head
        + (_timed(f) if f.get("check") in (None, ProbeCheck.TIMING) else _canary(f))
        + (f"\n       {f['note']}" if f.get("note") else "")
    )


def _timed(f: dict[str, Any]) -> str:
    findings = ",".join(f.get("findings") or []) or "none"
    return (
        f"{f.get('events', 0)} events in {f.get('reads', 0)} reads, itl p50 "
        f"{ms(f.get('itl_p50_s'))} p99 {ms(f.get('itl_p99_s'))}, max gap "
        f"{ms(f.get('max_gap_s'))}; findings: {findings}"
    )


def _canary(f: dict[str, Any]) -> str:
    holds = f.get("holds") or {}
    if "bytes_intact" in f:
        intact = "bytes intact" if f["bytes_intact"] else "bytes CHANGED"
    else:
        intact = "text intact" if f.get("text_intact") else "text CHANGED"
    return (
        f"{f.get('events', 0)}/{f.get('events_expected') or '-'} events in "
        f"{f.get('reads', 0)} reads, tokens in {f.get('bursts', 0)} bursts, last at "
        f"{ms(f.get('last_event_s'))}; {intact}; hold first word "
        f"{ms(holds.get('first_word_s'))} p50 {ms(holds.get('p50_s'))} max "
        f"{ms(holds.get('max_s'))} ({holds.get('source', 'not judged')})"
    )


def verdict_line(run: Run) -> str:
    """FAIL with the reason, or PASS with the slowest first word."""
    if run.reason:
        return f"FAIL {run.reason}"
    words = [v.figures.get("first_word_s") for v in run.verdicts]
    worst = max((w for w in words if w is not None), default=None)
    n = len(run.verdicts)
    streams = f"{n} stream{'s' * (n != 1)}"
    if all(v.figures.get("check") == ProbeCheck.TIMING for v in run.verdicts):
        return f"PASS {streams} on timing, first word by {ms(worst)}, no hold found"
    return f"PASS {streams} intact, first word by {ms(worst)}, no holds"


def text(run: Run) -> str:
    """The whole text output."""
    # no model when the endpoint's list of them did not answer
    model = f" model {run.model}" if run.model else ""
    lines = [f"hopmeter probe {run.url}{model} (seed {run.seed})"]
    lines += notes(run.verdicts)
    lines += [stream_line(v) for v in run.verdicts]
    return "\n".join([*lines, verdict_line(run)])


def document(run: Run) -> dict[str, Any]:
    """The `--json` document."""
    return {
        "schema": SCHEMA,
        "url": run.url,
        "model": run.model,  # "" when the endpoint's list of models did not answer
        "seed": run.seed,
        "ok": not run.reason,
        "reason": run.reason or None,
        "notes": notes(run.verdicts),
        "streams": [v.as_json() for v in run.verdicts],
    }


def emit(run: Run, *, as_json: bool, key: str) -> None:
    """Write the run to stdout (and, with --json, a failure's reason to stderr)."""
    if not as_json:
        print(redact(text(run), key))
        return
    sys.stdout.write(redact(orjson.dumps(document(run)).decode(), key) + "\n")
    if run.reason:
        print(redact(f"hopmeter probe: FAIL {run.reason}", key), file=sys.stderr)
