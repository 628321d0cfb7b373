"""Bounded label values: every value an exporter puts on a metric or span name comes from here.

Models go through an allow-list of family prefixes, paths through a table of known LLM routes,
hop, segment and error-site names through a cap on how many distinct ones are kept, and values
read from records through hopmeter's own vocabulary (docs/design.md §8). Anything else is
"other", so no traffic can grow the number of series. No exporter library is imported here:
Prometheus and OpenTelemetry both read these tables.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from hopmeter.core.vocab import (
    Api,
    BeaconOutcome,
    BodyClip,
    Ended,
    FindingKind,
    PairedBy,
    PairingMatch,
    TokenSource,
)

OTHER = "other"
NO_MODEL = "none"
# Label values that come from records are taken only from hopmeter's own vocabulary.
APIS = frozenset(Api)
ENDINGS = frozenset(Ended)
TOKEN_SOURCES = frozenset(TokenSource)
FINDING_KINDS = frozenset(FindingKind)
PAIRED_BY = frozenset(PairedBy)
PAIRING_MATCHES = frozenset(PairingMatch)
BEACON_OUTCOMES = frozenset(BeaconOutcome)
BODY_CLIP_REASONS = frozenset(BodyClip)
# Hop, segment and error-site names come from configuration, not traffic; the cap guards against
# a misconfiguration (a name per request) turning into a series per request.
MAX_NAMES_PER_LABEL = 32
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:>~-]{1,64}$")  # "~": an unordered pair of hops
# Model ids recur on every request, so their labels are cached; random ids must not grow memory.
MAX_CACHED_MODELS = 4096

# Tables read better as rows than as one item per line.
# fmt: off
# Model families (normalised prefix -> label value). Longest prefix wins; a prefix matches when
# the character after it is not a letter ("gpt-4" matches "gpt-4-turbo" but not "gpt-4o").
DEFAULT_MODEL_FAMILIES: Mapping[str, str] = {p: p for p in (
    "gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o",
    "gpt-4o-mini", "gpt-4", "gpt-3.5", "gpt-oss", "o1", "o1-mini", "o3", "o3-mini", "o4-mini",
    "claude-opus-4", "claude-sonnet-4", "claude-haiku-4", "claude-3-7-sonnet",
    "claude-3-5-sonnet", "claude-3-5-haiku", "claude-3-opus", "claude-3-sonnet", "claude-3-haiku",
    "claude", "gemini-3", "gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.0-flash",
    "gemini-1.5-pro", "gemini-1.5-flash", "gemini", "gemma", "llama", "mistral", "mixtral",
    "magistral", "codestral", "ministral", "devstral", "qwen", "qwq", "deepseek-r1",
    "deepseek-v3", "deepseek-reasoner", "deepseek-chat", "deepseek", "phi", "command", "grok",
    "kimi", "glm", "granite", "nemotron", "minimax", "falcon", "olmo",
    "demo",  # hopmeter's own demo upstream ("demo-1")
)} | {"meta-llama": "llama"}

# Bedrock-style ids ("us.anthropic.claude-...") carry the vendor before a dot.
_VENDOR_PREFIX_RE = re.compile(r"^(?:[a-z]{2}\.)?(?:anthropic|meta|mistral|amazon|cohere|ai21)\.")

# Known LLM routes: (pattern over the path without query, label). Anything else is "other".
# Variable segments (Azure deployments, Gemini model names, thread ids) collapse into the label.
DEFAULT_ROUTES: Sequence[tuple[str, str]] = (
    (r"/(?:openai/|api/)?v1/chat/completions", "/v1/chat/completions"),
    (r"/chat/completions", "/chat/completions"),
    (r"/openai/deployments/[^/]+/chat/completions",
     "/openai/deployments/{deployment}/chat/completions"),
    (r"/(?:openai/)?v1/completions", "/v1/completions"),
    (r"/v1/messages", "/v1/messages"),
    (r"/(?:openai/)?v1/responses", "/v1/responses"),
    (r"/v1/threads/(?:[^/]+/)?runs", "/v1/threads/{thread}/runs"),
    (r"/api/chat", "/api/chat"),
    (r"/api/generate", "/api/generate"),
    (r"/generate_stream", "/generate_stream"),
    (r"/generate", "/generate"),
    (r"/v1(?:beta|alpha)?/models/[^/:]+:streamGenerateContent",
     "/v1beta/models/{model}:streamGenerateContent"),
    (r"/v1(?:beta|alpha)?/models/[^/:]+:generateContent",
     "/v1beta/models/{model}:generateContent"),
    (r"/v1/projects/[^/]+/locations/[^/]+/publishers/[^/]+/models/[^/:]+:streamGenerateContent",
     "/v1/projects/{project}/.../models/{model}:streamGenerateContent"),
)
# fmt: on


# why a name was said as "other" (NameLabels' `folded` callback)
FOLD_REASONS = ("limit", "malformed")


class NameLabels:
    """Configured names (hops, segments, error sites) as label values: the first few kept.

    A name said as "other" is reported to `folded` with why (FOLD_REASONS): "limit" when
    `limit` other names were kept first, "malformed" when it is not a name (`_NAME_RE`); no
    name at all is neither.
    """

    def __init__(
        self, limit: int = MAX_NAMES_PER_LABEL, folded: Callable[[str], None] | None = None
    ) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()  # the proxy's loop and the flow-end threads both label
        self._folded = folded

    def label(self, value: object) -> str:
        """`value` if well formed and among the first `limit` names seen, else "other"."""
        text = str(value) if value is not None else ""
        if text in self._seen:
            return text
        if not _NAME_RE.match(text):
            if text:
                self._fold("malformed")
            return OTHER
        with self._lock:
            full = len(self._seen) >= self._limit
            if not full:
                self._seen.add(text)
        if full:
            self._fold("limit")
            return OTHER
        return text

    def _fold(self, why: str) -> None:
        if self._folded is not None:
            self._folded(why)


def normalise_model(model: str) -> str:
    """Lower-case, drop a provider or org path ("models/", "meta-llama/") and a Bedrock vendor."""
    text = model.strip().lower()
    text = text.rsplit("/", 1)[-1]
    return _VENDOR_PREFIX_RE.sub("", text)


class ModelLabels:
    """Maps a model id to a bounded label: its allow-listed family, "none", or "other"."""

    def __init__(self, families: Mapping[str, str] | Iterable[str]) -> None:
        table = dict(families) if isinstance(families, Mapping) else {f: f for f in families}
        self._table = {normalise_model(k): v for k, v in table.items() if k.strip()}
        self._prefixes = sorted(self._table, key=len, reverse=True)
        self._cache: dict[str, str] = {}

    def label(self, model: object) -> str:
        """The label value for `model` (cached: the same ids recur on every request)."""
        if not isinstance(model, str) or not model.strip():
            return NO_MODEL
        hit = self._cache.get(model)
        if hit is not None:
            return hit
        text = normalise_model(model)
        result = OTHER
        for prefix in self._prefixes:
            rest = text[len(prefix) : len(prefix) + 1]
            if text.startswith(prefix) and not rest.isalpha():
                result = self._table[prefix]
                break
        if len(self._cache) < MAX_CACHED_MODELS:
            self._cache[model] = result
        return result


class RouteLabels:
    """Maps a request path to one of a fixed set of route templates, else "other"."""

    def __init__(self, routes: Sequence[tuple[str, str]]) -> None:
        self._routes = [(re.compile(pattern + "/?"), label) for pattern, label in routes]

    def label(self, path: object) -> str:
        """The template of the first known route `path` matches in full."""
        if not isinstance(path, str):
            return OTHER
        path = path.split("?", 1)[0]
        for pattern, label in self._routes:
            if pattern.fullmatch(path):
                return label
        return OTHER


def status_class(status: object) -> str:
    """The status's class ("2xx" for 200-299 and so on), "none" without a response, else "other"."""
    if isinstance(status, int) and 100 <= status <= 599:
        return f"{status // 100}xx"
    return "none" if status is None else OTHER


def vocabulary_label(value: object, allowed: frozenset[str]) -> str:
    """`value` if it is one of hopmeter's own names in `allowed`, else "other"."""
    return value if isinstance(value, str) and value in allowed else OTHER
