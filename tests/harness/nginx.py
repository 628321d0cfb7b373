"""A real nginx in front of a loopback upstream, for integration tests.

    from tests.harness.nginx import NginxServer

    with NginxServer(upstream_port, "streaming", prefix=tmp_path) as nginx:
        httpx.get(nginx.url + "/v1/chat/completions")

nginx runs in the foreground (`daemon off`) with every path it writes (pid, error log, temp
directories) inside `prefix`, listens on 127.0.0.1 only, and is told to stop with SIGQUIT. The named
configurations in CONFIGS say what each does to an event stream, with the numbers measured on
nginx 1.22.1 (docs/nginx-holds.md has the experiment).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

NGINX = os.environ.get("HOPMETER_NGINX") or shutil.which("nginx") or "/usr/sbin/nginx"
START_TIMEOUT_S = 10.0  # nginx listens in ~10 ms here; generous for a loaded CI box
STOP_TIMEOUT_S = 5.0  # per signal: SIGQUIT (graceful), then SIGTERM (fast), then SIGKILL
PORT_ATTEMPTS = 5  # a port picked by binding :0 can be taken before nginx binds it
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


class NginxError(RuntimeError):
    """nginx would not start or its configuration is invalid; the message holds its error log."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NginxConfig:
    """One named way to proxy `location /` to the upstream, and what it does to an event stream."""

    name: str
    effect: str  # what a client sees of an SSE stream through it, with the measured evidence
    location: str  # directives inside `location /`, after proxy_pass
    http: str = ""  # directives at `http` level, e.g. a proxy_cache_path; {prefix} is expanded


# hopmeter's upstream (and any well-behaved SSE server) sends X-Accel-Buffering: no, and nginx
# honours it by streaming that response whatever proxy_buffering says (measured: 40 of 40 events
# forwarded one by one under each holding config below). A config meant to hold must ignore it.
_HOLD_DESPITE_HEADER = "proxy_ignore_headers X-Accel-Buffering;"

STREAMING = NginxConfig(
    name="streaming",
    effect=(
        "Streams: each event reaches the client as its own read ~0.1-0.3 ms after the upstream "
        "writes it (40 of 40 events; hold p50 0.2 ms, max 0.8 ms), for chunked, Content-Length "
        "and close-delimited upstreams alike. The recommended config for SSE. One way round it: "
        "an upstream that itself sends X-Accel-Buffering: yes turns buffering back on, which "
        "bursts a Content-Length body (2 reads of 4 KB, first event held 1.1 s)."
    ),
    location="""
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_cache off;
        gzip off;
        proxy_read_timeout 300s;
        chunked_transfer_encoding on;
    """,
)

GZIP_HOLD = NginxConfig(
    name="gzip_hold",
    effect=(
        "Whole body: gzip without a flush per buffer emits output only when zlib closes a "
        "deflate block (~16K symbols) or nginx fills a 4 KiB gzip buffer, and an SSE reply "
        "compresses 10-40x, so a realistic reply (300 OpenAI events, 52.5 KB -> 1.4 KB) arrives "
        "as one read after the upstream's last event, status line included: hold max 3.0 s on a "
        "3.0 s stream. Only incompressible payloads come out earlier, in ~25-33 KB compressed "
        "bursts. Needs a client that sends Accept-Encoding: gzip; one that does not gets the "
        "stream unheld."
    ),
    location=f"""
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering on;
        {_HOLD_DESPITE_HEADER}
        gzip on;
        gzip_types text/event-stream;
        gzip_proxied any;
        proxy_read_timeout 300s;
    """,
)

