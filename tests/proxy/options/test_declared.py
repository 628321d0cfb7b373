"""Tests for hopmeter.proxy.options.declared: the table of settings is whole and consistent."""

from __future__ import annotations

from collections import Counter

import pytest

from hopmeter.argtypes import parse_bytes
from hopmeter.export.console import MODES
from hopmeter.export.spool import DEFAULT_QUEUE_BYTES
from hopmeter.proxy.addon.passage import STREAM_MODES
from hopmeter.proxy.options import OPTIONS, SETTINGS, declared
from hopmeter.proxy.options.setting import DURATIONS, Kind, Setting

ADDONS = {
    declared.MEASURING,
    declared.PASSAGE,
    declared.GUARD,
    declared.READINESS,
    declared.BROWSER,
    declared.RECORDS,
    declared.CONSOLE,
    declared.METRICS,
    declared.OTEL,
    declared.UI,
    declared.QUEUES,
    declared.RELAY,
    declared.DRAIN,
}


def test_each_flag_and_option_is_declared_once() -> None:
    """No flag and no option appears in two settings; every option is a hopmeter_* name."""
    flags = Counter(s.flag for s in SETTINGS if s.flag)
    options = Counter(s.option for s in SETTINGS if s.option)
    assert [f for f, n in flags.items() if n > 1] == []
    assert [o for o, n in options.items() if n > 1] == []
    assert all(o.startswith("hopmeter_") for o in options)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.flag or s.option)
def test_a_setting_is_whole(setting: Setting) -> None:
    """Each setting has help; an option names the addon that owns it; a flag that sets another
    setting's option is a switch naming a declared option and no option of its own."""
    assert setting.help and setting.help == setting.help.strip()
    assert setting.flag or setting.option
    if setting.option:
        assert setting.addon in ADDONS
    if setting.sets is not None:
        assert setting.kind is Kind.SWITCH and not setting.option
        assert setting.sets[0] in OPTIONS
    if setting.flag and setting.kind is Kind.SWITCH:
        assert setting.default in (False, ""), "a switch flag can only turn something on"
    if setting.kind is Kind.SIZE:
        assert not setting.flag, "no size flag: its argparse type is not written"


@pytest.mark.parametrize("setting", OPTIONS.values(), ids=lambda s: s.option)
def test_every_default_reads(setting: Setting) -> None:
    """Each option's default is a value its own kind reads (a duration in seconds, ...)."""
    value = setting.read(list(setting.default) if setting.kind is Kind.LIST else setting.default)
    if setting.kind in DURATIONS:
        assert isinstance(value, float) and value > 0


def test_every_addon_key_owns_an_option() -> None:
    """Each addon key is the owner of at least one option (none is left over)."""
    assert {s.addon for s in OPTIONS.values()} == ADDONS


def test_the_choices_are_the_addons_own() -> None:
    """The console's modes and the passage's stream modes are what their modules act on, and
    the output queue's default is the spool's."""
    assert OPTIONS["hopmeter_console"].choices == MODES
    assert OPTIONS["hopmeter_stream"].choices == STREAM_MODES
    assert parse_bytes(OPTIONS["hopmeter_output_queue"].default, "x") == DEFAULT_QUEUE_BYTES


def test_every_duration_option_is_text_read_as_seconds() -> None:
    """The stall threshold, summary interval and the timeouts are durations: text in mitmproxy
    (its --set cannot set a float), read as seconds."""
    durations = {s.option for s in OPTIONS.values() if s.kind in DURATIONS}
    assert {
        "hopmeter_stall_threshold",
        "hopmeter_summary_interval",
        "hopmeter_connect_timeout",
        "hopmeter_read_timeout",
        "hopmeter_drain_timeout",
        "hopmeter_failure_log_interval",
        "hopmeter_ready_interval",
        "hopmeter_ready_timeout",
    } == durations
