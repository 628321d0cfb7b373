"""What `hopmeter run` was asked to do, and the checks on it that need no mitmproxy.

The command line and the addons both read NAME=MODE and HOST:PORT values; they are parsed here,
once. mitmproxy is imported only to read a mode spec, and only when one is read: every command
of the CLI imports this module, and `hopmeter report` has no use for mitmproxy.
"""

from __future__ import annotations

import errno
import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from hopmeter.errors import PortError, UsageError


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


def parse_hostport(value: str, flag: str) -> tuple[str, int]:
    """HOST:PORT (or PORT alone, on 127.0.0.1) as a pair; a clear error otherwise."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        host, port_s = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_s)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise UsageError(f"{flag} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080") from None
    return host, port


def parse_seconds(value: str, option: str, *, zero_ok: bool = False) -> float:
    """A duration option's value in seconds: `0.5`, `0.5s` or `500ms`; a clear error otherwise.

    The duration options are strings, not floats: mitmproxy's `--set`, its `set` command and its
    console editor cannot set a float option at all (mitmdump exits at start-up).
    """
    text = value.strip().lower()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 0.001
    elif text.endswith("s"):
        text = text[:-1]
    try:
        seconds = float(text) * scale
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        least = "0 or more" if zero_ok else "a positive number of"
        raise UsageError(f"{option} {value!r}: expected {least} seconds, e.g. 0.5 or 500ms")
    return seconds


# Units a size option may carry (binary, as `ls -h` and Kubernetes' Ki/Mi read them).
BYTE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
              "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3}  # fmt: skip


def parse_bytes(value: str, option: str) -> int:
    """A size option's value in bytes: `65536`, `64KiB`, `8MiB` (K, M and G are binary); a
    clear error otherwise."""
    text = value.strip().lower().replace(" ", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = BYTE_UNITS.get(text[len(digits) :])
    try:
        size = float(digits) * unit if unit is not None else math.nan
    except ValueError:
        size = math.nan
    if not math.isfinite(size) or size < 1:
        raise UsageError(f"{option} {value!r}: expected a size in bytes, e.g. 65536, 64KiB or 8MiB")
    return int(size)


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail early, with the fix, when a port is taken (mitmproxy would only log and exit)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortError(
                    f"{what} {host}:{port} is already in use; stop what listens there or pick "
                    f"another port"
                ) from None
            raise PortError(f"{what} {host}:{port} cannot be opened: {exc.strerror}") from None


def mode_listen_address(mode: str) -> tuple[str, int] | None:
    """The address a mitmproxy mode spec listens on, when it names one."""
    from mitmproxy.proxy.mode_specs import ProxyMode  # noqa: PLC0415 - mitmproxy is heavy

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


def parse_listener(pair: str, flag: str) -> tuple[str, str]:
    """A listener's (name, mode spec) from NAME=MODE; a clear error otherwise."""
    name, sep, mode = pair.partition("=")
    if not sep or not name or not mode:
        raise UsageError(
            f"{flag} {pair!r}: expected NAME=MODE, e.g. edge=reverse:http://127.0.0.1:9000@8081"
        )
    return name, mode


def listen_addresses(modes: Sequence[str]) -> list[tuple[str, int]]:
    """Every address the given modes will listen on."""
    out = []
    for mode in modes:
        addr = mode_listen_address(mode)
        if addr is not None:
            out.append(addr)
    return out
