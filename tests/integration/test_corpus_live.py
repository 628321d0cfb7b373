"""Every recorded provider stream, replayed through the running proxy, is recognised and counted."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.harness.corpus import CASES, CORPUS
from tests.harness.procs import demo_path, read_records

pytestmark = pytest.mark.integration


def test_corpus_replayed_through_proxy(tmp_path: Path) -> None:
    """Each transcript gets the right api and model; with usage, counted tokens match it exactly."""
    files = sorted(CASES)
    replay = [a for f in files for a in ("--replay", str(CORPUS / f))]
    upstream = ("--scenario", "rate=500;ttft_s=0", *replay)
    with (
        demo_path(tmp_path, "--quiet", upstream_args=upstream) as path,
        httpx.Client(base_url=path.url, timeout=30) as client,
    ):
        records = path.records
        recs = []
        for i, name in enumerate(files):
            case = CASES[name]
            stem = Path(name).stem
            r = client.post(
                case.model_path or case.path,
                json={"stream": True},
                headers={"x-hopmeter-scenario": f"replay={stem}", **case.request_headers},
            )
            assert r.status_code == 200, (name, r.text)
            assert r.content == (CORPUS / name).read_bytes(), name
            recs.append(read_records(records, i + 1)[i])
    failures = []
    for name, rec in zip(files, recs, strict=True):
        case = CASES[name]
        fig = rec["figures"]
        problems = []
        if rec["api"] != case.api:
            problems.append(f"api {rec['api']} != {case.api}")
        if not rec["model"]:
            problems.append("no model")
        if fig["tokens_counted_source"] not in ("stream", "tokenizer"):
            problems.append(f"per-event source {fig['tokens_counted_source']}")
        if case.output_total is not None:
            if fig["usage_tokens"] != case.output_total:
                problems.append(f"usage {fig['usage_tokens']} != {case.output_total}")
            elif fig["tokens_counted"] and fig["tokens"] + fig["tokens_hidden_reasoning"] != (
                case.output_total
            ):
                problems.append(
                    f"tokens {fig['tokens']} + hidden "
                    f"{fig['tokens_hidden_reasoning']} != {case.output_total}"
                )
            elif fig["tokens_counted"] and fig["tokens_source"] != "usage":
                problems.append(f"source {fig['tokens_source']}")
        if case.error and "truncated" not in [f["kind"] for f in rec["findings"]]:
            problems.append("error event not flagged")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}")
    assert not failures, "\n".join(failures)
