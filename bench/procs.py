"""Bench processes: the upstream, the four topologies, and what /proc says about them.

Pinning (2 cores): the load generator and the upstream share CPU 0; every proxy (nginx's master and
worker, mitmdump, hopmeter) is pinned to CPU 1, so a proxy never has more than one core's worth;
all of them run at nice -20 when allowed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))  # for tests.harness.nginx, the project's real-nginx harness

from tests.harness.nginx import NginxServer  # noqa: E402

PY = sys.executable
BIN = Path(PY).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 30.0
NICE = -20
# tests/harness/nginx.py allows 128 connections; 200 streams need 400 (client + upstream)
NGINX_CONNECTIONS = 4096


def cpu_sets() -> tuple[list[str], list[str], str]:
    """(generator command prefix, proxy command prefix, a sentence saying how they were pinned).

    The machine may be shared: the bench's processes run at nice -20 (when allowed), so that other
    work on the same core waits for them instead of preempting them mid-event.
    """
    cpus = sorted(os.sched_getaffinity(0))
    nice = ["nice", "-n", str(NICE)] if os.geteuid() == 0 else []
    prio = f", nice {NICE}" if nice else ""
    if len(cpus) < 2 or not shutil.which("taskset"):
        return nice, nice, f"not pinned ({len(cpus)} CPU available or no taskset){prio}"
    gen, proxy = cpus[0], cpus[1]
    return (
        ["taskset", "-c", str(gen), *nice],
        ["taskset", "-c", str(proxy), *nice],
        f"taskset: load generator and upstream on CPU {gen}, the proxy under test on CPU {proxy}"
        f"{prio}",
    )


@dataclass(slots=True)
class Layout:
    """Where the bench's processes run, and which load generator it uses: bench/upstream.py +
    bench/client.py, or the same in C (`loadgen`, bench/loadgen.c) where the Python one would
    take the cores it measures."""

    gen_pin: list[str]
    proxy_pin: list[str]
    pinning: str
    loadgen: Path | None = None

    def unpin(self) -> None:
        """Scale mode: every process may run on every CPU (N workers need N cores)."""
        nice = ["nice", "-n", str(NICE)] if os.geteuid() == 0 else []
        self.gen_pin, self.proxy_pin = nice, nice
        self.pinning = "not pinned: generator and proxy share every CPU" + (
            f", nice {NICE}" if nice else ""
        )

    def use_c_generator(self, logdir: Path) -> None:
        """Build bench/loadgen.c with the system C compiler; use it as upstream and client."""
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise SystemExit("bench: --scale needs a C compiler (cc) to build bench/loadgen.c")
        out = logdir / "loadgen"
        subprocess.run([cc, "-O2", "-o", str(out), str(BENCH / "loadgen.c"), "-lm"], check=True)
        self.loadgen = out


LAYOUT = Layout(*cpu_sets())


def client_command(args: list[str]) -> list[str]:
    """The load generator's client with `args` (bench/client.py's command line), pinned."""
    if LAYOUT.loadgen is not None:
        return [*LAYOUT.gen_pin, str(LAYOUT.loadgen), *args]
    return [*LAYOUT.gen_pin, PY, str(BENCH / "client.py"), *args]


def free_port(count: int = 1) -> int:
    """A port on 127.0.0.1 that is free, with the `count - 1` ports above it free as well."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count <= 65535 and all(_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} free consecutive ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_listening(port: int, proc: subprocess.Popen[Any] | None, log: Path | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace")[-2000:] if log else ""
            raise RuntimeError(f"exited with {proc.returncode} before listening:\n{text}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {START_TIMEOUT_S}s")


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGINT (mitmproxy shuts down cleanly on it), then SIGTERM, then SIGKILL."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


# -- /proc ---------------------------------------------------------------------------------------


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


def cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads), seconds."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return total / CLK_TCK


def wakeups(pids: list[int]) -> int:
    """Voluntary context switches of these processes' threads: each time one went to sleep (its
    event loop waiting for a socket or a timer) and was woken again. A wake-up costs the kernel
    and the loop more than a little Python does: this tells a proxy whose timers wake it more
    often apart from one that does more work per event."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                total += _status_value(
                    f"/proc/{pid}/task/{task}/status", "voluntary_ctxt_switches:"
                )
    return total


def machine_busy_s() -> float:
    """CPU seconds the machine spent in processes (and stolen by the host), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = fields
    # irq and softirq are left out: loopback traffic is processed there, most of it ours
    return (user + nice + system + steal) / CLK_TCK


def rss_kib(pids: list[int]) -> int:
    """VmRSS of these processes, KiB."""
    return sum(_status_value(f"/proc/{pid}/status", "VmRSS:") for pid in pids)


def _status_value(path: str, key: str) -> int:
    """The number after `key` in a /proc status file (0 when the process or thread is gone)."""
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


