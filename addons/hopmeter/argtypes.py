"""The values every command and option shares, parsed once: whole numbers, durations, sizes,
HOST:PORT, NAME=MODE, and whether a port is free.

As argparse types (`positive_int`, `seconds`, `positive_seconds`) a bad value raises
`argparse.ArgumentTypeError`, which the command line turns into one line naming the flag and the
value (hopmeter.cli); environment variables go through the same types (hopmeter.env), so their
errors read the same. As option parsers (`parse_seconds`, `parse_bytes`, `parse_hostport`,
`parse_listener`) a bad value raises a UsageError naming the option and an example: the addons'
`configure` turns it into mitmproxy's OptionsError. A duration reads the same everywhere: `0.5`,
`0.5s` or `500ms` (`duration`).
"""

from __future__ import annotations

import argparse
import errno
import math
import re
import socket

from hopmeter.errors import PortError, UsageError


def positive_int(value: str) -> int:
    """A whole number, 1 or more."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be 1 or more")
    return n


def positive_seconds(value: str) -> float:
    """A finite number of seconds above 0."""
    f = _seconds(value)
    if not f > 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be above 0")
    return f


def seconds(value: str) -> float:
    """A finite number of seconds, 0 or more."""
    f = _seconds(value)
    if not f >= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be 0 or more seconds")
    return f


def _seconds(value: str) -> float:
    f = duration(value)
    if f is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    return f


def duration(value: str) -> float | None:
    """Seconds from `0.5`, `0.5s` or `500ms` (the one grammar of every duration), or None when
    the text is none (or not finite)."""
    text = value.strip().lower()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 0.001
    elif text.endswith("s"):
        text = text[:-1]
    try:
        seconds = float(text) * scale
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) else None


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
    seconds = duration(value)
    if seconds is None or seconds < 0 or (seconds == 0 and not zero_ok):
        least = "0 or more" if zero_ok else "a positive number of"
        raise UsageError(f"{option} {value!r}: expected {least} seconds, e.g. 0.5 or 500ms")
    return seconds


# Units a size option may carry (binary, as `ls -h` and Kubernetes' Ki/Mi read them).
BYTE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
              "mib": 1024**2, "g": 1024**3, "gb": 1024**3, "gib": 1024**3}  # fmt: skip


def parse_bytes(value: str, option: str, *, zero_ok: bool = False) -> int:
    """A size option's value in bytes: `65536`, `64KiB`, `8MiB`, `4m` (K, M and G are binary);
    0 where it means none (`zero_ok`); a clear error otherwise."""
    text = value.strip().lower().replace(" ", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = BYTE_UNITS.get(text[len(digits) :])
    try:
        size = float(digits) * unit if unit is not None else math.nan
    except ValueError:
        size = math.nan
    if not math.isfinite(size) or size < (0 if zero_ok else 1) or size != int(size):
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


# A hop's name is a label on every metric and a part of each segment's (`edge>origin`, `a~b`).
_HOP_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def hop_name(value: str, flag: str) -> str:
    """A vantage point's name (`--hop`, a listener's NAME); a clear error otherwise."""
    if not _HOP_NAME.fullmatch(value):
        raise UsageError(
            f"{flag}: {value!r} is not a hop's name: 1 to 64 letters, digits and '_' '.' ':' '-' "
            "(it names every record and metric of this vantage point), e.g. edge"
        )
    return value


def parse_listener(pair: str, flag: str) -> tuple[str, str]:
    """A listener's (name, mode spec) from NAME=MODE; a clear error otherwise."""
    name, sep, mode = pair.partition("=")
    if not sep or not name or not mode:
        raise UsageError(
            f"{flag} {pair!r}: expected NAME=MODE, e.g. edge=reverse:http://127.0.0.1:9000@8081"
        )
    return hop_name(name, f"{flag} {pair!r}"), mode
