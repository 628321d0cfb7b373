"""What `hopmeter probe` prints: a line per stream and the verdict, or one JSON document.

No secret the probe was given appears: the API key, every `--header` value, the URL's password
and query values (`secrets_of`). Should an endpoint echo one in an error body, it is replaced
before the body is clipped (`redact`), and again in every string of the output before it is
encoded; the URL is shown without its password and with its query values redacted (`shown_url`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit, urlunsplit

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


# Headers the probe sets itself, none of them secret.
OWN_HEADERS = frozenset({"accept", "accept-encoding", "anthropic-version"})
MIN_SECRET_CHARS = 4  # a shorter value would hide ordinary words, and hides no secret


def secrets_of(headers: Mapping[str, str], url: str) -> tuple[str, ...]:
    """What the probe was given that must never be shown: each header value but its own
    (whole and after an auth scheme), the URL's password and user, its query values."""
    found: set[str] = set()
    for name, value in headers.items():
        if name.lower() not in OWN_HEADERS:
            found.update((value.strip(), value.strip().partition(" ")[2].strip()))
    parts = urlsplit(url)
    for given in (parts.password or "", parts.username or ""):
        found.update((given, unquote(given)))  # as written in the URL, and as it means
    for _, value in parse_qsl(parts.query, keep_blank_values=True):
        found.update((value, quote_plus(value), quote(value, safe="")))
    return tuple(sorted((v for v in found if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True))


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` without any of `secrets` (longest first, so none leaves a part of another)."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def shown_url(url: str) -> str:
    """`url` as output shows it: no user or password, each query value redacted."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    query = "&".join(
        f"{name}={REDACTED if value else ''}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _scrubbed(value: Any, secrets: Sequence[str]) -> Any:
    """Every string in a JSON value redacted (before encoding: an escaped secret would slip)."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v, secrets) for k, v in value.items()}
    return value


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
    lines = [f"hopmeter probe {shown_url(run.url)}{model} (seed {run.seed})"]
    lines += notes(run.verdicts)
    lines += [stream_line(v) for v in run.verdicts]
    return "\n".join([*lines, verdict_line(run)])


def document(run: Run) -> dict[str, Any]:
    """The `--json` document."""
    return {
        "schema": SCHEMA,
        "url": shown_url(run.url),
        "model": run.model,  # "" when the endpoint's list of models did not answer
        "seed": run.seed,
        "ok": not run.reason,
        "reason": run.reason or None,
        "notes": notes(run.verdicts),
        "streams": [v.as_json() for v in run.verdicts],
    }


def emit(run: Run, *, as_json: bool, secrets: Sequence[str]) -> None:
    """Write the run to stdout (and, with --json, a failure's reason to stderr), without any
    of `secrets`."""
    if not as_json:
        print(redact(text(run), secrets))
        return
    sys.stdout.write(orjson.dumps(_scrubbed(document(run), secrets)).decode() + "\n")
    if run.reason:
        print(redact(f"hopmeter probe: FAIL {run.reason}", secrets), file=sys.stderr)
