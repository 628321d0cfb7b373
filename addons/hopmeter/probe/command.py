"""`hopmeter probe URL`: the canary, a streaming request through the real path judged at the client.

URL is the front of the path (nginx, a CDN, a gateway, the provider itself). The probe sends an
ordinary streaming chat request for a reply rich in emoji and CJK (hopmeter.probe.canary), to the
model given (or the one the endpoint's /v1/models lists), with the key from an environment
variable, reads it with a strict client (hopmeter.probe.http) and judges it with the proxy's own
parsers and detectors, timing the first word (hopmeter.probe.judge). With a `hopmeter upstream` at
the origin, the reply is the canary and every byte and hold is checked, from the upstream's send log
when `--upstream-admin` reaches it; with any other origin, it says so in one line and judges
timing only. Exit status 0 when every stream passed, 1 with the reason on one line when one did
not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from hopmeter.argtypes import positive_seconds
from hopmeter.errors import HopmeterError, UsageError
from hopmeter.probe import output
from hopmeter.probe.canary import (
    CANARY_MODEL,
    DEFAULT_RATE,
    DEFAULT_TOKENS,
    RANDOM_CUTS_KEY,
    REQUEST_ID_HEADERS,
    Spec,
    header_of,
)
from hopmeter.probe.http import Received, request
from hopmeter.probe.judge import Verdict, judge

# What a browser says it accepts: a path that compresses for browsers compresses for the probe.
ACCEPT_ENCODING = "gzip, deflate, br, zstd"
LINE_ENDINGS = ("lf", "crlf", "cr")
ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version every Anthropic endpoint accepts
MODELS_SHOWN = 5  # model names quoted when /v1/models lists too many to pick from


def add_parser(sub: Any) -> None:
    """The `probe` subcommand, added to an argparse subparsers object."""
    p = sub.add_parser("probe", help="canary: a streaming request through the real path")
    p.add_argument(
        "url", metavar="URL", help="the front of the path, e.g. https://chat.example or .../v1"
    )
    p.add_argument(
        "--api",
        choices=("openai", "anthropic"),
        default="openai",
        help="the request to send: OpenAI Chat Completions (/v1/chat/completions, a bearer key) "
        "or Anthropic Messages (/v1/messages, an x-api-key); default: openai",
    )
    p.add_argument(
        "--path", default="", help="request path (default: the API's own, when URL has none)"
    )
    p.add_argument(
        "--model",
        default="",
        metavar="NAME",
        help="the model to ask (default: the one the endpoint's /v1/models lists)",
    )
    p.add_argument(
        "--api-key-env",
        default="",
        metavar="VAR",
        help="read the API key from this environment variable, e.g. OPENAI_API_KEY (never shown)",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=DEFAULT_TOKENS,
        metavar="N",
        help=f"tokens the upstream is asked to stream in each probe (default {DEFAULT_TOKENS})",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        metavar="TOKENS_PER_S",
        help=f"how fast it is asked to stream them (default {DEFAULT_RATE:g} per second)",
    )
    p.add_argument(
        "--line-endings",
        default=",".join(LINE_ENDINGS),
        metavar="LIST",
        help="one stream per line ending, comma-separated (default lf,crlf,cr)",
    )
    p.add_argument("--seed", type=int, default=None, help="the cut offsets' seed (default random)")
    p.add_argument(
        "--upstream-admin",
        default="",
        metavar="URL",
        help="the upstream's own address, for its send log (/_hopmeter/sends/ID)",
    )
    p.add_argument(
        "--max-first-word",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="fail when the first word comes later than this",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="give up on a stream that has not ended this long after it was asked for (default 30)",
    )
    p.add_argument(
        "--header", action="append", default=[], metavar="NAME:VALUE", help="extra header"
    )
    p.add_argument("--insecure", action="store_true", help="do not verify the TLS certificate")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=run)


async def _sends(admin: str, request_id: str, insecure: bool) -> list[float] | None:
    """The upstream's send time of each token-carrying event, or None when it cannot tell."""
    got = await request(admin.rstrip("/") + f"/_hopmeter/sends/{request_id}", insecure=insecure)
    if got.status != 200:
        return None
    doc = orjson.loads(got.body)
    return [float(t) for t, tokens, *_ in doc.get("events", []) if tokens > 0]


