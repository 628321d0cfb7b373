"""Tests for hopmeter.export.labels: every label value bounded, whatever the traffic."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from hopmeter.export.labels import (
    APIS,
    DEFAULT_MODEL_FAMILIES,
    DEFAULT_ROUTES,
    ENDINGS,
    FINDING_KINDS,
    MAX_CACHED_MODELS,
    MAX_NAMES_PER_LABEL,
    OTHER,
    ModelLabels,
    NameLabels,
    RouteLabels,
    normalise_model,
    status_class,
    vocabulary_label,
)


@pytest.mark.parametrize(
    ("model", "label"),
    [
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4"),
        ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", "claude-3-5-sonnet"),
        ("models/gemini-2.5-flash", "gemini-2.5-flash"),
        ("meta-llama/Meta-Llama-3-8B-Instruct-Turbo", "llama"),
        ("llama3.2:3b", "llama"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("phi3", "phi"),
        ("philosopher-7b", "other"),
        ("", "none"),
        (None, "none"),
    ],
)
def test_models_map_to_allow_listed_families(model: str | None, label: str) -> None:
    """Model ids are normalised and matched by family prefix, else "other"."""
    assert ModelLabels(DEFAULT_MODEL_FAMILIES).label(model) == label


def test_a_custom_model_allow_list_replaces_the_default() -> None:
    """The constructor's allow-list is used as given."""
    models = ModelLabels(["my-model"])
    assert models.label("My-Model-v2") == "my-model"
    assert models.label("gpt-4o") == OTHER


def test_normalise_model_drops_paths_and_vendors() -> None:
    """Case, an org or provider path and a Bedrock vendor prefix are dropped."""
    assert normalise_model(" Models/Gemini-2.5-Flash ") == "gemini-2.5-flash"
    assert normalise_model("eu.meta.llama3-70b") == "llama3-70b"


def test_the_model_cache_is_bounded() -> None:
    """Random model ids stop being cached at the cap and are still labelled."""
    models = ModelLabels(DEFAULT_MODEL_FAMILIES)
    for i in range(5_000):
        assert models.label(f"zz-{i}") == OTHER
    assert len(models._cache) == MAX_CACHED_MODELS


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat/completions/", "/v1/chat/completions"),
        ("/v1/chat/completions?stream=true", "/v1/chat/completions"),
        ("/openai/v1/chat/completions", "/v1/chat/completions"),
        (
            "/openai/deployments/prod-7/chat/completions",
            "/openai/deployments/{deployment}/chat/completions",
        ),
        ("/v1/messages", "/v1/messages"),
        ("/v1/responses", "/v1/responses"),
        ("/api/chat", "/api/chat"),
        ("/api/generate", "/api/generate"),
        (
            "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
            "/v1beta/models/{model}:streamGenerateContent",
        ),
        ("/v1/threads/thread_abc123/runs", "/v1/threads/{thread}/runs"),
        ("/v1/chat/completions/123e4567-e89b-12d3-a456-426614174000", "other"),
        ("/users/42", "other"),
        (None, "other"),
    ],
)
def test_paths_map_to_route_templates(path: str | None, route: str) -> None:
    """Known LLM routes keep a template with ids collapsed; everything else is "other"."""
    assert RouteLabels(DEFAULT_ROUTES).label(path) == route


def test_names_are_capped_at_the_first_few_seen() -> None:
    """The first MAX_NAMES_PER_LABEL well-formed names are kept; later ones are "other"."""
    names = NameLabels()
    kept = [names.label(f"hop{i}") for i in range(MAX_NAMES_PER_LABEL)]
    assert kept == [f"hop{i}" for i in range(MAX_NAMES_PER_LABEL)]
    assert names.label("one-too-many") == OTHER
    assert names.label("hop0") == "hop0"  # a name already kept stays kept


def test_a_name_said_as_other_is_reported_with_why() -> None:
    """Each name folded into "other" is reported: past the cap ("limit", every time it comes),
    not a name ("malformed"); a kept name and no name at all are not."""
    why: list[str] = []
    names = NameLabels(limit=1, folded=why.append)
    assert [names.label(v) for v in ("a", "a", "b", "b", "has space", "", None)] == [
        "a",
        "a",
        OTHER,
        OTHER,
        OTHER,
        OTHER,
        OTHER,
    ]
    assert why == ["limit", "limit", "malformed"]


@pytest.mark.parametrize("name", ["", None, "has space", "x" * 65, "a/b", "é"])
def test_malformed_names_are_other(name: object) -> None:
    """A name outside [A-Za-z0-9_.:>-]{1,64} is "other" and uses up no place under the cap."""
    names = NameLabels(limit=1)
    assert names.label(name) == OTHER
    assert names.label("edge>origin") == "edge>origin"


def test_name_caps_hold_under_concurrent_labelling() -> None:
    """Threads labelling distinct names at once never keep more than the cap."""
    names = NameLabels(limit=5)
    kept: set[str] = set()

    def label(offset: int) -> None:
        for i in range(200):
            kept.add(names.label(f"n{offset}-{i}"))

    threads = [threading.Thread(target=label, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(kept - {OTHER}) == 5


@pytest.mark.parametrize(
    ("status", "label"),
    [(200, "2xx"), (101, "1xx"), (404, "4xx"), (599, "5xx"), (None, "none"), (0, "other"),
     (600, "other"), ("200", "other")],
)  # fmt: skip
def test_status_class(status: object, label: str) -> None:
    """HTTP statuses become their class, a missing response "none", anything else "other"."""
    assert status_class(status) == label


def test_vocabulary_labels_keep_only_hopmeters_own_names() -> None:
    """A record value is its label only if it is in the allowed vocabulary, hashable or not."""
    assert vocabulary_label("openai.chat", APIS) == "openai.chat"
    assert vocabulary_label("made.up", APIS) == OTHER
    assert vocabulary_label(["openai.chat"], APIS) == OTHER
    assert vocabulary_label(None, ENDINGS) == OTHER


def test_label_tables_follow_the_core() -> None:
    """Every finding kind the label allows has a fix in the detectors', the segments' or the
    client findings' table."""
    from hopmeter.core.client import FIXES as CLIENT_FIXES
    from hopmeter.core.detectors import FIXES
    from hopmeter.core.hops import SEGMENT_FIXES

    assert frozenset(FIXES) | frozenset(SEGMENT_FIXES) | frozenset(CLIENT_FIXES) == FINDING_KINDS
    assert {"complete", "shutdown"} <= ENDINGS


@pytest.mark.integration
def test_labels_import_no_exporter_library() -> None:
    """Importing the label tables loads neither prometheus_client nor opentelemetry."""
    code = (
        "import sys, hopmeter.export.labels\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('prometheus_client', 'opentelemetry', 'mitmproxy')]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
