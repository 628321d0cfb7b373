"""The lean master: the same options, commands and behaviour as mitmdump's, fewer addons per hook.

The differential cases run a real DumpMaster and a real LeanMaster in this process, each listening
on 127.0.0.1 in front of a real echo upstream, and send each one the same request with the same
`--set` options: what the client got, what the upstream saw and what was written must be equal.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import http.client
import json
import random
import re
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st
from mitmproxy import addonmanager, certs, exceptions, hooks, options, optmanager
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.test import taddons
from mitmproxy.tools.dump import DumpMaster

from hopmeter.proxy.run.master import (
    IMMUTABLE_VALUES,
    INERT_UNLESS_SET,
    LeanAddonManager,
    LeanMaster,
    LeanOptions,
    addon_name,
)

START_TIMEOUT_S = 20.0


class Echo(BaseHTTPRequestHandler):
    """Answers every request with what it received: method, path and headers, as JSON."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._echo()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self._echo(body)

    def _echo(self, body: bytes = b"") -> None:
        seen = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items() if k.lower() != "host"},
            "host": self.headers.get("host", "").split(":")[0],
            "body": body.decode(errors="replace"),
        }
        out = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("alt-svc", 'h3=":443"')
        self.send_header("set-cookie", "session=1; Path=/")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 free a moment ago. A UDP one comes from below the kernel's ephemeral
    range: a port the kernel picked for this bind it may hand to another process's outgoing
    datagram socket (a DNS lookup on the other test worker) before the listener binds it."""
    if kind != socket.SOCK_DGRAM:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 8192), low), 200):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free UDP port below the ephemeral range")


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mitmproxy CA for every case (its key takes a moment to make)."""
    path = tmp_path_factory.mktemp("mitm")
    certs.CertStore.from_store(path, "mitmproxy", 2048)
    return path


@pytest.fixture(scope="module")
def echo() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def tls_echo(confdir: Path) -> Iterator[int]:
    """The echo upstream behind TLS, with the test CA's certificate (clients do not verify)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(confdir / "mitmproxy-ca.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def make_master(kind: str) -> Any:
    """mitmdump's master ("dump") or `hopmeter run`'s (LeanMaster with LeanOptions)."""
    if kind == "dump":
        return DumpMaster(options.Options(), with_termlog=True, with_dumper=False)
    return LeanMaster(LeanOptions())


async def wait_listening(master: Any, task: asyncio.Task[None]) -> None:
    """Wait until every listener of `master` runs (TCP or UDP alike)."""
    servers = master.addons.get("proxyserver").servers
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while loop.time() < deadline:
        if task.done():
            task.result()
            raise AssertionError("the master stopped before listening")
        if len(servers) and all(s.is_running for s in servers) and not servers.is_updating:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the master's listeners did not start")


async def through(
    kind: str, mode: str, sets: list[str], ask: Any, later: list[str] | None = None
) -> Any:
    """Run a `kind` master listening with `mode`, `--set` each of `sets` (and `later` once it
    runs, as a script or the `set` command would); `ask()` in a thread."""
    master = make_master(kind)
    try:
        master.options.update(listen_host="127.0.0.1", mode=[mode], termlog_verbosity="error")
        master.options.set(*sets)
    except exceptions.OptionsError as exc:
        await master.done()
        return {"error": str(exc)}
    task = asyncio.create_task(master.run())
    try:
        await wait_listening(master, task)
        if later:
            master.options.set(*later)
        return await asyncio.to_thread(ask)
    finally:
        await closed(master)
        await master.addons.get("proxyserver").servers.update([])  # a process would exit here
        master.shutdown()
        await task


async def closed(master: Any) -> None:
    """Wait until the master's connections are closed (the client has closed its own)."""
    # a DNS "connection" (UDP) lasts until mitmproxy's idle timeout: nothing to wait for
    connections = master.addons.get("proxyserver").connections
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while loop.time() < deadline and any(
        c.client.transport_protocol == "tcp" for c in connections.values()
    ):
        await asyncio.sleep(0.01)