async def _post(spec: Spec, url: str, headers: dict[str, str], insecure: bool) -> Received:
    body = orjson.dumps(spec.request())
    return await request(
        url, "POST", body, {**headers, "x-hopmeter-scenario": spec.header()}, insecure=insecure
    )


async def probe_one(
    spec: Spec, url: str, headers: dict[str, str], args: argparse.Namespace
) -> Verdict:
    """One stream through the path, judged."""
    got = await _post(spec, url, headers, args.insecure)
    note = ""
    if got.status == 400 and spec.random_cuts and RANDOM_CUTS_KEY.encode() in got.body:
        # an upstream without random cuts: cut once per event at its fixed place instead
        spec = replace(spec, random_cuts=False)
        got = await _post(spec, url, headers, args.insecure)
        note = f"the upstream does not know {RANDOM_CUTS_KEY}: each event was cut at a fixed place"
    sends = None
    rid = header_of(got.headers, REQUEST_ID_HEADERS)
    if args.upstream_admin and rid and got.status == 200:
        try:
            sends = await _sends(args.upstream_admin, rid, args.insecure)
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            raise UsageError(
                f"--upstream-admin {args.upstream_admin}: cannot ask it what it sent ({exc}); "
                "give the demo upstream's own address, or leave the flag out"
            ) from None
    verdict = judge(
        spec,
        got.status,
        got.headers,
        got.chunks,
        sends=sends,
        t_wall_start=got.wall_start,
        t_headers_s=got.t_headers_s,
    )
    if got.status != 200:  # the endpoint's answer, which may echo a secret: redacted, then cut
        said = output.redact(got.body.decode("utf-8", "replace"), output.secrets_of(headers, url))
        verdict.problems[-1] += f": {said[:160].strip()}"
    first = verdict.figures.get("first_word_s")
    limit = args.max_first_word
    if limit is not None and first is not None and first > limit:
        verdict.problems.append(f"first word after {first:.3f}s, above --max-first-word {limit}s")
    verdict.figures["random_cuts"] = spec.random_cuts
    if note:
        verdict.figures["note"] = note
    return verdict


def _extra_headers(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header {pair!r}: expected NAME:VALUE")
        out[name.strip().lower()] = value.strip()
    return out


def _api_key(var: str) -> str:
    """The key in environment variable `var` ("" when no variable was named)."""
    if not var:
        return ""
    key = os.environ.get(var, "").strip()
    if not key:
        raise UsageError(f"--api-key-env {var}: the environment variable {var} is not set")
    return key


def _auth_headers(api: str, key: str) -> dict[str, str]:
    if api == "anthropic":
        return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}
    return {"authorization": f"Bearer {key}"} if key else {}


def _specs(args: argparse.Namespace) -> list[Spec]:
    endings = [e.strip().lower() for e in args.line_endings.split(",") if e.strip()]
    bad = [e for e in endings if e not in LINE_ENDINGS]
    if bad or not endings:
        raise UsageError(f"--line-endings {args.line_endings!r}: use lf, crlf and/or cr")
    if args.tokens < 2 or args.rate <= 0:
        raise UsageError("--tokens must be 2 or more and --rate above 0")
    if args.timeout <= 0 or (args.max_first_word is not None and args.max_first_word <= 0):
        raise UsageError("--timeout and --max-first-word must be above 0 seconds")
    seed = args.seed if args.seed is not None else secrets.randbelow(1_000_000)
    return [
        Spec(api=args.api, tokens=args.tokens, rate=args.rate, line_ending=e, seed=seed)
        for e in endings
    ]


