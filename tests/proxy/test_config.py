"""What `hopmeter run` was asked: HOST:PORT and NAME=MODE values, mode specs, ports in use."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from hopmeter.errors import PortError, UsageError
from hopmeter.proxy.config import (
    ProxyConfig,
    check_port_free,
    listen_addresses,
    mode_listen_address,
    parse_bytes,
    parse_hostport,
    parse_listener,
    parse_seconds,
)


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


def test_a_port_in_use_is_named_with_the_fix(held_port: int) -> None:
    """A port something listens on fails early, naming what it was for, the address and the fix."""
    with pytest.raises(PortError) as caught:
        check_port_free("127.0.0.1", held_port, "metrics address")
    assert str(caught.value) == (
        f"metrics address 127.0.0.1:{held_port} is already in use; stop what listens there or "
        f"pick another port"
    )


def test_a_free_port_and_port_zero_pass() -> None:
    """A port nothing holds passes, and port 0 (any free port) is not checked at all."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    check_port_free("127.0.0.1", free, "listen address")
    check_port_free("127.0.0.1", 0, "listen address")


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


def test_an_address_not_on_this_host_is_named_with_the_reason() -> None:
    """An address no interface has (TEST-NET-1) cannot be bound: the error says so."""
    with pytest.raises(PortError, match=r"^listen address 192\.0\.2\.1:8080 cannot be opened: "):
        check_port_free("192.0.2.1", 8080, "listen address")


@pytest.mark.parametrize(
    ("mode", "address"),
    [
        ("reverse:http://127.0.0.1:9000@8081", ("127.0.0.1", 8081)),
        ("reverse:https://api.example@127.0.0.2:8082", ("127.0.0.2", 8082)),
        ("reverse:http://127.0.0.1:9000@::1:8083", ("::1", 8083)),
        ("regular", ("127.0.0.1", 8080)),  # mitmproxy's default port, on hopmeter's loopback
        ("socks5@1080", ("127.0.0.1", 1080)),
        ("local", None),  # local capture listens on no port
    ],
)
def test_a_modes_listen_address(mode: str, address: tuple[str, int] | None) -> None:
    """The address a mitmproxy mode spec listens on, loopback when the spec names no host."""
    assert mode_listen_address(mode) == address


def test_a_mode_mitmproxy_cannot_read_is_a_usage_error() -> None:
    """An unknown mode is one error naming it, with an example of a good one."""
    with pytest.raises(UsageError, match=r"^listener mode 'nonsense:x@1': .*; e\.g\. reverse:"):
        mode_listen_address("nonsense:x@1")


def test_listen_addresses_lists_every_port_in_order() -> None:
    """Every mode that listens on a port gives its address, in the order given."""
    modes = ["reverse:http://h@127.0.0.1:8082", "local", "reverse:http://h@8081"]
    assert listen_addresses(modes) == [("127.0.0.1", 8082), ("127.0.0.1", 8081)]


def test_the_default_metrics_endpoint_is_loopback() -> None:
    """Unless told otherwise, metrics listen on this host only."""
    host, _port = parse_hostport(ProxyConfig(modes=[]).metrics, "--metrics")
    assert host == "127.0.0.1"


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
