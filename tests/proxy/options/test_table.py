"""Tests for hopmeter.proxy.options.table: the flags, the addons' options and what `hopmeter run`
sets, all made from the one table."""

from __future__ import annotations

import argparse
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from mitmproxy import optmanager
from mitmproxy.test import taddons

from hopmeter import cli, env
from hopmeter.errors import UsageError
from hopmeter.proxy import options
from hopmeter.proxy.addon.browser_meter import BrowserMeter
from hopmeter.proxy.addon.chain import default_addons
from hopmeter.proxy.addon.guard import UpstreamGuard
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.outlets import OutputQueues
from hopmeter.proxy.addon.outputs import ConsoleOutput, MetricsOutput, OtelOutput, RecordsOutput
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.addon.ui import HopView
from hopmeter.proxy.fastpath.relay import Relay
from hopmeter.proxy.options import FLAGS, OPTIONS, Kind, run_options, said_by_flag
from hopmeter.proxy.options.setting import DURATIONS
from hopmeter.proxy.run.command import check_ports, proxy_config
from hopmeter.proxy.run.drain import Drain

# What `hopmeter run` set on its master before the table made it, by hand: the same options.
RUN_SETS = {
    "hopmeter_hop", "hopmeter_listeners", "hopmeter_records", "hopmeter_metrics",
    "hopmeter_stall_threshold", "hopmeter_tokenizer", "hopmeter_lazy_tokenizer",
    "hopmeter_log_content", "hopmeter_trace_header", "hopmeter_fingerprint_key_env",
    "hopmeter_content_pairing", "hopmeter_otel_endpoint", "hopmeter_otel_timeline",
    "hopmeter_chaos", "hopmeter_chaos_seed", "hopmeter_console", "hopmeter_summary_interval",
    "hopmeter_connect_timeout", "hopmeter_read_timeout", "hopmeter_drain_timeout",
    "hopmeter_browser", "hopmeter_stream", "hopmeter_keep_body", "hopmeter_relay",
}  # fmt: skip


def run_args(*argv: str, environ: dict[str, str] | None = None) -> argparse.Namespace:
    """`hopmeter run ARGV` parsed by the real command line."""
    return env.parse_args(cli.build_parser(), ["run", *argv], environ or {})


class Loader:
    """mitmproxy's addon loader, declaring into a real option manager (its type checks
    included) without configuring the addons: nothing binds a port."""

    def __init__(self) -> None:
        self.options = optmanager.OptManager()

    def add_option(self, name: str, typespec: Any, default: Any, help: str, choices: Any) -> None:
        assert name not in self.options, f"{name} declared twice"
        self.options.add_option(name, typespec, default, help, choices)


def loaded(*addons: Any) -> dict[str, Any]:
    """The options `addons` declare in their `load`, by name."""
    loader = Loader()
    for addon in addons:
        addon.load(loader)
    return {k: v for k, v in loader.options._options.items() if k.startswith("hopmeter_")}


def test_the_addons_declare_every_option_as_the_table_says() -> None:
    """Loaded together (hopmeter run's addons), the addons declare exactly the table's options,
    each once, with its type, default, help and choices."""
    addons = default_addons()
    meter = addons[0]
    assert isinstance(meter, HopMeter)
    declared = loaded(*addons, Drain(meter), Relay(meter.relay_failed))
    assert declared.keys() == OPTIONS.keys()
    for name, opt in declared.items():
        s = OPTIONS[name]
        assert opt.typespec == options.setting.OPTION_TYPES[s.kind], name
        assert opt.default == options.table.option_default(s), name
        assert opt.help == s.option_help, name
        assert list(opt.choices or ()) == [str(c) for c in s.choices], name


def test_each_addon_declares_the_options_it_owns() -> None:
    """An addon's `load` declares the options whose setting names it, and no other."""
    meter, readiness = HopMeter(), Readiness()
    queues = OutputQueues()
    owners: list[tuple[Any, set[str]]] = [
        (HopMeter(), {options.MEASURING, options.PASSAGE}),
        (UpstreamGuard(meter, readiness), {options.GUARD}),
        (Readiness(), {options.READINESS}),
        (BrowserMeter(HopMeter()), {options.BROWSER}),
        (RecordsOutput(meter, queues.outlets), {options.RECORDS}),
        (ConsoleOutput(meter, queues.outlets), {options.CONSOLE}),
        (MetricsOutput(meter), {options.METRICS}),
        (OtelOutput(meter), {options.OTEL}),
        (HopView(meter), {options.UI}),
        (OutputQueues(), {options.QUEUES}),
        (Relay(meter.relay_failed), {options.RELAY}),
        (Drain(meter), {options.DRAIN}),
    ]
    for addon, keys in owners:
        owned = {s.option for s in OPTIONS.values() if s.addon in keys}
        assert loaded(addon).keys() == owned, type(addon).__name__


def test_an_unknown_addon_key_is_refused() -> None:
    """Declaring for a key no option names is a mistake said at once, not an addon without
    options."""
    with pytest.raises(ValueError, match="'gaurd'"):
        options.declare(object(), "gaurd")


