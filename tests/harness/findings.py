"""Reading a record's findings in tests that run on a shared, possibly loaded host.

`proxy_hold` says this hop's own process held bytes. A test host busy with other tests can make
it true of any flow: the process waits for a core while a chunk sits between read and write. Its
evidence tells the two causes apart (hopmeter.core.detectors.detect_proxy_hold): hopmeter's own
steps used the CPU (`own_step_max_cpu_s` at or over the threshold), or the process was not
running: its loop's timers ran late (`loop_lag_max_s`) and the OS switched it out
(`involuntary_switches`). A test of what a stream looks like leaves out only the second kind;
a hold hopmeter's own work caused still fails it.
"""

from __future__ import annotations

from typing import Any

from hopmeter.core.detectors import THRESHOLDS
from hopmeter.core.vocab import FindingKind


def host_starved(finding: dict[str, Any]) -> bool:
    """Whether a finding is a `proxy_hold` the host's load explains, not hopmeter's own work."""
    if finding["kind"] != FindingKind.PROXY_HOLD:
        return False
    ev = finding["evidence"]
    own_cpu = ev.get("own_step_max_cpu_s") or 0.0
    if own_cpu >= THRESHOLDS["proxy_step_cpu_s"]:
        return False
    hold = ev.get("hold_max_s") or 0.0
    lagged = (ev.get("loop_lag_max_s") or 0.0) >= 0.5 * hold
    return lagged or (ev.get("involuntary_switches") or 0) > 0


def stream_kinds(rec: dict[str, Any]) -> list[str]:
    """The kinds of a record's findings, less a `proxy_hold` the host's load explains."""
    return [f["kind"] for f in rec["findings"] if not host_starved(f)]
