"""What `hopmeter run` was asked: HOST:PORT and NAME=MODE values, mode specs, ports in use."""

from __future__ import annotations

import pytest

from hopmeter.argtypes import (
    parse_hostport,
)
from hopmeter.errors import UsageError
from hopmeter.proxy.run.config import ProxyConfig, listen_addresses, mode_listen_address


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
