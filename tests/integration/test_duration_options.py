"""hopmeter's options set from the command line: mitmdump's --set and `hopmeter run`'s flags.

mitmproxy's --set cannot set a float option at all (mitmdump exits), so hopmeter_stall_threshold
and hopmeter_summary_interval are text read as seconds; both ways of setting them must work. A
bad value stops mitmdump in one line; the listeners `hopmeter_listeners` names open in mitmdump.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hopmeter.cli import addon_path
from tests.harness.procs import Proc, free_port, hopmeter, measuring, read_records, wait_for

pytestmark = pytest.mark.integration
STALLED = "tokens=12;rate=40;stall_at=6;stall_s=0.4"  # one 0.4 s gap: a stall only below 0.4 s


def _stall_threshold(port: int, records: Path) -> float:
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "gpt-4o", "stream": True},
        headers={"x-hopmeter-scenario": STALLED},
        timeout=30,
    )
    assert r.status_code == 200
    (rec,) = read_records(records, 1)
    (stall,) = [f for f in rec["findings"] if f["kind"] == "stall"]
    return float(stall["evidence"]["threshold_s"])


def _mitmdump(tmp: Path, *args: str) -> list[str]:
    """mitmdump with hopmeter's addons, metrics off, its CA under `tmp`, then `args`."""
    return [
        str(Path(sys.executable).with_name("mitmdump")),
        *("-s", str(addon_path())),
        *("--set", "hopmeter_metrics=off", "--set", f"confdir={tmp / 'mitm'}"),
        *args,
    ]


@contextlib.contextmanager
def _serving(tmp: Path, up: int, port: int, *args: str) -> Iterator[Path]:
    """hopmeter's demo upstream on `up` and `_mitmdump(args)` writing records, once `port`
    listens: the records file."""
    records = tmp / "records.jsonl"
    with hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", name="up", ports=(up,)):
        args = (*args, "--set", f"hopmeter_records={records}")
        proc = Proc(_mitmdump(tmp, *args), tmp / "mitmdump.log")
        try:
            proc.wait_port(port)
            yield records
        finally:
            proc.stop()


def test_mitmdump_set_takes_seconds_as_text(tmp_path: Path) -> None:
    """`mitmdump --set hopmeter_stall_threshold=300ms --set hopmeter_summary_interval=0` starts,
    and the stall is measured against 0.3 s."""
    up, port = free_port(), free_port()
    with _serving(
        tmp_path,
        up,
        port,
        *("--mode", f"reverse:http://127.0.0.1:{up}@127.0.0.1:{port}"),
        *("--set", "hopmeter_stall_threshold=300ms", "--set", "hopmeter_summary_interval=0"),
    ) as records:
        assert _stall_threshold(port, records) == pytest.approx(0.3)


def test_hopmeter_run_flag_sets_the_same_option(tmp_path: Path) -> None:
    """`hopmeter run --stall-threshold 0.3` measures the same stall against 0.3 s."""
    up = free_port()
    with (
        hopmeter(tmp_path, "upstream", "--listen", f"127.0.0.1:{up}", name="up", ports=(up,)),
        measuring(tmp_path, f"http://127.0.0.1:{up}", "--stall-threshold", "0.3") as proxy,
    ):
        assert _stall_threshold(proxy.port, proxy.records) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("hopmeter_stall_threshold=abc", "hopmeter_stall_threshold 'abc': expected a positive"),
        ("hopmeter_hop=a b", "hopmeter_hop: 'a b' is not a hop's name"),
    ],
)
def test_a_bad_option_in_mitmdump_is_one_line_and_mitmdump_exits(
    tmp_path: Path, setting: str, said: str
) -> None:
    """A value hopmeter refuses, given to plain mitmdump: mitmdump exits at start, and says the
    error in one line naming the option and the fix, not in a traceback."""
    out = subprocess.run(
        _mitmdump(tmp_path, "--listen-host", "127.0.0.1", "-p", str(free_port()), "--set", setting),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0
    (line,) = [x for x in text.splitlines() if "error in script" in x]
    assert said in line
    assert "Traceback" not in text and "OptionsError" not in text


def test_a_misspelled_option_in_mitmdump_is_named(tmp_path: Path) -> None:
    """`--set hopmeter_stall_treshold=1`: mitmdump keeps an option no addon declares and says
    nothing; hopmeter names it, and the option it likely meant, once it runs."""
    port = free_port()
    args = ("--listen-host", "127.0.0.1", "-p", str(port), "--set", "hopmeter_stall_treshold=1")
    proc = Proc(_mitmdump(tmp_path, *args), tmp_path / "mitmdump.log")
    try:
        proc.wait_port(port)
        said = "--set hopmeter_stall_treshold: no such option, not used; did you mean "
        wait_for(lambda: said in proc.output(), 30, "the misspelled option named")
    finally:
        proc.stop()
    assert "hopmeter_stall_threshold?" in proc.output()


def test_mitmdump_opens_the_listeners_hopmeter_listeners_names(tmp_path: Path) -> None:
    """`mitmdump -s ... --set hopmeter_listeners=edge=MODE` without `--mode`: the listener's
    mode opens (mitmdump loads the script after it opened its listeners; it would not have), its
    flows are recorded as hop `edge`, and mitmproxy's default listener is not left open."""
    up, port, default = free_port(), free_port(), free_port()
    with _serving(
        tmp_path,
        up,
        port,
        *("--listen-host", "127.0.0.1", "-p", str(default)),
        *("--set", f"hopmeter_listeners=edge=reverse:http://127.0.0.1:{up}@{port}"),
    ) as records:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "gpt-4o", "stream": True},
            timeout=30,
        )
        assert r.status_code == 200
        (rec,) = read_records(records, 1)
        assert (rec["hop"], rec["listener"]) == ("edge", "edge")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", default), timeout=2).close()
