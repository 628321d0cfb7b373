"""What the measuring addon's options mean (hopmeter.proxy.addon.meter.HopMeter.configure), read
and checked once, when mitmproxy configures it. A bad value is one line naming the option and
the fix (a UsageError, which `configure` hands to mitmproxy as its OptionsError).

The options themselves are declared with the others, in hopmeter.proxy.options.declared.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from typing import Any

from mitmproxy import hooks

from hopmeter.argtypes import hop_name as named_hop
from hopmeter.argtypes import parse_listener
from hopmeter.errors import HopmeterError, UsageError
from hopmeter.log import get_logger
from hopmeter.proxy.addon.chaos import parse_actions

log = get_logger()


def hop_name(value: str) -> str:
    """hopmeter_hop: the vantage point's name, never empty (every record and series names it)."""
    if not value.strip():
        raise UsageError(
            "hopmeter_hop must not be empty: name this vantage point (--hop edge), or leave it "
            "out for the default"
        )
    return named_hop(value, "hopmeter_hop")


def parse_listeners(pairs: Sequence[str]) -> dict[str, str]:
    """Map each listener's mode spec to its name, from NAME=MODE pairs (`hopmeter_listeners`)."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, mode = parse_listener(pair, "hopmeter_listeners")
        out[mode] = name
    return out


def listener_modes(modes: Sequence[str], listeners: dict[str, str]) -> list[str] | None:
    """mitmproxy's `mode` with each listener's mode spec added, or None when it has them all
    (a lone "regular", mitmproxy's default, gives way to the listeners)."""
    wanted = [m for m in listeners if m not in modes]
    if not wanted:
        return None
    kept = [] if list(modes) == ["regular"] else list(modes)
    return [*kept, *wanted]


def serve_mode(master: Any) -> None:
    """Have mitmproxy's proxy server open the listeners `mode` names now.

    mitmdump loads a `-s` script once its loop runs, after its proxy server read `mode` and
    opened its listeners; it opens a changed `mode` only once it runs. The listeners' modes the
    addon added to `mode` (`hopmeter_listeners`) would never open, and mitmproxy's default
    listener would stay: at `running`, the server is told `mode` changed, as when it changes
    later (an unchanged one opens nothing new)."""
    server = master.addons.get("proxyserver")
    if server is not None:
        master.addons.invoke_addon_sync(server, hooks.ConfigureHook({"mode"}))


def unknown_options(opts: Any) -> list[str]:
    """A line for each `hopmeter_*` option given (`--set`) that no addon declares, with the
    nearest known name: plain mitmproxy keeps an unknown option for a script that may declare
    it later, and says nothing (`hopmeter run` refuses it at start)."""
    known = [name for name in opts.keys() if name.startswith("hopmeter_")]  # noqa: SIM118 (no __iter__)
    out = []
    for name in sorted(getattr(opts, "deferred", None) or ()):
        if name.startswith("hopmeter_"):
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            out.append(f"hopmeter: --set {name}: no such option, not used{hint} (docs/cli.md)")
    return out


def pairing_hops(opts: Any, listeners: dict[str, str]) -> frozenset[str]:
    """The hops whose flows pair by reply content where a trace id is lost: those of the
    listeners (this hop's name for a mode no listener names), none without content pairing."""
    if not opts.hopmeter_content_pairing:
        return frozenset()
    return frozenset(listeners.get(m, opts.hopmeter_hop) for m in opts.mode)


def fingerprint_key(var: str) -> bytes | None:
    """The fingerprint key from the environment variable `var` ("" = unkeyed)."""
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise UsageError(
            f"hopmeter_fingerprint_key_env: the environment variable {var} is not set or empty; "
            "set it to the secret every host shares, or leave the option empty"
        )
    return value.encode()


def chaos_actions(text: str) -> tuple[str, ...]:
    """The chaos actions `hopmeter_chaos` names, said loudly when there are any."""
    try:
        actions = parse_actions(text)
    except HopmeterError as exc:
        raise UsageError(f"hopmeter_chaos: {exc}") from None
    if actions:
        log.warning(
            "hopmeter: CHAOS is on: responses are re-cut on the way to clients",
            actions=",".join(actions),
        )
    return actions
