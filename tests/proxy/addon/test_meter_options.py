"""Tests for hopmeter.proxy.addon.meter_options: what the measuring addon's options mean."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mitmproxy import options as mitm_options

from hopmeter.errors import UsageError
from hopmeter.proxy.addon.meter_options import (
    chaos_actions,
    fingerprint_key,
    hop_name,
    listener_modes,
    pairing_hops,
    parse_listeners,
    unknown_options,
)


def test_listeners_map_each_mode_to_its_name() -> None:
    """NAME=MODE pairs give each mode spec its hop's name; a pair without NAME= is refused."""
    pairs = ["edge=reverse:http://a:1@8081", "origin=reverse:http://b:2@8082"]
    assert parse_listeners(pairs) == {
        "reverse:http://a:1@8081": "edge",
        "reverse:http://b:2@8082": "origin",
    }
    with pytest.raises(UsageError, match=r"^hopmeter_listeners 'x': expected NAME=MODE"):
        parse_listeners(["x"])


def test_listener_modes_are_added_to_mitmproxys_modes() -> None:
    """The listeners' modes join `mode` (a lone default "regular" gives way); nothing to add
    is None, so `mode` is not set again."""
    listeners = {"reverse:http://a:1@8081": "edge"}
    assert listener_modes(["regular"], listeners) == ["reverse:http://a:1@8081"]
    assert listener_modes(["local"], listeners) == ["local", "reverse:http://a:1@8081"]
    assert listener_modes(["reverse:http://a:1@8081"], listeners) is None


def test_pairing_hops_are_the_listeners_unless_content_pairing_is_off() -> None:
    """Each mode's hop (this hop's name where no listener names it); none when off."""
    listeners = {"reverse:http://a:1@8081": "edge"}
    opts = SimpleNamespace(
        hopmeter_content_pairing=True,
        hopmeter_hop="proxy",
        mode=["reverse:http://a:1@8081", "regular@8082"],
    )
    assert pairing_hops(opts, listeners) == {"edge", "proxy"}
    opts.hopmeter_content_pairing = False
    assert pairing_hops(opts, listeners) == frozenset()


def test_the_fingerprint_key_is_read_from_the_named_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No variable: unkeyed; a variable that is unset or empty is one line naming it and the
    fix; a set one gives its bytes."""
    assert fingerprint_key("") is None
    monkeypatch.delenv("HOPMETER_TEST_KEY", raising=False)
    with pytest.raises(UsageError, match="HOPMETER_TEST_KEY is not set or empty; set it"):
        fingerprint_key("HOPMETER_TEST_KEY")
    monkeypatch.setenv("HOPMETER_TEST_KEY", "k")
    assert fingerprint_key("HOPMETER_TEST_KEY") == b"k"


def test_chaos_actions_name_the_option_when_unknown() -> None:
    """Known actions are kept in order; an unknown one is an error naming hopmeter_chaos."""
    assert chaos_actions("") == ()
    assert chaos_actions("rechunk,cr") == ("rechunk", "cr")
    with pytest.raises(UsageError, match=r"^hopmeter_chaos: unknown chaos action 'shuffle'"):
        chaos_actions("shuffle")


def test_a_hop_name_is_never_empty() -> None:
    """Every record and series names its hop: an empty or blank name is refused with the fix."""
    assert hop_name("edge") == "edge"
    for blank in ("", "  "):
        with pytest.raises(UsageError, match="hopmeter_hop must not be empty"):
            hop_name(blank)


@pytest.mark.parametrize("name", ["a b", 'edge"}{x', "edge>origin", "x" * 65])
def test_a_hop_name_that_no_metric_could_carry_is_refused(name: str) -> None:
    """A name /metrics would say as "other" (or that would read as a segment) is refused at
    start, naming the option and the fix, rather than every series of the hop going to "other"
    unsaid; the name's limits are the metrics' own."""
    with pytest.raises(UsageError, match=r"^hopmeter_hop: .* is not a hop's name"):
        hop_name(name)
    assert hop_name("edge-1.eu:a_b") == "edge-1.eu:a_b"


def test_a_misspelled_hopmeter_option_is_named_with_the_nearest_one() -> None:
    """Options `--set` gave that no addon declared: each `hopmeter_*` one is a line naming it
    and the nearest known option (none when nothing is near); other names are not hopmeter's."""
    opts = mitm_options.Options()
    opts.add_option("hopmeter_stall_threshold", str, "0.5", "")
    for value in ("hopmeter_stall_treshold=1", "hopmeter_zzz=1", "unrelated=1"):
        opts.set(value, defer=True)
    assert unknown_options(opts) == [
        "hopmeter: --set hopmeter_stall_treshold: no such option, not used; did you mean "
        "hopmeter_stall_threshold? (docs/cli.md)",
        "hopmeter: --set hopmeter_zzz: no such option, not used (docs/cli.md)",
    ]
    assert unknown_options(mitm_options.Options()) == []
