"""Tests for hopmeter.proxy.options.setting: one declaration, and each spelling made from it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pytest

from hopmeter.core.vocab import EventLoop
from hopmeter.errors import UsageError
from hopmeter.proxy.options.setting import OPTION_TYPES, Kind, Setting


def parser_of(*settings: Setting) -> argparse.ArgumentParser:
    """A parser with the flags of `settings`, whose errors raise instead of exiting."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for s in settings:
        names, kwargs = s.flag_arguments()
        parser.add_argument(*names, **kwargs)
    return parser


STALL = Setting(
    flag="--stall-threshold",
    option="hopmeter_stall_threshold",
    kind=Kind.SECONDS,
    metavar="SECONDS",
    default="0.5",
    help="a gap at or above this is a stall",
)
SUMMARY = Setting(
    flag="--summary-interval",
    option="hopmeter_summary_interval",
    kind=Kind.SECONDS_OR_ZERO,
    default="60",
    help="seconds between summaries, 0 for none",
)


def test_a_duration_flag_keeps_the_text_its_option_reads() -> None:
    """`--stall-threshold 300ms` is the text "300ms" on the namespace and in the option, and
    the option reads it as 0.3 s: no float turned back into text on the way."""
    args = parser_of(STALL).parse_args(["--stall-threshold", "300ms"])
    assert args.stall_threshold == "300ms"
    assert STALL.option_value(args.stall_threshold) == "300ms"
    assert STALL.read(STALL.option_value(args.stall_threshold)) == pytest.approx(0.3)


def test_a_duration_flag_refuses_what_its_option_would() -> None:
    """A duration flag checks its value with the one grammar: above 0, or 0 allowed where 0
    means none; argparse names the flag."""
    with pytest.raises(argparse.ArgumentError, match="'0' must be above 0"):
        parser_of(STALL).parse_args(["--stall-threshold", "0"])
    with pytest.raises(argparse.ArgumentError, match="'soon' is not a number of seconds"):
        parser_of(STALL).parse_args(["--stall-threshold", "soon"])
    assert parser_of(SUMMARY).parse_args(["--summary-interval", "0"]).summary_interval == "0"
    with pytest.raises(argparse.ArgumentError, match="'-1' must be 0 or more seconds"):
        parser_of(SUMMARY).parse_args(["--summary-interval", "-1"])


def test_an_option_reads_a_duration_once_naming_itself_when_bad() -> None:
    """The option's text is read as seconds; a bad one is one line naming the option."""
    assert STALL.read("0.5s") == 0.5 and SUMMARY.read("0") == 0.0
    with pytest.raises(UsageError, match=r"^hopmeter_stall_threshold '0': expected a positive"):
        STALL.read("0")
    with pytest.raises(UsageError, match=r"^hopmeter_summary_interval '-2': expected 0 or more"):
        SUMMARY.read("-2")


def test_a_size_option_reads_as_bytes() -> None:
    """A size reads with its binary unit; a bad one names the option."""
    queue = Setting(option="hopmeter_output_queue", kind=Kind.SIZE, default="8MiB", help="x")
    assert queue.read("512KiB") == 512 * 1024
    with pytest.raises(UsageError, match=r"^hopmeter_output_queue 'lots'"):
        queue.read("lots")


def test_other_kinds_read_as_they_are() -> None:
    """Text, switches and numbers are what mitmproxy holds: read() gives them back."""
    assert Setting(option="hopmeter_hop", help="x").read("edge") == "edge"
    assert Setting(option="hopmeter_mark", kind=Kind.SWITCH, help="x").read(False) is False


def test_the_option_help_is_a_sentence_and_the_flag_help_says_the_default() -> None:
    """mitmproxy shows the help capitalised with a full stop; --help adds the default, inside
    a closing parenthesis when there is one, and escapes % for argparse."""
    assert STALL.option_help == "A gap at or above this is a stall."
    _, kwargs = STALL.flag_arguments()
    assert kwargs["help"] == "a gap at or above this is a stall (default: 0.5)"
    seed = Setting(flag="--seed", kind=Kind.INT, default=0, help="seed (0 = new per flow)")
    assert seed.flag_arguments()[1]["help"] == "seed (0 = new per flow; default: 0)"
    loop = Setting(flag="--loop", help="~20% less CPU", default_doc="uvloop")
    assert loop.flag_arguments()[1]["help"] == "~20%% less CPU (default: uvloop)"


def test_switches_lists_and_choices_become_their_argparse_forms() -> None:
    """A switch is store_true, a list repeatable, on|off a choice read as a bool, enum choices
    parse to their members, the positional is optional."""
    switch = Setting(flag="--browser", option="hopmeter_browser", kind=Kind.SWITCH, help="b")
    listed = Setting(flag="--set", dest="set_", kind=Kind.LIST, default=(), help="s")
    on_off = Setting(flag="--otel-timeline", kind=Kind.ON_OFF, default=True, help="t")
    loop = Setting(flag="--loop", choices=tuple(EventLoop), default=EventLoop.ASYNCIO, help="l")
    upstream = Setting(flag="upstream", metavar="UPSTREAM_URL", default=None, help="u")
    parser = parser_of(switch, listed, on_off, loop, upstream)
    args = parser.parse_args(["--browser", "--set", "a=1", "--set", "b=2", "--loop", "uvloop"])
    assert (args.browser, args.set_, args.otel_timeline, args.upstream) == (
        True,
        ["a=1", "b=2"],
        "on",
        None,
    )
    assert args.loop is EventLoop.UVLOOP
    assert on_off.option_value("off") is False and on_off.option_value("on") is True
    assert listed.option_value(("x",)) == ["x"]
    assert parser.parse_args(["http://h"]).upstream == "http://h"


def test_a_hidden_flag_has_no_help() -> None:
    """A flag for hopmeter's own use is suppressed from --help (and so from the environment)."""
    hidden = Setting(flag="--worker-index", kind=Kind.INT, default=None, hidden=True, help="w")
    assert hidden.flag_arguments()[1]["help"] == argparse.SUPPRESS


def test_every_kind_has_a_mitmproxy_type() -> None:
    """Each kind names what mitmproxy's add_option takes; durations and sizes are text."""
    assert set(OPTION_TYPES) == set(Kind)
    assert OPTION_TYPES[Kind.SECONDS] is str and OPTION_TYPES[Kind.SIZE] is str
    assert OPTION_TYPES[Kind.LIST] == Sequence[str]


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (STALL, "0.5"),
        (Setting(flag="--browser", kind=Kind.SWITCH, default=False, help="b"), "off"),
        (Setting(flag="--otel-timeline", kind=Kind.ON_OFF, default=True, help="t"), "on"),
        (Setting(flag="--records", help="r"), "none"),
        (Setting(flag="--tokenizer", default_doc="chosen by model", help="t"), "chosen by model"),
    ],
)
def test_the_default_in_words(setting: Setting, words: str) -> None:
    """The default as --help and docs/cli.md say it: the value, on/off, none, or the words."""
    assert setting.default_words() == words