def http_request(port: int, headers: dict[str, str], tls: bool = False) -> dict[str, Any]:
    if tls:
        context = ssl._create_unverified_context()  # the test CA is not trusted
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=10, context=context
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/chat?x=1", body=b"hello", headers={"x-a": "1", **headers})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    try:
        seen: Any = json.loads(body)
    except ValueError:
        seen = body[:80].decode(errors="replace")
    return {
        "status": resp.status,
        "seen": seen,
        "alt-svc": resp.getheader("alt-svc"),
        "set-cookie": resp.getheader("set-cookie"),
    }


def files_in(folder: Path) -> list[tuple[str, int]]:
    """The files a case wrote, by suffix, with their HAR entries or whether they have content."""
    return sorted(
        (p.suffix, len(json.loads(p.read_text())["log"]["entries"]))
        if p.suffix == ".har"
        else (p.suffix, int(p.stat().st_size > 0))
        for p in folder.iterdir()
    )


SCRIPT = "def request(flow):\n    flow.request.headers['x-script'] = '1'\n"
BASIC = "Basic " + base64.b64encode(b"u:p").decode()
# (name, `--set` values, request headers): each option family a lean master could drop, and
# those it keeps (TLS, layers, connection handling), to show nothing else moved
CASES: list[tuple[str, list[str], dict[str, str]]] = [
    ("defaults", [], {}),
    ("modify_headers", ["modify_headers=/~q/x-added/yes"], {}),
    ("modify_body", ["modify_body=/~q/hello/HELLO"], {}),
    ("map_remote", ["map_remote=|/v1/|/v2/"], {}),
    ("map_local", ["map_local=|/v1/chat|DIR/local.txt"], {}),
    ("anticache", ["anticache=true"], {"if-none-match": "abc"}),
    ("anticomp", ["anticomp=true"], {"accept-encoding": "gzip, br"}),
    ("proxyauth without credentials", ["proxyauth=u:p"], {}),
    ("proxyauth with credentials", ["proxyauth=u:p"], {"authorization": BASIC}),
    ("upstream_auth", ["upstream_auth=a:b"], {}),
    ("block_list", ["block_list=:~q:418"], {}),
    ("keep_host_header", ["keep_host_header=true"], {"host": "client.example"}),
    ("keep_alt_svc_header", ["keep_alt_svc_header=true"], {}),
    ("stickycookie", ["stickycookie=.*"], {}),
    ("stickyauth", ["stickyauth=.*"], {"authorization": BASIC}),
    ("save_stream_file", ["save_stream_file=DIR/out.flows"], {}),
    ("hardump", ["hardump=DIR/out.har"], {}),
    ("scripts", ["scripts=DIR/script.py"], {}),
    ("server_replay_extra", ["server_replay_extra=404"], {}),
    ("ignore_hosts", ["ignore_hosts=.*"], {}),
    ("allow_hosts", ["allow_hosts=nomatch.example"], {}),
    ("stream_large_bodies", ["stream_large_bodies=1"], {}),
    ("body_size_limit", ["body_size_limit=3"], {}),
    ("connection_strategy", ["connection_strategy=eager"], {}),
    ("tcp_timeout", ["tcp_timeout=5"], {}),
    ("block_global", ["block_global=false"], {}),
    ("http2", ["http2=false"], {}),
    ("validate_inbound_headers", ["validate_inbound_headers=false"], {}),
    ("an option mistyped", ["modify_headerz=/~q/x/y"], {}),
]


def normalise(out: Any) -> str:
    """One case's outcome as text, without what differs between any two runs (ports, times)."""
    text = json.dumps(out, sort_keys=True)
    return re.sub(r"127\.0\.0\.1:\d+|:\d{4,5}\b|\d\d:\d\d:\d\d(\.\d+)?", "X", text)