def _target(url: str, spec: Spec, path: str) -> str:
    expected = "expected http://HOST[:PORT][/PATH] or https://..."
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError as exc:
        raise UsageError(f"URL {url!r}: {exc}; {expected}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"URL {url!r}: {expected}")
    base = parts.path.rstrip("/")
    if path:
        route = base + "/" + path.lstrip("/")
    elif base.endswith("/v1"):  # a base URL, as SDKs take it
        route = base + spec.path.removeprefix("/v1")
    else:
        route = parts.path if base else spec.path
    # the route goes on the path, the query string stays after it
    return urlunsplit((parts.scheme, parts.netloc, route, parts.query, ""))


def models_url(target: str, spec: Spec) -> str:
    """Where the endpoint lists its models: /models beside the chat route (/v1/models)."""
    parts = urlsplit(target)
    route = spec.path.removeprefix("/v1")  # /chat/completions or /messages
    path = parts.path
    base = path.removesuffix(route) if path.endswith(route) else "/v1"
    return urlunsplit((parts.scheme, parts.netloc, base.rstrip("/") + "/models", "", ""))


async def pick_model(url: str, headers: dict[str, str], insecure: bool) -> str:
    """The model to probe: the one /v1/models lists, or the canary's alias among several."""
    fix = "pass --model NAME"
    got = await request(url, headers=headers, insecure=insecure)  # path errors propagate
    if got.status != 200:
        raise UsageError(
            f"{url} answered {got.status} when asked which models it serves: check that the URL "
            f"is the API's (its base, e.g. http://HOST:PORT/v1); if it is, {fix}"
        )
    try:
        doc = orjson.loads(got.body)
    except orjson.JSONDecodeError:
        raise UsageError(f"{url} answered no JSON list of models; {fix}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    ids: list[str] = [
        m["id"] for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)
    ]
    if len(ids) == 1:
        return ids[0]
    if CANARY_MODEL in ids:
        return CANARY_MODEL
    if not ids:
        raise UsageError(f"{url} lists no models; {fix}")
    shown = ", ".join(ids[:MODELS_SHOWN]) + (", ..." if len(ids) > MODELS_SHOWN else "")
    raise UsageError(f"{url} lists {len(ids)} models ({shown}); {fix}")


async def _probe_all(
    specs: list[Spec], url: str, headers: dict[str, str], args: argparse.Namespace
) -> list[Verdict]:
    runs = [asyncio.wait_for(probe_one(s, url, headers, args), args.timeout) for s in specs]
    return list(await asyncio.gather(*runs))


# What can go wrong on the way, as opposed to a flag the user gave wrong (exit status 2).
_PATH_ERRORS = (
    OSError,
    TimeoutError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ValueError,
    HopmeterError,
)


def run(args: argparse.Namespace) -> int:
    """Probe, print, and exit 0 (pass) or 1 (fail, the reason on one line)."""
    specs = _specs(args)  # usage errors first, before any request
    url = _target(args.url, specs[0], args.path)
    key = _api_key(args.api_key_env)
    headers = {
        "accept": "text/event-stream",
        "accept-encoding": ACCEPT_ENCODING,
        **_auth_headers(args.api, key),
        **_extra_headers(args.header),
    }
    secrets = output.secrets_of(headers, url)
    model, asked = args.model, url
    try:
        if not model:
            asked = models_url(url, specs[0])
            listing = pick_model(asked, headers, args.insecure)
            model = asyncio.run(asyncio.wait_for(listing, args.timeout))
            asked = url
        specs = [replace(s, model=model) for s in specs]
        verdicts = asyncio.run(_probe_all(specs, url, headers, args))
    except UsageError as exc:
        raise UsageError(output.redact(str(exc), secrets)) from None
    except _PATH_ERRORS as exc:
        timed_out = isinstance(exc, TimeoutError) and not str(exc)
        tls = "SSL" in type(exc).__name__ or "WRONG_VERSION_NUMBER" in str(exc)
        if asked != url:  # the list of models, asked first: no stream was asked for yet
            detail = f"no answer within {args.timeout}s" if timed_out else str(exc)
            reason = f"no list of models from {output.shown_url(asked)}: {detail}"
        else:
            detail = (
                f"the stream had not ended {args.timeout}s after it was asked for"
                if timed_out
                else str(exc)
            )
            reason = f"no stream from {output.shown_url(url)}: {detail}"
        if url.startswith("https:") and (timed_out or tls):
            reason += " (if that port speaks plain HTTP, probe http://...)"
        done = output.Run(url=url, model=model, seed=specs[0].seed, verdicts=[], reason=reason)
        output.emit(done, as_json=args.json, secrets=secrets)
        return 1
    failed = [v for v in verdicts if not v.ok]
    reason = f"{failed[0].line_ending}: {failed[0].problems[0]}" if failed else ""
    done = output.Run(url=url, model=model, seed=specs[0].seed, verdicts=verdicts, reason=reason)
    output.emit(done, as_json=args.json, secrets=secrets)
    return 1 if failed else 0
