"""tests.harness.findings: which proxy_hold a loaded test host explains."""

from __future__ import annotations

from typing import Any

from tests.harness.findings import host_starved, stream_kinds


def _hold(**evidence: Any) -> dict[str, Any]:
    base = {"hold_max_s": 0.08, "own_step_max_cpu_s": 0.001, "loop_lag_max_s": 0.0}
    return {"kind": "proxy_hold", "evidence": {**base, **evidence}}


def test_a_hold_while_the_loop_lagged_or_the_process_was_switched_out_is_the_host_s() -> None:
    assert host_starved(_hold(loop_lag_max_s=0.07))
    assert host_starved(_hold(involuntary_switches=3))


def test_a_hold_from_hopmeter_s_own_cpu_or_with_no_sign_of_load_is_not() -> None:
    assert not host_starved(_hold(own_step_max_cpu_s=0.03, loop_lag_max_s=0.07))
    assert not host_starved(_hold(involuntary_switches=0))
    assert not host_starved(_hold(involuntary_switches=None))


def test_stream_kinds_leaves_out_only_the_host_s_holds() -> None:
    rec = {
        "findings": [
            _hold(loop_lag_max_s=0.07),
            {"kind": "burst_gaps", "evidence": {}},
            _hold(own_step_max_cpu_s=0.05),
        ]
    }
    assert stream_kinds(rec) == ["burst_gaps", "proxy_hold"]
