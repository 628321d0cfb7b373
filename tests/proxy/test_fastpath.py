"""Tests for hopmeter.proxy.fastpath: all three fast paths are installed or none, and a `hopmeter
run` told not to relay leaves mitmproxy's classes as they are."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from mitmproxy.proxy.layers.http._http1 import Http1Server
from mitmproxy.proxy.server import ConnectionHandler

from hopmeter.proxy import fastpath
from hopmeter.proxy.fastpath import connections, gate
from tests.harness.procs import HOPMETER, Proc, free_port, wait_for
from tests.harness.scripted import Exchange, ScriptedUpstream

PROBE = Path(__file__).with_name("fastpath_probe.py")
# `hopmeter` whose fast paths' gate was read against another h11 than the one installed
NEW_H11 = [
    sys.executable,
    "-c",
    "import sys; from hopmeter.proxy.fastpath import gate; gate.SUPPORTED['h11'] = ('0.99.',); "
    "from hopmeter.cli import main; sys.exit(main())",
]
MITMPROXY_OWN = {
    "server_event": "mitmproxy.proxy.server.ConnectionHandler.server_event",
    "drain_writers": "mitmproxy.proxy.server.ConnectionHandler.drain_writers",
    "send": "mitmproxy.proxy.layers.http._http1.Http1Server.send",
    "upstream_protocol": "StreamReaderProtocol",
}
# mitmproxy's connection bookkeeping, mended with the relay or without it (fastpath.mend)
MITMPROXY_BOOKKEEPING = {
    "handle_connection": "mitmproxy.proxy.server.ConnectionHandler.handle_connection",
    "get_connection": "mitmproxy.proxy.layers.http.HttpLayer.get_connection",
}
MENDED = {
    "handle_connection": "hopmeter.proxy.fastpath.connections.handle_connection",
    "get_connection": "hopmeter.proxy.fastpath.connections.make_get_connection.<locals>."
    "get_connection",
}


def _unexpected(where: str, exc: BaseException) -> None:
    raise AssertionError(f"a fault in {where}: {exc!r}")


def test_install_puts_all_three_in_front_and_uninstall_takes_them_away() -> None:
    """With the versions and code the gate knows, install() replaces mitmproxy's three methods;
    uninstall() gives each its own back."""
    own = (ConnectionHandler.server_event, ConnectionHandler.drain_writers, Http1Server.send)
    try:
        assert fastpath.install(_unexpected) is None
        assert fastpath.installed() == ["backpressure", "framing", "relay"]
        assert fastpath.mend(_unexpected) is None  # with the relay or without it
        assert fastpath.installed() == ["backpressure", "framing", "connections", "relay"]
        assert ConnectionHandler.handle_connection is connections.handle_connection
    finally:
        fastpath.uninstall()
    assert fastpath.installed() == []
    assert (
        ConnectionHandler.server_event,
        ConnectionHandler.drain_writers,
        Http1Server.send,
    ) == own


def test_a_version_the_gate_does_not_know_installs_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the gate finds a difference, install() and mend() change nothing and return its
    line."""
    monkeypatch.setitem(gate.SUPPORTED, "mitmproxy", ("99.",))
    try:
        why = fastpath.install(_unexpected)
        mend_why = fastpath.mend(_unexpected)
        assert fastpath.installed() == []
    finally:
        fastpath.uninstall()
    assert why is not None and "mitmproxy 12." in why and "(99)" in why
    assert mend_why == why


async def _stream(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream"})
    for n in range(3):
        await ex.chunk(b'data: {"choices": [{"delta": {"content": "%d"}}]}\n\n' % n)
    await ex.end()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("command", "args", "env", "relayed"),
    [
        (HOPMETER, (), {}, True),
        (HOPMETER, ("--set", "hopmeter_relay=false"), {}, False),
        (HOPMETER, (), {"HOPMETER_NO_RELAY": "1"}, False),
        (NEW_H11, (), {}, False),
    ],
    ids=["default", "option-false", "no-relay-variable", "h11-not-read"],
)
def test_hopmeter_run_without_the_relay_leaves_mitmproxys_path_alone(
    tmp_path: Path, command: list[str], args: tuple[str, ...], env: dict[str, str], relayed: bool
) -> None:
    """`hopmeter run` puts its methods in front of mitmproxy's and its protocol in front of an
    upstream's; with `--no-relay` (here from its variable), `--set hopmeter_relay=false` or an
    h11 the gate does not know, mitmproxy's methods on a stream's path and protocols are its own
    while a stream goes through. The mends of its connection bookkeeping stand with the relay
    or without it, unless the gate refuses. Only the gate's refusal is said (once) and counted
    as reason="version"."""
    probe, port, metrics = tmp_path / "probe.jsonl", free_port(), free_port()
    with ScriptedUpstream(_stream) as up:
        proxy = Proc(
            [
                *command,
                *("run", f"http://127.0.0.1:{up.port}", "--listen", f"127.0.0.1:{port}"),
                *("--metrics", f"127.0.0.1:{metrics}", "--set", f"scripts={PROBE}", *args),
            ],
            tmp_path / "hopmeter.log",
            {**env, "HOPMETER_TEST_PROBE": str(probe)},
        )
        try:
            proxy.wait_port(port)
            proxy.wait_port(metrics)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            r = httpx.post(url, json={"stream": True}, timeout=15)
            seen = json.loads(wait_for(lambda: probe.exists() and probe.read_text(), what="probe"))
            text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
        finally:
            proxy.stop()
    assert r.status_code == 200 and r.text.count("data: ") == 3
    gate_off = command is NEW_H11
    bookkeeping = MITMPROXY_BOOKKEEPING if gate_off else MENDED
    assert {k: seen.pop(k) for k in MENDED} == bookkeeping
    if relayed:
        assert all(seen[k] != v for k, v in MITMPROXY_OWN.items()), seen
        assert seen["upstream_protocol"] == "ReadShortcut"
    else:
        assert seen == MITMPROXY_OWN
    assert f'hopmeter_relay_declined_total{{reason="version"}} {float(gate_off)}' in text
    said = proxy.output().count("h11 0.16.0 is not a release they were read against (0.99)")
    assert said == (1 if gate_off else 0)