def test_hopmeter_run_has_the_tables_flags_in_its_order() -> None:
    """`hopmeter run`'s parser holds each flag of the table, in the table's order, nothing else
    but --help."""
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    run = sub.choices["run"]
    spelled = [a.option_strings[-1] if a.option_strings else a.dest for a in run._actions]
    assert spelled == ["--help", *(s.flag for s in FLAGS)]


def test_without_flags_hopmeter_run_sets_the_same_options_as_ever() -> None:
    """With no flag given, `hopmeter run` sets the options it always set, at its own values
    where they differ from plain mitmproxy's (every response streamed, no body kept)."""
    values = run_options(run_args())
    assert values.keys() == RUN_SETS
    assert values == run_options()  # the demo's starting point: the same values
    assert (values["hopmeter_stream"], values["hopmeter_keep_body"]) == ("all", "0")
    assert (values["hopmeter_console"], values["hopmeter_trace_header"]) == ("text", True)
    assert (values["hopmeter_relay"], values["hopmeter_otel_timeline"]) == (True, True)
    assert values["hopmeter_stall_threshold"] == "0.5"
    assert values["hopmeter_listeners"] == []


def test_switches_set_the_options_they_name() -> None:
    """--no-trace-header, --no-content-pairing and --no-relay turn their options off,
    --otel-timeline off its bool, --json the console to json, and --quiet wins over --json."""
    values = run_options(
        run_args("--no-trace-header", "--no-content-pairing", "--no-relay", "--json")
    )
    assert not values["hopmeter_trace_header"] and not values["hopmeter_content_pairing"]
    assert not values["hopmeter_relay"]
    assert values["hopmeter_console"] == "json"
    assert run_options(run_args("--json", "--quiet"))["hopmeter_console"] == "off"
    assert run_options(run_args("--otel-timeline", "off"))["hopmeter_otel_timeline"] is False


def test_flags_and_variables_give_their_options_the_value() -> None:
    """A flag's value (or its variable's) is its option's: text, lists, numbers."""
    values = run_options(
        run_args("--hop", "edge", "--listener", "a=regular@8081", "--chaos-seed", "3"),
    )
    assert (values["hopmeter_hop"], values["hopmeter_chaos_seed"]) == ("edge", 3)
    assert values["hopmeter_listeners"] == ["a=regular@8081"]
    from_env = run_options(run_args(environ={"HOPMETER_READ_TIMEOUT": "900"}))
    assert from_env["hopmeter_read_timeout"] == "900"


@pytest.mark.parametrize("setting", [s for s in FLAGS if s.kind in DURATIONS], ids=lambda s: s.flag)
def test_every_duration_flag_takes_the_one_grammar(setting: options.Setting) -> None:
    """Each duration flag takes `500ms` as its option does, and hands the text over unchanged
    for the option to read as 0.5 s."""
    values = run_options(run_args(setting.flag, "500ms"))
    assert values[setting.option] == "500ms"
    assert setting.read(values[setting.option]) == pytest.approx(0.5)


def test_given_values_override_and_unknown_names_are_refused() -> None:
    """The demo's own values win over the defaults; a name that is no hopmeter option is a
    mistake said at once."""
    assert run_options(hopmeter_hop="demo")["hopmeter_hop"] == "demo"
    with pytest.raises(ValueError, match="hopmeter_hops"):
        run_options(hopmeter_hops="demo")


def test_read_and_default_parse_by_the_options_kind() -> None:
    """`read` takes an option off mitmproxy's options as it means; `default` is what it means
    before any configure; a bad value names the option."""
    opts = SimpleNamespace(hopmeter_read_timeout="1.5s", hopmeter_output_queue="1KiB")
    assert options.read(opts, "hopmeter_read_timeout") == 1.5
    assert options.read(opts, "hopmeter_output_queue") == 1024
    assert options.default("hopmeter_drain_timeout") == 20.0
    assert options.default("hopmeter_hop") == "proxy"
    with pytest.raises(UsageError, match=r"^hopmeter_read_timeout"):
        options.read(SimpleNamespace(hopmeter_read_timeout="x"), "hopmeter_read_timeout")


