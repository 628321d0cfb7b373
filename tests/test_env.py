"""Tests for hopmeter.env: every `hopmeter run` flag also from HOPMETER_*, the flag winning."""

from __future__ import annotations

import argparse

import pytest

from hopmeter import cli, env


def parse(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    """Parse a whole hopmeter command line with `environ` as the environment."""
    return env.parse_args(cli.build_parser(), argv, environ)


def test_names_are_the_long_flags_upper_cased() -> None:
    """HOPMETER_ and the long flag with - as _; a positional by its name; hidden flags none."""
    (run,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    names = {b.name for b in env.bound(run.choices["run"])}
    assert {"HOPMETER_UPSTREAM", "HOPMETER_LISTEN", "HOPMETER_STALL_THRESHOLD"} <= names
    assert {"HOPMETER_CONNECT_TIMEOUT", "HOPMETER_READ_TIMEOUT", "HOPMETER_DRAIN_TIMEOUT"} <= names
    assert {"HOPMETER_LISTENER", "HOPMETER_SET", "HOPMETER_NO_TRACE_HEADER"} <= names
    assert "HOPMETER_WORKER_INDEX" not in names
    assert "HOPMETER_HELP" not in names


def test_values_come_from_the_environment_typed() -> None:
    """Variables arrive through the flag's own type: numbers, switches, repeatable lists, and
    durations as the text their option reads."""
    args = parse(
        ["run"],
        {
            "HOPMETER_UPSTREAM": "http://127.0.0.1:8000",
            "HOPMETER_STALL_THRESHOLD": "0.25",
            "HOPMETER_WORKERS": "2",
            "HOPMETER_QUIET": "yes",
            "HOPMETER_LOG_CONTENT": "0",
            "HOPMETER_LISTENER": "edge=reverse:http://a:1@8081 origin=reverse:http://b:2@8082",
            "HOPMETER_SET": "keep_host_header=true 'x=a b'",
        },
    )
    assert args.upstream == "http://127.0.0.1:8000"
    assert (args.stall_threshold, args.workers, args.quiet, args.log_content) == (
        "0.25",
        2,
        True,
        False,
    )
    assert args.listener == ["edge=reverse:http://a:1@8081", "origin=reverse:http://b:2@8082"]
    assert args.set_ == ["keep_host_header=true", "x=a b"]
    assert args.env_sources["stall_threshold"] == "HOPMETER_STALL_THRESHOLD"


def test_a_flag_wins_over_its_variable() -> None:
    """A flag on the command line beats the environment, also a default-looking one (0) and a
    repeatable one (its list replaces the environment's, it does not add to it)."""
    environ = {"HOPMETER_CHAOS_SEED": "7", "HOPMETER_SET": "a=1 b=2", "HOPMETER_HOP": "pod"}
    args = parse(["run", "--chaos-seed", "0", "--set", "c=3"], environ)
    assert (args.chaos_seed, args.set_, args.hop) == (0, ["c=3"], "pod")
    assert "chaos_seed" not in args.env_sources


def test_without_variables_the_defaults_stay() -> None:
    """No HOPMETER_* set: every flag keeps its default, and nothing came from the environment."""
    args = parse(["run"], {})
    assert (args.upstream, args.listen, args.listener, args.set_) == (
        None,
        "127.0.0.1:8080",
        [],
        [],
    )
    assert (args.connect_timeout, args.read_timeout, args.drain_timeout) == ("10", "600", "20")
    assert args.env_sources == {}


def test_other_commands_do_not_read_the_environment() -> None:
    """Only `run` is bound: `hopmeter upstream --listen` never takes the proxy's HOPMETER_LISTEN."""
    args = parse(["upstream"], {"HOPMETER_LISTEN": "0.0.0.0:1"})
    assert args.listen != "0.0.0.0:1"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HOPMETER_STALL_THRESHOLD", "fast", "HOPMETER_STALL_THRESHOLD='fast': 'fast' is not a"),
        ("HOPMETER_CONNECT_TIMEOUT", "0", "HOPMETER_CONNECT_TIMEOUT='0': '0' must be above 0"),
        ("HOPMETER_QUIET", "maybe", "HOPMETER_QUIET='maybe': expected 1/true/yes/on"),
        ("HOPMETER_SET", "'a b", 'HOPMETER_SET="\'a b": No closing quotation'),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    variable: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the flag's own type refuses exits 2 with one line that names the variable."""
    with pytest.raises(SystemExit) as exited:
        parse(["run"], {variable: value})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "hopmeter run --help" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HOPMETER_LISTEN", "nowhere", "HOPMETER_LISTEN 'nowhere': expected HOST:PORT"),
        ("HOPMETER_UPSTREAM", "ftp://x", "HOPMETER_UPSTREAM 'ftp://x': expected an http://"),
        ("HOPMETER_LISTENER", "edge", "HOPMETER_LISTENER 'edge': expected NAME=MODE"),
        ("HOPMETER_RECORDS", "/no/such/dir/r.jsonl", "HOPMETER_RECORDS /no/such/dir/r.jsonl:"),
    ],
)
def test_later_checks_name_the_variable_too(
    variable: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value that parses but cannot work (checked when the proxy is configured) is named by
    its variable in the one-line error."""
    from hopmeter.errors import UsageError
    from hopmeter.proxy.run.command import proxy_config

    args = parse(["run"], {variable: value})
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(")):
        proxy_config(args, args.upstream or "http://127.0.0.1:9")


def test_errors_from_deeper_checks_name_the_variable_not_the_flag() -> None:
    """A check that only knows the flag or the option (an output, the tokenizer, chaos) says
    the variable the value came from, in the one line the command prints."""
    args = parse(["run"], {"HOPMETER_RECORDS": "/tmp", "HOPMETER_CHAOS": "explode"})
    said = env.as_given("cannot write records to /tmp; pick a writable path with --records", args)
    assert said.endswith("pick a writable path with HOPMETER_RECORDS")
    assert env.as_given("hopmeter_chaos: unknown action", args) == "HOPMETER_CHAOS: unknown action"
    # a flag given on the command line is left as it is said
    given = parse(["run", "--records", "/tmp"], {})
    assert env.as_given("a path with --records", given) == "a path with --records"
    assert env.as_given("--records-dir and --records", args).startswith("--records-dir and")
    # a variable whose name starts another's is still said where its flag is
    both = parse(["run"], {"HOPMETER_LISTEN": "127.0.0.1:1", "HOPMETER_LISTENER": "e=regular"})
    said = env.as_given("--listen 127.0.0.1:1 and HOPMETER_LISTENER clash", both)
    assert said == "HOPMETER_LISTEN 127.0.0.1:1 and HOPMETER_LISTENER clash"


def test_help_shows_each_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """`hopmeter run --help` names the variable beside every flag."""
    with pytest.raises(SystemExit):
        parse(["run", "--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    for variable in ("HOPMETER_UPSTREAM", "HOPMETER_LISTEN", "HOPMETER_DRAIN_TIMEOUT"):
        assert f"[env: {variable}]" in text
    assert "HOPMETER_WORKER_INDEX" not in text
