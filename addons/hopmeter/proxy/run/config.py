"""What `hopmeter run` was asked to do, and the checks on it that need no mitmproxy.

The values every command shares (HOST:PORT, NAME=MODE, durations, sizes) are parsed in
hopmeter.argtypes. mitmproxy is imported only to read a mode spec, and only when one is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hopmeter.errors import UsageError
from hopmeter.proxy.options import run_options


@dataclass(slots=True, kw_only=True)
class ProxyConfig:
    """What `hopmeter run` was asked to do, validated: where it listens and forwards (`modes`),
    the hopmeter_* options it sets (hopmeter.proxy.options.run_options, from the flags), and
    any other mitmproxy option, passed through (`--set NAME=VALUE`, applied last)."""

    modes: list[str]
    options: dict[str, Any] = field(default_factory=run_options)
    extra: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> str:
        """The metrics endpoint, HOST:PORT or off."""
        value: str = self.options["hopmeter_metrics"]
        return value


def mode_listen_address(mode: str) -> tuple[str, int] | None:
    """The address a mitmproxy mode spec listens on, when it names one."""
    # mitmproxy is heavy: only when a mode is read
    from hopmeter.proxy.fastpath.internals import ProxyMode  # noqa: PLC0415

    try:
        spec = ProxyMode.parse(mode)
    except ValueError as exc:
        raise UsageError(
            f"listener mode {mode!r}: {exc}; e.g. reverse:http://127.0.0.1:9000@8081"
        ) from None
    port = spec.listen_port()
    if port is None:
        return None
    return spec.listen_host("127.0.0.1"), port


def listen_addresses(modes: Sequence[str]) -> list[tuple[str, int]]:
    """Every address the given modes will listen on."""
    out = []
    for mode in modes:
        addr = mode_listen_address(mode)
        if addr is not None:
            out.append(addr)
    return out