BUFFER_BURSTS = NginxConfig(
    name="buffer_bursts",
    effect=(
        "Bursts of one 4 KiB proxy buffer (~22 events of 175 B; 40 events -> 2 reads of 4.0 KB and "
        "3.0 KB, first event held 1.1 s) -- but only for a body nginx cannot delimit by chunks: "
        "an upstream answering this config's HTTP/1.0 request close-delimited (as h11-based "
        "servers do) or any upstream sending Content-Length. A chunked upstream streams through "
        "it per event: nginx 1.22 hands each parsed chunk on without waiting for a buffer to fill "
        "(proxy buffers of 1k or 64k change nothing). With Content-Length, 1k buffers give 1 KiB "
        "bursts and 64k buffers hold a 17.7 KB reply whole."
    ),
    location=f"""
        proxy_http_version 1.0;
        proxy_buffering on;
        {_HOLD_DESPITE_HEADER}
        proxy_buffer_size 4k;
        proxy_buffers 8 4k;
        gzip off;
        proxy_read_timeout 300s;
    """,
)

GZIP_BURSTS = NginxConfig(
    name="gzip_bursts",
    effect=(
        "Bursts from a chunked upstream: gzip with the smallest hash (gzip_hash 512 = zlib "
        "memLevel 1, a deflate block every ~127 symbols) and 256-byte output buffers releases "
        "compressed output one small buffer at a time. 300 OpenAI-shaped events at 100/s: 4 reads "
        "at 0.29, 1.19, 2.48 and 3.04 s (hopmeter's demo upstream); 9 reads of ~35-46 events, "
        "hold p50 0.33 s, max 0.66 s (a more repetitive payload). Burst size follows "
        "compressibility, so it is content-dependent."
    ),
    location=f"""
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering on;
        {_HOLD_DESPITE_HEADER}
        gzip on;
        gzip_types text/event-stream;
        gzip_proxied any;
        gzip_hash 512;
        gzip_buffers 64 256;
        proxy_read_timeout 300s;
    """,
)

CONFIGS: dict[str, NginxConfig] = {
    c.name: c for c in (STREAMING, GZIP_HOLD, BUFFER_BURSTS, GZIP_BURSTS)
}

_TEMPLATE = """\
# Written by tests/harness/nginx.py for one test run; every path lives under the prefix.
{user}worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 128; }}
http {{
    access_log {prefix}/access.log;
{temp_paths}
    default_type application/octet-stream;{http}
    upstream hopmeter_upstream {{
        server 127.0.0.1:{upstream_port};
        keepalive 8;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://hopmeter_upstream;
{location}
        }}
    }}
}}
"""


def render(config: NginxConfig, *, prefix: Path, port: int, upstream_port: int) -> str:
    """The nginx.conf text for `config` listening on 127.0.0.1:`port`."""
    temp_paths = "\n".join(f"    {kind}_temp_path {prefix}/{kind}_temp;" for kind in TEMP_DIRS)
    location = _indent(config.location, 12)
    # Workers of a root master drop to `nobody`, who cannot enter a 0700 pytest tmp dir and so
    # could not write proxy temp files; as root, keep the workers root (test processes only).
    user = "user root;\n" if os.geteuid() == 0 else ""
    http = _indent(config.http.replace("{prefix}", str(prefix)), 4)
    http = "\n" + http if http else ""
    return _TEMPLATE.format(
        user=user,
        prefix=prefix,
        temp_paths=temp_paths,
        port=port,
        upstream_port=upstream_port,
        location=location,
        http=http,
    )


def _indent(directives: str, spaces: int) -> str:
    lines = (line.strip() for line in directives.splitlines())
    return "\n".join(" " * spaces + line for line in lines if line)


def resolve(config: str | NginxConfig) -> NginxConfig:
    """A named configuration, or `config` itself."""
    if isinstance(config, NginxConfig):
        return config
    try:
        return CONFIGS[config]
    except KeyError:
        raise KeyError(f"no nginx config {config!r}; known: {', '.join(CONFIGS)}") from None