# -- the upstream --------------------------------------------------------------------------------


class Upstream:
    """bench/upstream.py (or loadgen's upstream) in its own process on the generator's CPU."""

    def __init__(self, logdir: Path) -> None:
        self.log = logdir / "upstream.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.h2_port = 0  # HTTP/2 over TLS (bench/upstream.py --h2-listen); 0 for loadgen's
        self.uvloop = False

    def __enter__(self) -> Upstream:
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    *LAYOUT.gen_pin,
                    *(
                        [str(LAYOUT.loadgen), "upstream"]
                        if LAYOUT.loadgen
                        else [PY, str(BENCH / "upstream.py")]
                    ),
                    *("--listen", "127.0.0.1:0"),
                    *(() if LAYOUT.loadgen else ("--h2-listen", "127.0.0.1:0")),
                ],
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline() or b"{}")
        if "port" not in ready:
            raise RuntimeError(f"upstream did not start: {self.log.read_text()}")
        self.port, self.uvloop = ready["port"], ready["uvloop"]
        self.h2_port = ready.get("h2_port", 0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop(self.proc)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


# -- topologies ----------------------------------------------------------------------------------


class Topology:
    """One way from the client to the upstream. `pids()` are the processes measured."""

    name = "?"
    label = "?"
    note = ""

    def __init__(self, upstream_port: int, logdir: Path) -> None:
        self.upstream_port = upstream_port
        self.logdir = logdir
        self.port = 0

    def available(self) -> str | None:
        """None when it can run here, else why not."""
        return None

    def start(self) -> None:
        self.port = self.upstream_port

    def stop(self) -> None:
        pass

    def pids(self) -> list[int]:
        return []

    def __enter__(self) -> Topology:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Direct(Topology):
    name, label = "direct", "direct (no proxy)"
    note = "client straight to the upstream: the floor of the harness itself"


class BenchNginx(NginxServer):
    """tests/harness/nginx.py's server with room for a few hundred streams."""

    def write_config(self, port: int) -> Path:
        path = super().write_config(port)
        text = path.read_text()
        path.write_text(
            text.replace("worker_connections 128;", f"worker_connections {NGINX_CONNECTIONS};")
        )
        return path


class Nginx(Topology):
    name, label = "nginx", "nginx (streaming)"
    note = (
        "nginx 'streaming' config from tests/harness/nginx.py, 1 worker, worker_connections raised"
    )

    def __init__(self, upstream_port: int, logdir: Path) -> None:
        super().__init__(upstream_port, logdir)
        self.server: BenchNginx | None = None

    def available(self) -> str | None:
        return None if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else "no nginx"

    def start(self) -> None:
        self.server = BenchNginx(self.upstream_port, "streaming", prefix=self.logdir).start()
        for pid in self.pids():
            if LAYOUT.proxy_pin[:1] == ["taskset"]:
                os.sched_setaffinity(pid, {int(LAYOUT.proxy_pin[2])})
            if "nice" in LAYOUT.proxy_pin:
                os.setpriority(os.PRIO_PROCESS, pid, NICE)
        self.port = self.server.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def pids(self) -> list[int]:
        proc = self.server._proc if self.server is not None else None
        return tree(proc.pid) if proc is not None else []


class Process(Topology):
    """A proxy that is one command line."""

    def __init__(self, upstream_port: int, logdir: Path) -> None:
        super().__init__(upstream_port, logdir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = logdir / f"{self.name}.log"
        self._log_file: IO[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The process's environment, when it differs from the harness's."""
        return None

    def start(self) -> None:
        self.port = free_port()
        self._log_file = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*LAYOUT.proxy_pin, *self.command()],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
        )
        wait_listening(self.port, self.proc, self.log)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def pids(self) -> list[int]:
        return tree(self.proc.pid) if self.proc is not None else []


class Mitmdump(Process):
    name, label = "mitmdump", "bare mitmproxy"
    note = "mitmdump -q -s bench/bare_addon.py: only sets flow.response.stream = True"

    scheme = "http"
    extra: tuple[str, ...] = ()

    def command(self) -> list[str]:
        mode = f"reverse:{self.scheme}://127.0.0.1:{self.upstream_port}@127.0.0.1:{self.port}"
        return [
            *(str(BIN / "mitmdump"), "-q", "-s", str(BENCH / "bare_addon.py"), "--mode", mode),
            *self.extra,
        ]


class MitmdumpH2(Mitmdump):
    """Bare mitmproxy in front of the HTTP/2 upstream (bench/upstream.py --h2-listen)."""

    name, label = "mitmdump-h2up", "bare mitmproxy, HTTP/2 upstream"
    note = "the same, to an HTTP/2-over-TLS upstream (its self-signed certificate unchecked)"
    scheme = "https"
    extra = ("--set", "ssl_insecure=true")


class Hopmeter(Process):
    name, label = "hopmeter", "hopmeter"
    note = (
        "hopmeter run: records to a file, Prometheus metrics served, detectors, per-flow "
        "console line (to a log file)"
    )
    extra: tuple[str, ...] = ()
    scheme = "http"
    metrics_ports = 1  # --workers N serves metrics on N consecutive ports

    def __init__(self, upstream_port: int, logdir: Path) -> None:
        super().__init__(upstream_port, logdir)
        self.records = logdir / f"{self.name}.records.jsonl"
        self.metrics_port = 0

    def command(self) -> list[str]:
        self.metrics_port = free_port(self.metrics_ports)
        return [
            str(BIN / "hopmeter"),
            "run",
            f"{self.scheme}://127.0.0.1:{self.upstream_port}",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--records",
            str(self.records),
            "--metrics",
            f"127.0.0.1:{self.metrics_port}",
            *self.extra,
        ]


class HopmeterWorkers(Hopmeter):
    name, label = "hopmeter-w2", "hopmeter --workers 2"
    note = "hopmeter run --workers 2: two processes on one listening port (SO_REUSEPORT)"
    extra = ("--workers", "2")
    metrics_ports = 2

    def available(self) -> str | None:
        helptext = subprocess.run(
            [str(BIN / "hopmeter"), "run", "--help"], capture_output=True, text=True, check=False
        ).stdout
        if "--workers" not in helptext:
            return "skipped: `hopmeter run` does not accept --workers yet"
        return None


class HopmeterNoRelay(Hopmeter):
    """hopmeter run with every read through mitmproxy's own layers: what the relay saves."""

    name, label = "hopmeter-norelay", "hopmeter --no-relay"
    note = "hopmeter run --no-relay: streamed HTTP/1 bodies through mitmproxy's layers"
    extra = ("--no-relay",)


class HopmeterUvloop(Hopmeter):
    """hopmeter run on libuv's event loop (the default is the standard library's, as bare
    mitmdump runs)."""

    name, label = "hopmeter-uvloop", "hopmeter --loop uvloop"
    note = "hopmeter run --loop uvloop (its extension module is ~2 MiB of RSS)"
    extra = ("--loop", "uvloop")


class HopmeterNoRelayUvloop(Hopmeter):
    """hopmeter run --no-relay on libuv's event loop: mitmproxy's own path, on uvloop."""

    name, label = "hopmeter-norelay-uvloop", "hopmeter --no-relay --loop uvloop"
    note = "hopmeter run --no-relay --loop uvloop"
    extra = ("--no-relay", "--loop", "uvloop")


class HopmeterH2(Hopmeter):
    """hopmeter run in front of the HTTP/2 upstream (bench/upstream.py --h2-listen)."""

    name, label = "hopmeter-h2up", "hopmeter, HTTP/2 upstream"
    note = "the same, to an HTTP/2-over-TLS upstream (its self-signed certificate unchecked)"
    scheme = "https"
    extra: tuple[str, ...] = ("--set", "ssl_insecure=true")


class HopmeterH2Uvloop(HopmeterH2):
    """hopmeter run in front of the HTTP/2 upstream on libuv's event loop."""

    name, label = "hopmeter-h2up-uvloop", "hopmeter --loop uvloop, HTTP/2 upstream"
    note = "the same as hopmeter-h2up, with --loop uvloop"
    extra = (*HopmeterH2.extra, "--loop", "uvloop")


class HopmeterBase(Hopmeter):
    """The same command from another checkout of hopmeter: before and after a change, one run."""

    name, label = "hopmeter-base", "hopmeter (base)"
    note = "hopmeter run from the checkout in $HOPMETER_BENCH_BASE (e.g. before a change)"

    def available(self) -> str | None:
        base = os.environ.get("HOPMETER_BENCH_BASE", "")
        # unset is not the current directory, which is a checkout when run from the repo root
        if not base or not (Path(base) / "addons" / "hopmeter").is_dir():
            return "skipped: set HOPMETER_BENCH_BASE to a hopmeter checkout to compare against"
        return None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "hopmeter.cli", *super().command()[1:]]

    def environment(self) -> dict[str, str]:
        base = Path(os.environ["HOPMETER_BENCH_BASE"]) / "addons"
        return {**os.environ, "PYTHONPATH": str(base)}


TOPOLOGIES: dict[str, type[Topology]] = {
    t.name: t for t in (Direct, Nginx, Mitmdump, Hopmeter, HopmeterWorkers, HopmeterBase)
}
# bench/cost.py's rows beside them (not in bench/run.py's default matrix)
COST_TOPOLOGIES: dict[str, type[Topology]] = {
    **TOPOLOGIES,
    **{
        t.name: t
        for t in (
            HopmeterNoRelay,
            HopmeterUvloop,
            HopmeterNoRelayUvloop,
            MitmdumpH2,
            HopmeterH2,
            HopmeterH2Uvloop,
        )
    },
}
