"""What `hopmeter run` was asked to do, and the checks on it that need no mitmproxy.

The values every command shares (HOST:PORT, NAME=MODE, durations, sizes) are parsed in
hopmeter.argtypes. mitmproxy is imported only to read a mode spec, and only when one is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hopmeter.errors import UsageError


@dataclass(slots=True, kw_only=True)
class ProxyConfig:
    """What `hopmeter run` was asked to do, validated."""

    modes: list[str]
    listener_names: list[str] = field(default_factory=list)  # NAME=MODE, as given
    hop: str = "proxy"
    records: str = ""
    metrics: str = "127.0.0.1:9464"
    stall_threshold_s: float = 0.5
    tokenizer: str = ""
    lazy_tokenizer: bool = False  # --lazy-tokenizer: the vocabulary loaded at the first flow
    log_content: bool = False
    trace_header: bool = True
    fingerprint_key_env: str = ""  # a variable's name, never the key
    content_pairing: bool = True  # with listeners of 2+ hops: pair lost traces by reply
    otel_endpoint: str = ""
    otel_timeline: bool = True
    chaos: str = ""
    chaos_seed: int = 0
    console: str = "text"  # "text" | "json" | "off"
    summary_interval_s: float = 60.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    drain_timeout_s: float = 20.0
    browser: bool = False  # --browser: serve the snippet, answer and join beacons
    relay: bool = True  # --no-relay: none of the fast paths (hopmeter.proxy.fastpath) installed
    extra: list[str] = field(default_factory=list)  # --set NAME=VALUE


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