def available() -> bool:
    """True when the nginx binary exists and runs."""
    try:
        done = subprocess.run([NGINX, "-v"], check=False, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class NginxServer:
    """nginx proxying 127.0.0.1:`port` to 127.0.0.1:`upstream_port`; a context manager."""

    def __init__(
        self,
        upstream_port: int,
        config: str | NginxConfig = "streaming",
        *,
        prefix: Path | None = None,
        binary: str = NGINX,
    ) -> None:
        self.config = resolve(config)
        self.upstream_port = upstream_port
        self.binary = binary
        self.port = 0
        # A fresh directory per server, so two servers in one tmp dir never share a pid file or
        # temp files. Without `prefix` it is a system temp dir, removed on stop.
        self._own_prefix = prefix is None
        parent = Path(tempfile.gettempdir() if prefix is None else prefix).resolve()
        self.prefix = Path(tempfile.mkdtemp(prefix=f"nginx-{self.config.name}-", dir=parent))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The base URL clients use, http://127.0.0.1:PORT."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def conf_path(self) -> Path:
        """Where the rendered nginx.conf is written."""
        return self.prefix / "nginx.conf"

    def error_log(self) -> str:
        """nginx's error log and anything it printed, so far."""
        logs = (self.prefix / "error.log", self.prefix / "stderr.log")
        return "".join(p.read_text(errors="replace") for p in logs if p.exists())

    def write_config(self, port: int) -> Path:
        """Render the configuration for `port` into the prefix and return its path."""
        text = render(self.config, prefix=self.prefix, port=port, upstream_port=self.upstream_port)
        self.conf_path.write_text(text)
        return self.conf_path

    def check(self) -> str:
        """Run `nginx -t` on the configuration; its output, or NginxError if it is invalid."""
        self.write_config(self.port or _free_port())
        done = subprocess.run(self._args("-t"), check=False, capture_output=True, timeout=30)
        out = (done.stdout + done.stderr).decode(errors="replace")
        if done.returncode != 0:
            raise NginxError(f"nginx -t rejected {self.conf_path}:\n{out}")
        return out

    def start(self) -> Self:
        """Start nginx and wait until it listens, retrying when its port was taken meanwhile."""
        for _ in range(PORT_ATTEMPTS):
            self.port = _free_port()
            self.write_config(self.port)
            (self.prefix / "error.log").write_bytes(b"")
            with (self.prefix / "stderr.log").open("wb") as out:
                self._proc = subprocess.Popen(
                    self._args(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            if self._wait_ready():
                return self
            if "Address already in use" not in self.error_log():
                break
        raise NginxError(f"nginx did not start ({self.conf_path}):\n{self.error_log()}")

    def stop(self) -> int | None:
        """Stop nginx gracefully (SIGQUIT), harder if it lingers; its exit status."""
        proc, self._proc = self._proc, None
        status = None if proc is None else _terminate(proc)
        if self._own_prefix:
            shutil.rmtree(self.prefix, ignore_errors=True)
        return status

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _args(self, *extra: str) -> list[str]:
        prefix, conf, log = f"{self.prefix}/", str(self.conf_path), str(self.prefix / "error.log")
        return [self.binary, "-p", prefix, "-c", conf, "-e", log, *extra]

    def _wait_ready(self) -> bool:
        """Poll until nginx listens (True) or exits (False); no fixed sleeps."""
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return False
            # The master writes its pid file only after binding its listening socket: without
            # it, an accepting port may belong to someone else.
            if (self.prefix / "nginx.pid").exists() and _accepts(self.port):
                return True
            time.sleep(0.01)
        log = self.error_log()
        self.stop()
        raise NginxError(f"nginx did not listen within {START_TIMEOUT_S}s:\n{log}")


def _terminate(proc: subprocess.Popen[bytes]) -> int:
    """SIGQUIT (graceful), then SIGTERM (fast), then SIGKILL to the process group; exit status."""
    for sig in (signal.SIGQUIT, signal.SIGTERM):
        if proc.poll() is not None:
            return proc.returncode
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(STOP_TIMEOUT_S)
    # The master ignored both: kill it and its workers, which share its process group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(STOP_TIMEOUT_S)