def run_case(kind: str, sets: list[str], headers: dict[str, str], up: int, tmp: Path) -> Any:
    folder = tmp / kind
    folder.mkdir()
    (folder / "script.py").write_text(SCRIPT)
    (folder / "local.txt").write_text("from a local file")
    values = [s.replace("DIR", str(folder)) for s in sets]
    values.append(f"confdir={tmp.parent / 'conf'}")
    port = free_port()
    mode = f"reverse:http://127.0.0.1:{up}@127.0.0.1:{port}"
    # a second request without the case's headers: what sticky cookies and auth add to it
    ask = lambda: [http_request(port, headers), http_request(port, {})]  # noqa: E731
    out = asyncio.run(through(kind, mode, values, ask))
    return {"out": out, "files": files_in(folder)}


@pytest.mark.loopback
@pytest.mark.parametrize(("sets", "headers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_option_family_behaves_as_in_mitmdump(
    sets: list[str], headers: dict[str, str], echo: int, tmp_path: Path, confdir: Path
) -> None:
    """The same `--set` through mitmdump's master and the lean one gives the same answer, the
    same request upstream and the same files written."""
    (tmp_path / "conf").symlink_to(confdir)
    case = tmp_path / "case"
    case.mkdir()
    dump = run_case("dump", sets, headers, echo, case)
    lean = run_case("lean", sets, headers, echo, case)
    assert normalise(lean) == normalise(dump)
    assert "error" in dump["out"] or dump["out"][0]["status"] in (200, 401, 404, 413, 418, 502)


@pytest.mark.loopback
def test_tls_to_the_upstream_and_from_the_client_as_in_mitmdump(
    tls_echo: int, confdir: Path
) -> None:
    """A reverse proxy to an HTTPS upstream, reached by a TLS client: both masters answer the
    same, through the same TLS settings (ssl_insecure for the test CA)."""
    outs = []
    for kind in ("dump", "lean"):
        port = free_port()
        mode = f"reverse:https://127.0.0.1:{tls_echo}@127.0.0.1:{port}"
        sets = ["ssl_insecure=true", f"confdir={confdir}"]
        outs.append(
            asyncio.run(through(kind, mode, sets, functools.partial(http_request, port, {}, True)))
        )
    assert outs[0]["status"] == 200 and outs[0]["seen"]["body"] == "hello"
    assert normalise(outs[1]) == normalise(outs[0])


def dns_query(port: int, name: str) -> bytes:
    """One DNS A query for `name` over UDP; the answer's flags and records (its id left out)."""
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + question + b"\0\1\0\1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(10)
        s.sendto(packet, ("127.0.0.1", port))
        answer = s.recv(512)
    return answer[2:]


@pytest.mark.loopback
def test_a_dns_listener_answers_as_in_mitmdump(confdir: Path) -> None:
    """A DNS listener keeps the DNS resolver: `localhost` from the hosts file, the same answer
    through both masters."""
    outs = []
    for kind in ("dump", "lean"):
        port = free_port(socket.SOCK_DGRAM)
        sets = ["dns_use_hosts_file=true", f"confdir={confdir}"]
        mode = f"dns@127.0.0.1:{port}"
        outs.append(
            asyncio.run(through(kind, mode, sets, functools.partial(dns_query, port, "localhost")))
        )
    assert outs[0][1] & 0x0F == 0 and b"\x7f\x00\x00\x01" in outs[0]  # NOERROR, 127.0.0.1
    assert outs[1] == outs[0]


def test_every_option_and_command_of_mitmdump_exists() -> None:
    """The lean master registers every option (with its default) and every command mitmdump
    has, so `--set` and the `set` command accept and check the same names."""

    async def both() -> tuple[Any, Any]:
        dump, lean = make_master("dump"), make_master("lean")
        await dump.done()
        await lean.done()
        return dump, lean

    dump, lean = asyncio.run(both())
    dump_keys, lean_keys = dump.options.keys(), lean.options.keys()  # Options: no iteration
    assert {k: dump.options.default(k) for k in dump_keys} == {
        k: lean.options.default(k) for k in lean_keys
    }
    assert set(dump.commands.commands) == set(lean.commands.commands)
    assert [addon_name(a) for a in dump.addons.chain] == [addon_name(a) for a in lean.addons.chain]
    assert set(vars(dump)) <= set(vars(lean)) | {"_legacy_log_events"}


@pytest.mark.loopback
def test_an_option_set_while_running_acts_as_in_mitmdump(echo: int, confdir: Path) -> None:
    """An addon skipped under the defaults acts again once its option is set while the proxy
    runs: the header modify_headers adds reaches the upstream through both masters."""
    outs = []
    for kind in ("dump", "lean"):
        port = free_port()
        mode = f"reverse:http://127.0.0.1:{echo}@127.0.0.1:{port}"
        later = ["modify_headers=/~q/x-later/yes"]
        sets = [f"confdir={confdir}"]
        outs.append(
            asyncio.run(through(kind, mode, sets, functools.partial(http_request, port, {}), later))
        )
    assert outs[0]["seen"]["headers"]["x-later"] == "yes"
    assert normalise(outs[1]) == normalise(outs[0])


def test_defaults_skip_the_inert_addons_and_their_options_bring_them_back(
    tmp_path: Path,
) -> None:
    """Under the defaults the lean master skips exactly the option-gated addons for per-flow
    hooks; one of its options set brings an addon back, and a script brings them all back."""

    async def skipped(sets: list[str]) -> list[str]:
        master = make_master("lean")
        master.options.update(mode=["reverse:http://127.0.0.1:9"])
        master.options.set(*sets)
        names = master.skipped()
        await master.done()
        return list(names)

    assert set(asyncio.run(skipped([]))) == set(INERT_UNLESS_SET)
    assert "proxyauth" not in asyncio.run(skipped(["proxyauth=u:p"]))
    assert "save" not in asyncio.run(skipped([f"save_stream_file={tmp_path / 'x.flows'}"]))
    (tmp_path / "none.flows").write_bytes(b"")
    replay = [f"server_replay={tmp_path / 'none.flows'}"]
    assert "serverplayback" not in asyncio.run(skipped(replay))
    (tmp_path / "s.py").write_text(SCRIPT)
    assert asyncio.run(skipped([f"scripts={tmp_path / 's.py'}"])) == []


def test_skipped_addons_get_the_lifecycle_hooks_only() -> None:
    """An addon the manager skips gets running and done but no per-flow hook, and gets the
    per-flow hooks again once the options change and it is no longer skipped."""
    log: list[str] = []

    class Gated(Recorder):
        def running(self) -> None:
            self.log.append(f"{self.name}.running")

        def done(self) -> None:
            self.log.append(f"{self.name}.done")

    async def go() -> None:
        with taddons.context() as tctx:
            manager = LeanAddonManager(tctx.master)
            gated, other = Gated("gated", log), Recorder("other", log)
            manager.add(gated, other)
            manager.skip = lambda addon: addon is gated and not tctx.options.showhost
            flow: Any = object()
            await manager.trigger_event(hooks.RunningHook())
            await manager.trigger_event(http_layer.HttpRequestHeadersHook(flow))
            tctx.options.update(showhost=True)  # the options' signal reaches every manager
            await manager.trigger_event(http_layer.HttpRequestHeadersHook(flow))
            await manager.trigger_event(hooks.DoneHook())
            tctx.master._legacy_log_events.uninstall()  # its loop closes with asyncio.run's

    asyncio.run(go())
    assert log == [
        "gated.running",
        "other.requestheaders",
        "gated.requestheaders",
        "other.requestheaders",
        "gated.done",
    ]


class Recorder:
    """An addon that writes each hook it gets into a shared log."""

    def __init__(self, name: str, log: list[str], *, halt: bool = False, fail: bool = False):
        self.name, self.log, self.halt, self.fail = name, log, halt, fail

    def requestheaders(self, flow: Any) -> None:
        self.log.append(f"{self.name}.requestheaders")
        if self.fail:
            raise ValueError("boom")
        if self.halt:
            raise exceptions.AddonHalt

    async def response(self, flow: Any) -> None:
        await asyncio.sleep(0)
        self.log.append(f"{self.name}.response")


class Parent:
    """An addon with sub-addons that change after loading (as the script loader's do)."""

    def __init__(self, log: list[str]) -> None:
        self.name = "parent"
        self.addons: list[Any] = []
        self.log = log

    def requestheaders(self, flow: Any) -> None:
        self.log.append("parent.requestheaders")


class WithModule:
    """An addon with a module imported under a hook's name (mitmproxy skips it)."""

    import json as response


def dispatch(manager_cls: type[addonmanager.AddonManager]) -> list[str]:
    log: list[str] = []

    async def go() -> None:
        with taddons.context() as tctx:
            manager = manager_cls(tctx.master)
            parent = Parent(log)
            manager.add(Recorder("a", log), WithModule(), parent, Recorder("b", log, fail=True))
            manager.add(Recorder("c", log, halt=True), Recorder("d", log))
            flow: Any = object()
            await manager.trigger_event(http_layer.HttpRequestHeadersHook(flow))
            parent.addons.append(Recorder("child", log))
            await manager.trigger_event(http_layer.HttpRequestHeadersHook(flow))
            await manager.trigger_event(http_layer.HttpResponseHook(flow))
            await manager.trigger_event(hooks.UpdateHook([]))
            tctx.master._legacy_log_events.uninstall()  # its loop closes with asyncio.run's

    asyncio.run(go())
    return log


def test_hooks_reach_the_same_addons_in_the_same_order() -> None:
    """Looked-up dispatch calls what mitmproxy's walk calls, in order: sync and async hooks,
    sub-addons added after the first call, a failing addon skipped, AddonHalt ending the chain."""
    assert dispatch(LeanAddonManager) == dispatch(addonmanager.AddonManager)
    assert dispatch(LeanAddonManager)[:5] == [
        "a.requestheaders",
        "parent.requestheaders",
        "b.requestheaders",
        "c.requestheaders",
        "a.requestheaders",
    ]


# A value of every kind the options hold, set where the default would not show it (None, a
# list, a changed bool and number), and the mutable kinds mitmproxy must still copy.
SETS = [
    "stream_large_bodies=1m",
    "keep_host_header=true",
    "tcp_timeout=7",
    "modify_headers=/~q/x/y",
    "allow_hosts=a.example",
]


def test_options_read_the_same_as_mitmproxys_without_copying_immutable_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every option of a full master reads equal through LeanOptions and mitmproxy's Options, set
    or not; reading a bool, number, string or None makes no copy (mitmproxy's read makes two), a
    list comes back as a copy the caller may change without changing the option."""

    async def both() -> tuple[Any, Any]:
        dump, lean = make_master("dump"), make_master("lean")
        for m in (dump, lean):
            m.options.set(*SETS)
            await m.done()
        return dump.options, lean.options

    plain, lean = asyncio.run(both())
    names = sorted(plain.keys())
    assert names == sorted(lean.keys()) and len(names) > 80
    assert {n: getattr(plain, n) for n in names} == {n: getattr(lean, n) for n in names}
    kinds = {type(getattr(lean, n)) for n in names}
    assert {bool, int, str, type(None), list} <= kinds  # every kind above was read
    copied: list[str] = []  # the options whose read made a deep copy
    real = optmanager.copy.deepcopy
    for name in names:
        monkeypatch.setattr(
            optmanager.copy, "deepcopy", lambda v, *a, n=name: copied.append(n) or real(v, *a)
        )
        getattr(lean, name)
    monkeypatch.setattr(optmanager.copy, "deepcopy", real)
    mutable = {n for n in names if type(getattr(plain, n)) not in IMMUTABLE_VALUES}
    assert mutable and set(copied) == mutable
    hosts = lean.allow_hosts
    hosts.append("b.example")
    assert lean.allow_hosts == ["a.example"] and hosts is not lean.allow_hosts
    with pytest.raises(AttributeError, match="No such option: nope"):
        lean.nope  # noqa: B018 - the read is the test


def test_reading_an_immutable_option_makes_no_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bool (as `store_streamed_bodies`, read by mitmproxy for every streamed chunk), a string
    or None costs no deep copy (mitmproxy's read makes two); a list still gets its two."""
    copies: list[Any] = []
    real = optmanager.copy.deepcopy
    monkeypatch.setattr(optmanager.copy, "deepcopy", lambda v, *a: copies.append(v) or real(v, *a))
    plain, lean = options.Options(), LeanOptions()
    assert plain.ssl_insecure is False and len(copies) == 2
    copies.clear()
    assert lean.ssl_insecure is False and lean.listen_port is None
    assert lean.confdir == plain.confdir  # the plain read's two copies are counted too
    assert lean.mode == ["regular"]
    assert len(copies) == 4  # the plain confdir's two and the list's (`mode`) two


# Options the property test below changes: a bool, an int, an optional int and a string
_CHANGED = ("ssl_insecure", "tcp_timeout", "listen_port", "listen_host")
_VALUES: dict[str, Any] = {
    "ssl_insecure": st.booleans(),
    "tcp_timeout": st.integers(0, 10**6),
    "listen_port": st.none() | st.integers(1, 65535),
    "listen_host": st.text("ab.1", max_size=4),
}
_OPS = st.one_of(
    st.tuples(st.just("update"), st.sampled_from(_CHANGED)).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(t[1]), _VALUES[t[1]])
    ),
    st.tuples(st.just("refused"), st.sampled_from(_CHANGED)).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(t[1]), _VALUES[t[1]])
    ),
    st.tuples(st.just("reset"), st.none(), st.none()),
    st.tuples(st.just("add"), st.sampled_from(("extra_a", "extra_b")), st.booleans()),
    st.tuples(st.just("read"), st.none(), st.none()),
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(ops=st.lists(_OPS, max_size=12))
def test_kept_option_values_read_as_mitmproxys_after_any_change(
    ops: list[tuple[str, Any, Any]],
) -> None:
    """LeanOptions keeps an immutable value once read: after every update, refused update (rolled
    back), reset or added option, and inside the `changed` receivers and subscribers that run
    while one is applied, every option reads what mitmproxy's own Options reads."""
    plain, lean = options.Options(), LeanOptions()
    seen: dict[int, list[Any]] = {id(plain): [], id(lean): []}
    keep = []  # the receivers, referenced here (the signals hold them weakly)
    for opts in (plain, lean):

        def receiver(updated: set[str], opts: Any = opts) -> None:
            names = sorted(opts.keys())
            seen[id(opts)].append(("changed", [getattr(opts, n) for n in names]))
            if opts.__dict__.get("refuse"):
                raise exceptions.OptionsError("refused")

        def subscriber(o: Any, updated: set[str]) -> None:
            seen[id(o)].append(("subscribed", [getattr(o, n) for n in _CHANGED]))

        keep += [receiver, subscriber]
        opts.changed.connect(receiver)
        opts.subscribe(subscriber, list(_CHANGED))
    for op, name, value in ops:
        for opts in (plain, lean):
            if op == "update":
                opts.update(**{name: value})
            elif op == "refused":
                opts.__dict__["refuse"] = True
                with pytest.raises(exceptions.OptionsError):
                    opts.update(**{name: value})
                opts.__dict__["refuse"] = False
            elif op == "reset":
                opts.reset()
            elif op == "add":
                opts.add_option(name, bool, value, "a later option")
            names = sorted(opts.keys())
            seen[id(opts)].append(("after", [getattr(opts, n) for n in names]))
    assert seen[id(lean)] == seen[id(plain)]
    names = sorted(plain.keys())
    assert [getattr(lean, n) for n in names] == [getattr(plain, n) for n in names]
