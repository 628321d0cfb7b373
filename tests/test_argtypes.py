"""Tests for hopmeter.argtypes: the values every command and option shares, parsed once."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator

import pytest

from hopmeter.argtypes import (
    check_port_free,
    parse_bytes,
    parse_hostport,
    parse_listener,
    parse_seconds,
    positive_int,
    positive_seconds,
    seconds,
)
from hopmeter.errors import PortError, UsageError


@pytest.mark.parametrize(("text", "n"), [("1", 1), ("32", 32), (" 7 ", 7)])
def test_positive_int_reads_whole_numbers(text: str, n: int) -> None:
    """Whole numbers of 1 or more pass, surrounding spaces allowed."""
    assert positive_int(text) == n


@pytest.mark.parametrize(
    ("text", "why"), [("0", "1 or more"), ("-3", "1 or more"), ("2.5", "whole")]
)
def test_positive_int_refuses_the_rest(text: str, why: str) -> None:
    """Zero, negatives and fractions are refused, saying which rule they broke."""
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        positive_int(text)


def test_seconds_allow_zero_and_positive_seconds_do_not() -> None:
    """`seconds` takes 0 (a switch off), `positive_seconds` needs more than 0."""
    assert seconds("0") == 0.0 and seconds("1.5") == 1.5
    assert positive_seconds("0.25") == 0.25
    with pytest.raises(argparse.ArgumentTypeError, match="above 0"):
        positive_seconds("0")


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "soon", "", "-1"])
def test_seconds_refuse_what_is_not_a_finite_duration(text: str) -> None:
    """Infinity, NaN, words and negative numbers are not durations."""
    for parse in (seconds, positive_seconds):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a test socket is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
        ("localhost:0", ("localhost", 0)),
        ("8081", ("127.0.0.1", 8081)),
        (":8082", ("127.0.0.1", 8082)),
        ("[::1]:8083", ("::1", 8083)),
        ("::1:8084", ("::1", 8084)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
    ],
)
def test_hostport_values_parse(value: str, expected: tuple[str, int]) -> None:
    """HOST:PORT gives the pair; a port alone means loopback; IPv6 brackets are dropped."""
    assert parse_hostport(value, "--listen") == expected


@pytest.mark.parametrize("value", ["nowhere", "host:port", "127.0.0.1:65536", "h:-1", "h:", ""])
def test_a_bad_hostport_names_the_flag_and_an_example(value: str) -> None:
    """A value that is not HOST:PORT with a port in 0..65535 is one error naming the flag."""
    with pytest.raises(UsageError) as caught:
        parse_hostport(value, "--metrics")
    assert str(caught.value) == f"--metrics {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080"


def test_a_listener_is_a_name_and_a_mode() -> None:
    """NAME=MODE splits at the first "=": a mode may carry "=" of its own (a query string)."""
    assert parse_listener("edge=reverse:http://127.0.0.1:9000@8081", "--listener") == (
        "edge",
        "reverse:http://127.0.0.1:9000@8081",
    )
    assert parse_listener("o=reverse:http://h/?a=b@1", "--listener") == (
        "o",
        "reverse:http://h/?a=b@1",
    )


@pytest.mark.parametrize("pair", ["edge", "=reverse:http://h@1", "edge=", ""])
def test_a_listener_without_name_or_mode_is_refused(pair: str) -> None:
    """A listener missing its name, its "=" or its mode is refused with an example."""
    with pytest.raises(UsageError, match=r"--listener .*: expected NAME=MODE, e\.g\. edge="):
        parse_listener(pair, "--listener")


@pytest.mark.loopback
def test_a_port_in_use_is_named_with_the_fix(held_port: int) -> None:
    """A port something listens on fails early, naming what it was for, the address and the fix."""
    with pytest.raises(PortError) as caught:
        check_port_free("127.0.0.1", held_port, "metrics address")
    assert str(caught.value) == (
        f"metrics address 127.0.0.1:{held_port} is already in use; stop what listens there or "
        f"pick another port"
    )


@pytest.mark.loopback
def test_a_free_port_and_port_zero_pass() -> None:
    """A port nothing holds passes, and port 0 (any free port) is not checked at all."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    check_port_free("127.0.0.1", free, "listen address")
    check_port_free("127.0.0.1", 0, "listen address")


