"""The vocabulary: one spelling per name, the same in code, records, labels and docs/design.md."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

import orjson
import pytest

from hopmeter.core.vocab import (
    SEVERITY_ORDER,
    TERMINATED_APIS,
    UNKNOWN_APIS,
    Api,
    BeaconOutcome,
    Ended,
    FindingKind,
    Severity,
    TokenSource,
)

DESIGN = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
VOCABULARIES: list[type[StrEnum]] = [
    Api,
    Ended,
    TokenSource,
    Severity,
    FindingKind,
    BeaconOutcome,
]


def test_a_member_is_its_value_everywhere() -> None:
    """A member compares, hashes, formats and serialises as its plain string value."""
    assert Api.ANTHROPIC_MESSAGES == "anthropic.messages"
    assert {"client_gone": 1}[Ended.CLIENT_GONE] == 1
    assert f"{TokenSource.USAGE}" == str(TokenSource.USAGE) == "usage"
    record = {"api": Api.OPENAI_CHAT, "ended": Ended.UPSTREAM_RESET}
    assert orjson.dumps(record) == b'{"api":"openai.chat","ended":"upstream_reset"}'


@pytest.mark.parametrize("vocabulary", VOCABULARIES, ids=lambda v: v.__name__)
def test_every_name_has_its_own_label_safe_value(vocabulary: type[StrEnum]) -> None:
    """No two names share a value (an Enum would make one an alias), and every value is lower
    case ASCII a metric label and a record can carry as is."""
    assert len(vocabulary.__members__) == len(list(vocabulary))
    assert all(re.fullmatch(r"[a-z][a-z0-9_.]*", member) for member in vocabulary)


def test_severities_rank_worst_first() -> None:
    """Every severity has a rank, and ranking lists errors, then warnings, then information."""
    assert set(SEVERITY_ORDER) == set(Severity)
    ranked = sorted(["info", "error", "warning"], key=SEVERITY_ORDER.__getitem__)
    assert ranked == [Severity.ERROR, Severity.WARNING, Severity.INFO]


def test_every_api_says_whether_its_streams_end_with_a_terminal_event() -> None:
    """An API is a media type's name, one whose streams end with a terminal event, or token ids
    (whose streams carry none); no API is two of these."""
    assert not UNKNOWN_APIS & TERMINATED_APIS
    assert set(Api) - UNKNOWN_APIS - TERMINATED_APIS == {Api.TOKEN_IDS}


def test_the_record_documents_every_api() -> None:
    """docs/design.md §4 lists exactly the APIs a record's `api` can carry."""
    section = DESIGN[DESIGN.index("\napi:") : DESIGN.index("\nchunks:")]
    assert set(re.findall(r'"([a-z0-9_.]+)"', section)) == set(Api)


def test_the_findings_table_documents_every_kind() -> None:
    """docs/design.md §7's table has one row per finding kind, and no other."""
    section = DESIGN[DESIGN.index("## 7.") : DESIGN.index("## 8.")]
    rows = re.findall(r"^\| ([a-z0-9_]+) \|", section, flags=re.MULTILINE)
    assert rows[0] == "kind"  # the header
    assert sorted(rows[1:]) == sorted(FindingKind)


def test_the_metrics_section_documents_every_beacon_outcome() -> None:
    """docs/design.md §8 lists exactly the outcomes hopmeter_beacons_total can carry."""
    section = DESIGN[DESIGN.index("beacons_total{outcome}") : DESIGN.index("Trace ids travel")]
    assert set(re.findall(r"`([a-z_]+)`", section)) - {"outcome"} >= set(BeaconOutcome)
