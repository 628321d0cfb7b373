"""Every setting of `hopmeter run` and of hopmeter's addons, each declared once, in the order
`hopmeter run --help` and docs/cli.md list them.

A new setting is one `Setting` here: its flag, its HOPMETER_* variable, its mitmproxy option
(declared by the addon named in `addon`), what `hopmeter run` sets it to and its row in
docs/cli.md all follow (`.venv/bin/python -m hopmeter.proxy.options.docs > docs/cli.md`). The
addon reads the option in its `configure` (`hopmeter.proxy.options.read` for a duration or a
size).

A long module on purpose: one row per setting, a few lines each, read top to bottom as
`hopmeter run --help` lists them; split, a setting would again be looked for in several places.
"""

from __future__ import annotations

from hopmeter.core.detectors import DEFAULT_STALL_THRESHOLD_S
from hopmeter.core.vocab import EventLoop
from hopmeter.proxy.options.setting import Kind, Setting

# The addons that declare options, by the key their `load` passes to options.declare.
MEASURING = "meter"  # hopmeter.proxy.addon.meter.HopMeter
PASSAGE = "passage"  # what HopMeter leaves of mitmproxy's features (hopmeter.proxy.addon.passage)
GUARD = "guard"  # hopmeter.proxy.addon.guard.UpstreamGuard
READINESS = "readiness"  # hopmeter.proxy.addon.readiness.Readiness
BROWSER = "browser"  # hopmeter.proxy.addon.browser_gate.BrowserGate (it declares them)
RECORDS = "records"  # hopmeter.proxy.addon.outputs.RecordsOutput
CONSOLE = "console"  # hopmeter.proxy.addon.outputs.ConsoleOutput
METRICS = "metrics"  # hopmeter.proxy.addon.outputs.MetricsOutput
OTEL = "otel"  # hopmeter.proxy.addon.outputs.OtelOutput
UI = "ui"  # hopmeter.proxy.addon.ui.HopView
QUEUES = "queues"  # hopmeter.proxy.addon.outlets.OutputQueues
RELAY = "relay"  # hopmeter.proxy.fastpath.relay.Relay (hopmeter run only)
DRAIN = "drain"  # hopmeter.proxy.run.drain.Drain (hopmeter run only)