@pytest.mark.loopback
def test_an_ipv6_port_in_use_is_named() -> None:
    """An IPv6 address is checked on an IPv6 socket."""
    try:
        sock = socket.socket(socket.AF_INET6)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with sock:
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PortError, match=rf"listen address ::1:{port} is already in use"):
            check_port_free("::1", port, "listen address")


@pytest.mark.loopback
def test_an_address_not_on_this_host_is_named_with_the_reason() -> None:
    """An address no interface has (TEST-NET-1) cannot be bound: the error says so."""
    with pytest.raises(PortError, match=r"^listen address 192\.0\.2\.1:8080 cannot be opened: "):
        check_port_free("192.0.2.1", 8080, "listen address")


# -- durations given as text -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.5", 0.5), ("2", 2.0), (" 1.5s ", 1.5), ("500ms", 0.5), ("750MS", 0.75)],
)
def test_durations_read_as_seconds(text: str, seconds: float) -> None:
    """A number of seconds, with or without `s`, or milliseconds with `ms`."""
    assert parse_seconds(text, "hopmeter_stall_threshold") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1", "", "soon", "nan", "inf", "1e999", "5 minutes"])
def test_bad_durations_name_the_option_and_an_example(text: str) -> None:
    """Zero, negative, non-finite or unreadable values are one error naming the option."""
    with pytest.raises(UsageError, match=r"^hopmeter_stall_threshold .*e\.g\. 0\.5 or 500ms$"):
        parse_seconds(text, "hopmeter_stall_threshold")


def test_zero_is_allowed_where_it_means_off() -> None:
    """A summary interval of 0 turns the summary off; negative is still refused."""
    assert parse_seconds("0", "hopmeter_summary_interval", zero_ok=True) == 0.0
    with pytest.raises(UsageError, match="0 or more seconds"):
        parse_seconds("-2", "hopmeter_summary_interval", zero_ok=True)


# -- sizes given as text -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64KiB", 65536), ("64k", 65536), ("8MiB", 8 << 20), (" 1 GB ", 1 << 30),
     ("1.5KiB", 1536)],
)  # fmt: skip
def test_sizes_read_as_bytes(text: str, size: int) -> None:
    """A number of bytes, or K, M, G (binary) with or without B or iB."""
    assert parse_bytes(text, "hopmeter_output_queue") == size


@pytest.mark.parametrize("text", ["0", "-1", "", "lots", "nan", "inf", "8 XiB", "0.5"])
def test_bad_sizes_name_the_option_and_an_example(text: str) -> None:
    """Zero, less than a byte, non-finite, unreadable or unknown units are one error naming the
    option."""
    with pytest.raises(UsageError, match=r"^hopmeter_output_queue .*e\.g\. 65536, 64KiB or 8MiB$"):
        parse_bytes(text, "hopmeter_output_queue")


@pytest.mark.parametrize(("text", "value"), [("0.5", 0.5), ("500ms", 0.5), ("2s", 2.0)])
def test_flags_and_options_read_durations_alike(text: str, value: float) -> None:
    """A flag's seconds and an option's seconds share one grammar: `--read-timeout 500ms`
    reads as `--set hopmeter_read_timeout=500ms` does."""
    assert seconds(text) == positive_seconds(text) == parse_seconds(text, "o") == value


@pytest.mark.parametrize("name", ["a b", 'edge"}{x', "edge>origin", "a~b", "é", "x" * 65, "bad!"])
def test_a_listener_whose_name_is_no_hop_name_is_refused(name: str) -> None:
    """A listener's name names every record and metric of its hop, and is a part of each
    segment's name (`edge>origin`): one that is not 1-64 letters, digits, `_.:-` is refused,
    naming it and with an example."""
    with pytest.raises(UsageError, match=r"is not a hop's name: 1 to 64 .* e\.g\. edge$"):
        parse_listener(f"{name}=reverse:http://127.0.0.1:9000@8081", "--listener")