def test_a_list_options_default_is_a_fresh_list() -> None:
    """mitmproxy holds a list option's default as a list; the table's own stays a tuple."""
    listeners = OPTIONS["hopmeter_listeners"]
    assert listeners.kind is Kind.LIST and listeners.default == ()
    assert options.table.option_default(listeners) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["http://127.0.0.1:9000", "--listener", "e=regular@127.0.0.1:18080"],
            "UPSTREAM_URL and --listener do not go together",
        ),
        (
            ["--listen", "127.0.0.1:18081", "--listener", "e=regular@127.0.0.1:18080"],
            "--listen and --listener do not go together",
        ),
    ],
)
def test_an_upstream_or_listen_address_with_listeners_is_refused(
    argv: list[str], message: str
) -> None:
    """Listeners name their own address and upstream: an UPSTREAM_URL or --listen given beside
    them would be silently ignored, so it is an error naming both and the fix."""
    with pytest.raises(UsageError, match=message):
        proxy_config(run_args(*argv), "http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [
        (["--chaos-seed", "7"], {}, "--chaos-seed"),
        ([], {"HOPMETER_CHAOS_SEED": "7"}, "HOPMETER_CHAOS_SEED"),
    ],
)
def test_a_chaos_seed_without_chaos_is_refused(
    argv: list[str], environ: dict[str, str], named: str
) -> None:
    """A seed with nothing to seed would be taken in silence (the user believes chaos is on):
    refused, naming where the seed came from and the fix; with --chaos it is taken."""
    with pytest.raises(UsageError, match=f"^{named} seeds --chaos, which is not on: give --chaos"):
        proxy_config(run_args(*argv, environ=environ), "http://127.0.0.1:9")
    cfg = proxy_config(run_args("--chaos", "rechunk", *argv, environ=environ), "http://x:9")
    assert cfg.options["hopmeter_chaos_seed"] == 7


def test_a_configure_error_names_the_flag_or_the_option_as_it_was_given() -> None:
    """An error an addon raises names its option; `hopmeter run` says the flag that set it, and
    the option where `--set` gave it by name (or where no flag sets it)."""
    message = "hopmeter_chaos: unknown chaos action 'bogus'"
    assert said_by_flag(message) == "--chaos: unknown chaos action 'bogus'"
    assert said_by_flag(message, ["hopmeter_chaos"]) == message
    assert said_by_flag("hopmeter_mark: x") == "hopmeter_mark: x"  # no flag sets it
    assert said_by_flag("no option here") == "no option here"


@pytest.mark.parametrize("metrics", ["127.0.0.1:18082", "0.0.0.0:18082"])
def test_a_metrics_address_that_is_a_listen_address_is_refused(metrics: str) -> None:
    """The metrics endpoint on a listener's port would fail to bind after the proxy started,
    with only mitmproxy's "Error logged during startup": it is refused first, by name."""
    cfg = proxy_config(
        run_args("http://127.0.0.1:9000", "--listen", "127.0.0.1:18082", "--metrics", metrics),
        "http://127.0.0.1:9000",
    )
    with pytest.raises(UsageError, match="is also a listen address"):
        check_ports(cfg)


def test_a_set_value_mitmproxy_cannot_convert_is_refused_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`mitmdump -s hopmeter --set hopmeter_mark=maybe`: mitmproxy converts a script's `--set`
    values after the script loaded and, on one it cannot convert, drops the whole script without
    a word. hopmeter checks them as it declares its options: each bad one is an error naming
    the option and what it takes (mitmdump stops at start-up on it), and keeps its default;
    good ones apply as given."""
    with taddons.context() as tctx:
        tctx.options.set(
            "hopmeter_metrics=off",
            "hopmeter_mark=maybe",
            "hopmeter_chaos_seed=x",
            "hopmeter_stream=bogus",
            "hopmeter_hop=edge",
            defer=True,  # as mitmdump's command line does, before the script has loaded
        )
        with caplog.at_level(logging.ERROR):
            tctx.master.addons.add(*default_addons())
        o = tctx.options
        assert (o.hopmeter_mark, o.hopmeter_stream, o.hopmeter_hop) == (True, "streams", "edge")
        assert o.hopmeter_chaos_seed == OPTIONS["hopmeter_chaos_seed"].default
        assert tctx.master.addons.get("hopmeter") is not None
        tctx.master.addons.get("metricsoutput").done()
    errors = {r.getMessage() for r in caplog.records if r.levelno == logging.ERROR}
    assert errors == {
        "hopmeter: --set hopmeter_stream=bogus: expected one of streams, all",
        "hopmeter: --set hopmeter_chaos_seed=x: expected a whole number",
        "hopmeter: --set hopmeter_mark=maybe: expected true or false",
    }


@pytest.mark.parametrize(
    ("kind_of", "given", "problem"),
    [
        ("hopmeter_mark", ["true"], None),
        ("hopmeter_mark", [], None),
        ("hopmeter_mark", ["toggle"], None),
        ("hopmeter_mark", ["yes"], "expected true or false"),
        ("hopmeter_chaos_seed", ["12"], None),
        ("hopmeter_chaos_seed", ["1.5"], "expected a whole number"),
        ("hopmeter_stream", ["all"], None),
        ("hopmeter_stream", ["all", "streams"], "given more than once; give it once"),
        ("hopmeter_hop", ["anything"], None),
        ("hopmeter_hop", [""], None),
        ("hopmeter_hop", [], "a value is required (hopmeter_hop=VALUE)"),
        ("hopmeter_chaos_seed", [], "a value is required (hopmeter_chaos_seed=VALUE)"),
    ],
)
def test_what_mitmproxy_could_not_convert(
    kind_of: str, given: list[str], problem: str | None
) -> None:
    """The conversion mitmproxy 12's optmanager makes of `--set` strings, and its refusals."""
    assert options.table.unconvertible(OPTIONS[kind_of], given) == problem