SETTINGS = (
    Setting(
        flag="upstream",
        metavar="UPSTREAM_URL",
        default=None,
        default_doc="the built-in demo upstream",
        help="where to forward",
        more="(with `--listen`: mitmproxy's `mode` `reverse:UPSTREAM_URL@HOST:PORT`)",
    ),
    Setting(
        flag="--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:8080",
        help="where to listen for UPSTREAM_URL's clients",
    ),
    Setting(
        flag="--hop",
        option="hopmeter_hop",
        addon=MEASURING,
        metavar="NAME",
        default="proxy",
        help="this vantage point's name (1 to 64 letters, digits and `_` `.` `:` `-`)",
    ),
    Setting(
        flag="--listener",
        option="hopmeter_listeners",
        addon=MEASURING,
        kind=Kind.LIST,
        metavar="NAME=MODE",
        default=(),
        help="a named listener with any mitmproxy mode spec (repeatable); each MODE is also "
        "added to `mode`",
        more="(`reverse:URL@PORT`, `regular@PORT`, `transparent`, `local`); several listeners "
        "are several hops in one process",
    ),
    Setting(
        flag="--records",
        option="hopmeter_records",
        addon=RECORDS,
        metavar="PATH",
        help=(
            'append one JSON line per finished flow to this file ("-" = stdout; with it or '
            "/dev/stdout hopmeter run's log goes to stderr)"
        ),
    ),
    Setting(
        flag="--metrics",
        option="hopmeter_metrics",
        addon=METRICS,
        metavar="HOST:PORT|off",
        default="127.0.0.1:9464",
        help='the Prometheus endpoint (/metrics, /healthz, /readyz), or "off"',
    ),
    Setting(
        flag="--stall-threshold",
        option="hopmeter_stall_threshold",
        addon=MEASURING,
        kind=Kind.SECONDS,
        metavar="SECONDS",
        default=f"{DEFAULT_STALL_THRESHOLD_S:g}",
        help="a gap between tokens at or above this many seconds is a stall",
    ),
    Setting(
        flag="--tokenizer",
        option="hopmeter_tokenizer",
        addon=MEASURING,
        metavar="NAME|PATH",
        default_doc="chosen by model",
        help="a tiktoken encoding name (o200k_base, cl100k_base) or a .tiktoken or "
        "tokenizer.json file",
        more="; counts are tiktoken's: each vocabulary's rank table is built once per host into "
        "`$HOPMETER_CACHE_DIR` (else `~/.cache/hopmeter`) and mapped from there, shared by "
        "every hopmeter on the host",
    ),
    Setting(
        flag="--lazy-tokenizer",
        option="hopmeter_lazy_tokenizer",
        addon=MEASURING,
        kind=Kind.SWITCH,
        default=False,
        help="make the tokenizer when the first flow starts, in a thread, not at start-up (no "
        "longer saves memory: the default maps its table and idles as low); records of flows "
        "ending before it is ready are written once it is",
        more="(unchanged, in order; up to a minute late under steady traffic, as are the "
        "metrics made from them). Kept for compatibility",
    ),
    Setting(
        flag="--log-content",
        option="hopmeter_log_content",
        addon=MEASURING,
        kind=Kind.SWITCH,
        default=False,
        help="include the reply text in records (prompts, keys and cookies never)",
    ),
    Setting(
        flag="--otel-endpoint",
        option="hopmeter_otel_endpoint",
        addon=OTEL,
        metavar="URL",
        help="export one OpenTelemetry span per flow to this OTLP/HTTP endpoint (pip install "
        "'hopmeter[otel]')",
    ),
    Setting(
        flag="--otel-timeline",
        option="hopmeter_otel_timeline",
        addon=OTEL,
        kind=Kind.ON_OFF,
        default=True,
        help="carry each flow's token timeline in its span, what `hopmeter join` needs to pair "
        "hops from spans (off keeps spans small)",
    ),
    Setting(
        option="hopmeter_trace_header",
        addon=MEASURING,
        kind=Kind.SWITCH,
        default=True,
        help="forward a W3C traceparent naming this flow's span as the parent (the incoming "
        "trace id kept, a new one for a request that has none or a malformed one; tracestate "
        "untouched, but dropped with a malformed traceparent)",
    ),
    Setting(
        flag="--no-trace-header",
        kind=Kind.SWITCH,
        sets=("hopmeter_trace_header", False),
        help="do not add or rewrite traceparent (by default hopmeter forwards it with its own "
        "span as the parent, the incoming trace id kept)",
        more="; the only change hopmeter itself makes to a request",
    ),
    Setting(
        flag="--fingerprint-key-env",
        option="hopmeter_fingerprint_key_env",
        addon=MEASURING,
        metavar="VAR",
        default_doc="unkeyed",
        help="key the reply fingerprints in records with the secret in this environment "
        "variable (the same on every host whose records are joined)",
    ),
    Setting(
        option="hopmeter_content_pairing",
        addon=MEASURING,
        kind=Kind.SWITCH,
        default=True,
        help="with listeners of two or more hops, pair flows whose trace ids differ by their "
        "reply (a hop between them dropped traceparent); off for listeners of unrelated chains "
        "whose replies may be alike",
    ),
    Setting(
        flag="--no-content-pairing",
        kind=Kind.SWITCH,
        sets=("hopmeter_content_pairing", False),
        help="with listeners of several hops, pair flows by trace id only, never by reply (for "
        "listeners of unrelated chains whose replies may be alike)",
        more=": a test rig playing one script",
    ),
    Setting(
        flag="--browser",
        option="hopmeter_browser",
        addon=BROWSER,
        kind=Kind.SWITCH,
        default=False,
        help="browser measuring: serve the snippet at /_hopmeter/beacon.js, answer beacons at "
        "/_hopmeter/beacon (never forwarded), add the browser and screen lanes to records",
        more="([browser.md](browser.md))",
    ),
    Setting(
        flag="--chaos",
        option="hopmeter_chaos",
        addon=MEASURING,
        metavar="ACTIONS",
        help="staging only: a comma list of rechunk, split_utf8, crlf, cr applied to responses "
        "on the way to the client (measuring sees the original; crlf and cr only to bodies "
        "without Content-Length or Content-Encoding; the record's chaos lists what applied)",
    ),
    Setting(
        flag="--chaos-seed",
        option="hopmeter_chaos_seed",
        addon=MEASURING,
        kind=Kind.INT,
        metavar="N",
        default=0,
        help="seed for --chaos (0 = a new seed per flow)",
    ),
    Setting(
        flag="--workers",
        kind=Kind.COUNT,
        metavar="N",
        default=1,
        help="N proxy processes on the same ports (SO_REUSEPORT); worker i serves metrics on "
        "the --metrics port + i",
    ),
    Setting(
        flag="--worker-index",
        kind=Kind.INT,
        default=None,
        hidden=True,
        help="which of --workers this process is (set by the parent)",
    ),
    Setting(
        option="hopmeter_console",
        addon=CONSOLE,
        choices=("text", "json", "off"),  # hopmeter.export.console.MODES
        default="text",
        help='per-flow console output: "text" (a line per flow), "json" (an object per line on '
        'stdout) or "off"',
    ),
    Setting(
        flag="--quiet",
        kind=Kind.SWITCH,
        sets=("hopmeter_console", "off"),  # before --json: given both, it wins
        help="no per-flow console line (the summaries stay; --summary-interval 0 stops them)",
    ),
    Setting(
        flag="--json",
        kind=Kind.SWITCH,
        sets=("hopmeter_console", "json"),
        help="one JSON object per finished flow on stdout (the log then goes to stderr)",
    ),
    Setting(
        flag="--summary-interval",
        option="hopmeter_summary_interval",
        addon=CONSOLE,
        kind=Kind.SECONDS_OR_ZERO,
        metavar="SECONDS",
        default="60",
        help="seconds between compact console summaries, 0 for none",
    ),
    Setting(
        flag="--connect-timeout",
        option="hopmeter_connect_timeout",
        addon=GUARD,
        kind=Kind.SECONDS,
        metavar="SECONDS",
        default="10",
        help="seconds to connect to the upstream (TCP and TLS) before answering 504",
    ),
    Setting(
        flag="--read-timeout",
        option="hopmeter_read_timeout",
        addon=GUARD,
        kind=Kind.SECONDS,
        metavar="SECONDS",
        default="600",
        help="the longest upstream silence: no response headers in time is answered 504, a gap "
        "between chunks this long cuts the stream",
        more="; the default is the OpenAI and Anthropic SDKs' own timeout, enough for a "
        "reasoning model's long pauses",
    ),
    Setting(
        flag="--drain-timeout",
        option="hopmeter_drain_timeout",
        addon=DRAIN,
        kind=Kind.SECONDS_OR_ZERO,
        metavar="SECONDS",
        # 20 s: with Kubernetes' default terminationGracePeriodSeconds (30 s) and a 5 s preStop
        # sleep (the time endpoints take to stop sending traffic), 5 + 20 leaves 5 s to end the
        # rest, write their records and exit before the kubelet's SIGKILL
        # (deploy/kubernetes/sidecar.yaml)
        default="20",
        help="on SIGTERM, seconds the streams in flight get to finish before the proxy stops (a "
        "second signal stops at once)",
        more="; keep it below the pod's terminationGracePeriodSeconds ([deploying.md, As a "
        "sidecar](deploying.md#as-a-sidecar))",
    ),
    Setting(
        option="hopmeter_relay",
        addon=RELAY,
        kind=Kind.SWITCH,
        default=True,
        help="move streamed response bodies from upstream to client directly instead of "
        "through mitmproxy's layers: the same bytes and measurements at a fraction of the CPU. "
        "An HTTP/1 upstream in TLS or not, an HTTP/2 upstream in TLS; the client HTTP/1 or "
        "HTTP/2, in TLS or not (what it leaves to mitmproxy's layers is counted in "
        "hopmeter_relay_declined_total). Off: every "
        "read goes through them; false at start (`hopmeter run --no-relay`) leaves "
        "mitmproxy's path as mitmproxy made it (the mends of its connection bookkeeping "
        "stay)",
    ),
    Setting(
        flag="--no-relay",
        kind=Kind.SWITCH,
        sets=("hopmeter_relay", False),
        help="move every read through mitmproxy's own layers: the relay and the other fast "
        "paths past them (the same bytes at less CPU) are not installed; the mends of "
        "mitmproxy's connection bookkeeping are",
        more="([reliability.md](reliability.md) §8)",
    ),
    Setting(
        flag="--pid-file",
        metavar="PATH",
        help="write the process id here (with --workers, the parent's), for `kill -HUP` after a "
        "log rotation: SIGHUP (or USR1) reopens the --records file (deploy/logrotate/hopmeter)",
    ),
    Setting(
        flag="--verbose",
        kind=Kind.SWITCH,
        default=False,
        help="mitmproxy's own connection logs too",
    ),
    Setting(
        flag="--loop",
        choices=tuple(EventLoop),
        default=EventLoop.ASYNCIO,
        help="the event loop: asyncio, the standard library's (what mitmdump runs on), or uvloop "
        "(libuv's: ~2 MiB more RSS idle, and no less CPU per event in bench/cost.py)",
        more="; records, metrics and the delivery lane are the same on both",
    ),
    Setting(
        flag="--set",
        dest="set_",
        kind=Kind.LIST,
        metavar="NAME=VALUE",
        default=(),
        help="any mitmproxy option, passed through: every addon of mitmdump is loaded and acts "
        "as in mitmdump once its option is set; nothing is left out",
        more="(e.g. `--set keep_host_header=true`; those whose options keep their defaults skip "
        "the per-flow hooks they would do nothing in). hopmeter streams request bodies to time "
        "them, so options that rewrite a request in mitmproxy's `request` hook (`map_remote`, "
        "`map_local`, `anticache`, `anticomp`, `block_list`, a script's `request`) act after it "
        "has left, unless `--set hopmeter_buffer=FILTER` names the flow; `modify_body` acts in "
        "time (a body it matches is left to mitmproxy to buffer), as do `modify_headers`, "
        "`proxyauth` and a script's `requestheaders`",
    ),
    # -- options without a flag of their own (`--set NAME=VALUE`, or mitmdump's --set) --------
    Setting(
        option="hopmeter_failure_log_interval",
        addon=GUARD,
        kind=Kind.SECONDS,
        default="10",
        help="seconds between log lines about one cause of upstream failures",
    ),
    Setting(
        option="hopmeter_ready_interval",
        addon=READINESS,
        kind=Kind.SECONDS,
        default="2",
        help="seconds between the checks that each reverse upstream accepts connections (/readyz)",
    ),
    Setting(
        option="hopmeter_ready_timeout",
        addon=READINESS,
        kind=Kind.SECONDS,
        default="1",
        help="seconds a readiness check waits for the upstream's connection",
    ),
    Setting(
        option="hopmeter_output_queue",
        addon=QUEUES,
        kind=Kind.SIZE,
        default="8MiB",  # hopmeter.export.spool.DEFAULT_QUEUE_BYTES, and why
        help="bytes of lines each output (records, console, log) may hold while its file or "
        "reader is slow; past it lines are dropped and counted (e.g. 8MiB, 512KiB)",
    ),
    Setting(
        option="hopmeter_mark",
        addon=UI,
        kind=Kind.SWITCH,
        default=True,
        help="in mitmweb and the console, mark each measured LLM flow by its worst finding (red "
        "error, orange warning, blue info, green clean) and set its comment to hopmeter's "
        "verdict; a mark you set yourself is kept",
    ),
    Setting(
        option="hopmeter_stream",
        addon=PASSAGE,
        choices=("streams", "all"),  # hopmeter.proxy.addon.passage.STREAM_MODES
        default="streams",
        # hopmeter run is a proxy in production: every response streamed, no body kept (below)
        run="all",
        help="which bodies hopmeter streams when nothing else chose to: 'streams' (responses "
        "that are event streams, NDJSON or of unknown length; other responses and request bodies "
        "stay buffered as mitmproxy has them, so a script's request and response hooks act on "
        "them) or 'all' (every body: hopmeter run's default)",
    ),
    Setting(
        option="hopmeter_buffer",
        addon=PASSAGE,
        help="a mitmproxy flow filter: matching requests and responses are left to mitmproxy to "
        "buffer, so a script's request or response hook can edit them; measured whole, as "
        "mitmproxy delivers them. Bodies modify_body matches are always left buffered",
    ),
    Setting(
        option="hopmeter_keep_body",
        addon=PASSAGE,
        kind=Kind.SIZE_OR_ZERO,
        # 4 MiB holds any LLM reply (a 100k-token reply is ~0.5 MiB of SSE) and is what
        # mitmproxy's users set stream_large_bodies to for "large"
        default="4m",
        # hopmeter run: no UI to show bodies, nothing saved; `--set hopmeter_keep_body=4m --set
        # save_stream_file=PATH` saves them
        run="0",
        help="keep up to this much of each streamed body (e.g. 4m, 0 = nothing) and give it to "
        "mitmproxy as the response's content when the stream ends, for -w, export, replay and "
        "mitmweb; past it the kept part is what fits, and the record says so. hopmeter run: 0",
    ),
    Setting(
        option="hopmeter_keep_body_total",
        addon=PASSAGE,
        kind=Kind.SIZE_OR_ZERO,
        # bounds the copies of every stream open at once (~16 replies at their longest, or
        # thousands of usual ones): a burst of large downloads cannot grow the proxy without limit
        default="64m",
        help="the bound on the kept bodies of all streams open at once; past it a stream's copy "
        "keeps what fits (counted in hopmeter_bodies_clipped_total)",
    ),
)
