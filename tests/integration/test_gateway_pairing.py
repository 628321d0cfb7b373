"""Two listeners around a real LiteLLM gateway: flows paired by trace when it forwards
traceparent, by their reply's fingerprint when it does not (as shipped), never wrongly.

One hopmeter process per gateway: an edge listener in front of LiteLLM and an origin listener
between LiteLLM and a demo upstream that replays three transcripts. Each `reply-*` route of the
gateway plays one of them (a scenario header the gateway adds itself: as shipped it forwards no
client header). Two of the replies share their opening words and their length.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopmeter.core.fingerprint import fingerprint
from hopmeter.report.join import join
from tests.harness.litellm import VIA_REPLIES, Gateway
from tests.harness.procs import HOPMETER, free_port, hopmeter, wait_for

pytestmark = pytest.mark.integration

TAIL = " and that is what the stream carried from the model to the client, one word at a time."
REPLIES = {
    "alpha": "Alpha came first, with words of its own" + TAIL,
    "bravo": "The answer, after careful thought, is forty-two" + TAIL,
    "charlie": "The answer, after careful thought, is forty-one" + TAIL,
}
ROUTE_OF = {name.split("=", 1)[1].split(";")[0]: route for route, name in VIA_REPLIES.items()}
HOLD_TOLERANCE_S = 0.002  # the bound: holds and request delay within 2 ms


def transcript(text: str) -> bytes:
    """An OpenAI chat stream of `text`, one word per event, with a role prelude and [DONE]."""

    def event(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        doc = {"id": "chatcmpl-gw", "object": "chat.completion.chunk", "created": 1700000000}
        doc.update(model="demo-1", choices=[choice])  # type: ignore[arg-type]
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    words = text.split(" ")
    pieces = [event({"role": "assistant", "content": ""})]
    pieces += [event({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
    return b"".join([*pieces, event({}, "stop"), b"data: [DONE]\n\n"])


@dataclass
class Rig:
    """A gateway with hopmeter's two listeners around it and its records file."""

    gateway: Gateway
    edge_port: int
    metrics_port: int
    upstream_port: int
    records: Path

    def ask(self, route: str) -> dict[str, Any]:
        """Stream one reply through the edge; what the client saw and the trace id it sent."""
        trace_id = secrets.token_hex(16)
        headers = {
            **self.gateway.litellm.headers(),
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
            # dropped as shipped (the route adds its own); forwarded by the traced gateway
            "x-hopmeter-scenario": VIA_REPLIES[route],
        }
        body = {"model": route, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        url = f"http://127.0.0.1:{self.edge_port}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
            r.read()
            assert r.status_code == 200, r.text
            return {
                "trace_id": trace_id,
                "request_id": r.headers["llm_provider-x-hopmeter-request-id"],
                "body": r.content,
            }

    def ask_at_once(self, routes: Sequence[str]) -> list[dict[str, Any]]:
        """Every route asked at the same moment, each reply in flight with the others."""
        with ThreadPoolExecutor(len(routes)) as pool:
            return list(pool.map(self.ask, routes))

    def read(self) -> list[dict[str, Any]]:
        """Every record written so far."""
        if not self.records.exists():
            return []
        return [orjson.loads(ln) for ln in self.records.read_bytes().splitlines() if ln.strip()]

    def edge_records(self, asked: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The edge records of `asked`, in the same order, once all are written."""
        ids = [a["trace_id"] for a in asked]

        def written() -> list[dict[str, Any]] | None:
            found = {r["trace_id"]: r for r in self.read() if r["hop"] == "edge"}
            return [found[i] for i in ids] if all(i in found for i in ids) else None

        return wait_for(written, 60, f"edge records of {ids}")

    def by_flow(self) -> dict[str, dict[str, Any]]:
        """Every record by flow id."""
        return {r["flow_id"]: r for r in self.read()}

    def t_request(self, request_id: str) -> float:
        """When the upstream read the request (its send log)."""
        url = f"http://127.0.0.1:{self.upstream_port}/_hopmeter/sends/{request_id}"
        return float(httpx.get(url, timeout=10).json()["t_request"])


def _rig(tmp: Path, gateway: Gateway) -> Iterator[Rig]:
    up, edge, metrics = free_port(), free_port(), free_port()
    replays = []
    for name, text in REPLIES.items():
        path = tmp / f"{name}.sse"
        path.write_bytes(transcript(text))
        replays += ["--replay", str(path)]
    records = tmp / "records.jsonl"
    listeners = [
        *("--listener", f"edge=reverse:{gateway.url}@127.0.0.1:{edge}"),
        *("--listener", f"origin=reverse:http://127.0.0.1:{up}@127.0.0.1:{gateway.via_port}"),
    ]
    with (
        hopmeter(tmp, "upstream", "--listen", f"127.0.0.1:{up}", *replays, name="up", ports=(up,)),
        hopmeter(
            tmp,
            "run",
            *listeners,
            *("--records", str(records), "--metrics", f"127.0.0.1:{metrics}"),
            ports=(edge, gateway.via_port),
        ),
    ):
        gateway.litellm.warm_up(every=True)  # the reply routes' first requests are slow
        yield Rig(gateway, edge, metrics, up, records)


@pytest.fixture(scope="module")
def shipped(litellm_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """LiteLLM as shipped (traceparent dropped) between the edge and origin listeners."""
    yield from _rig(tmp_path_factory.mktemp("gw-shipped"), litellm_gateway)


@pytest.fixture(scope="module")
def traced(
    litellm_traced_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    """LiteLLM forwarding traceparent between the edge and origin listeners."""
    yield from _rig(tmp_path_factory.mktemp("gw-traced"), litellm_traced_gateway)


def _text_of(route: str) -> str:
    name = next(n for n, r in ROUTE_OF.items() if r == route)
    return REPLIES[name]


def _holds(seg: dict[str, Any]) -> list[float]:
    return [seg[k] for k in ("first_token_hold_s", "hold_p50_s", "hold_p99_s", "hold_max_s")]


def test_three_replies_at_once_pair_by_content_with_their_own_flows(shipped: Rig) -> None:
    """As shipped, the gateway drops traceparent: each of three replies in flight together (two
    alike until their sixth word) is paired by content with the origin flow that carried it,
    says trace_context_dropped, and its added time to first token is its request delay plus its
    first-token hold."""
    routes = list(VIA_REPLIES)
    asked = shipped.ask_at_once(routes)
    edges = shipped.edge_records(asked)
    flows = shipped.by_flow()
    for route, a, edge in zip(routes, asked, edges, strict=True):
        text = _text_of(route)
        assert text.encode() in b"".join(
            orjson.loads(ln[6:])["choices"][0]["delta"].get("content", "").encode()
            for ln in a["body"].split(b"\n\n")
            if ln.startswith(b"data: {")
        )
        (seg,) = edge["hops"]
        assert (seg["segment"], seg["paired_by"]) == ("edge>origin", "content")
        inner = flows[seg["inner_flow_id"]]
        assert inner["hop"] == "origin" and inner["trace_id"] != edge["trace_id"]
        want = fingerprint(text, len(text))
        assert want is not None
        assert edge["fingerprint"] == inner["fingerprint"] == want.as_dict()
        assert edge["pairing"]["match"] == inner["pairing"]["match"] == "unique"
        kinds = [f["kind"] for f in edge["findings"]]
        assert "trace_context_dropped" in kinds
        assert seg["added_ttft_s"] == pytest.approx(
            seg["request_delay_s"] + seg["first_token_hold_s"], abs=2e-6
        )
    assert len({e["hops"][0]["inner_flow_id"] for e in edges}) == 3


def test_the_request_delay_is_bracketed_by_what_the_upstream_saw(shipped: Rig) -> None:
    """Request by request (one clock): the upstream read the request no earlier than the origin
    listener saw it (the segment's request delay) and no later than its reply's headers reached
    that listener; the difference is the origin listener passing the request on, which the
    upstream's view includes (docs/gateways.md has the numbers)."""
    for _ in range(3):
        a = shipped.ask("reply-b")
        (edge,) = shipped.edge_records([a])
        seg = edge["hops"][0]
        inner = shipped.by_flow()[seg["inner_flow_id"]]
        t0 = edge["request"]["t_start"]
        upstream_delay = shipped.t_request(a["request_id"]) - t0
        assert seg["request_delay_s"] == pytest.approx(inner["request"]["t_start"] - t0, abs=2e-6)
        slack = 0.0005  # the records' microseconds, and two readings of one clock
        assert seg["request_delay_s"] - slack <= upstream_delay
        assert upstream_delay <= inner["response"]["t_headers"] - t0 + slack


# two replies asked at once may still run one after the other on a busy machine (the gateway
# took the second request late): what the test is about needs them in flight together
OVERLAP_ATTEMPTS = 3


def _overlapped(edges: Sequence[dict[str, Any]]) -> bool:
    """Whether the edge flows were in flight together: each began before the other's last byte."""
    return all(
        a["request"]["t_start"] < b["response"]["t_last_byte"]
        for a in edges
        for b in edges
        if a is not b
    )


def test_two_identical_replies_at_once_are_not_paired_but_counted(shipped: Rig) -> None:
    """The same reply twice in flight together: no hops, every flow ambiguous, and the metric
    counts them; never a pair on a guess."""
    for _ in range(OVERLAP_ATTEMPTS):
        asked = shipped.ask_at_once(["reply-a", "reply-a"])
        edges = shipped.edge_records(asked)
        if _overlapped(edges):
            break
    else:
        raise AssertionError("two replies asked at once never were in flight together")
    for edge in edges:
        assert "hops" not in edge
        assert edge["pairing"]["paired_by"] is None
        assert edge["pairing"]["match"] == "ambiguous" and edge["pairing"]["candidates"] >= 1
    # the first at the edge reached the origin after the second had started there too (the
    # second may reach the edge only after the first reached the origin: then it sees one)
    assert max(e["pairing"]["candidates"] for e in edges) == 2
    digest = edges[0]["fingerprint"]["digest"]
    t0 = min(e["request"]["t_start"] for e in edges)
    origins = [
        r
        for r in shipped.read()
        if r["hop"] == "origin"
        and r["request"]["t_start"] >= t0
        and (r.get("fingerprint") or {}).get("digest") == digest
    ]
    assert len(origins) == 2
    assert all(r["pairing"]["match"] == "ambiguous" and "hops" not in r for r in origins)
    text = httpx.get(f"http://127.0.0.1:{shipped.metrics_port}/metrics", timeout=10).text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith('hopmeter_pairings_total{hop="edge",match="ambiguous",paired_by="none"}')
    )
    assert float(line.rsplit(" ", 1)[1]) >= 2


def test_join_gives_the_same_pairs_and_holds_from_two_files(shipped: Rig, tmp_path: Path) -> None:
    """Each hop's records in a file of its own, as two hosts would write them: `hopmeter join`
    pairs the same flows by content and, told the hops' order (no link can say it: the gateway
    drops the trace), measures the same holds as the live pairing; not told, it reports each
    pair unordered, without holds."""
    asked = shipped.ask_at_once(list(VIA_REPLIES))
    edges = shipped.edge_records(asked)
    flows = shipped.by_flow()
    inners = [flows[e["hops"][0]["inner_flow_id"]] for e in edges]
    files = []
    for hop, recs in (("edge", edges), ("origin", inners)):
        path = tmp_path / f"{hop}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        files.append(str(path))
    unordered = subprocess.run(
        [*HOPMETER, "join", "--json", *files], capture_output=True, check=True, timeout=60
    ).stdout
    for entry in map(orjson.loads, unordered.splitlines()):
        (seg,) = entry["hops"]
        assert (seg["segment"], seg["order"], seg["hold_p50_s"]) == ("edge~origin", "unknown", None)
    out = subprocess.run(
        [*HOPMETER, "join", "--json", "--order", "edge,origin", *files],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    joined = {j["flow_ids"][0]: j for j in map(orjson.loads, out.splitlines())}
    assert len(joined) == 3
    for edge, inner in zip(edges, inners, strict=True):
        entry = joined[edge["flow_id"]]
        assert entry["flow_ids"] == [edge["flow_id"], inner["flow_id"]]
        assert entry["paired_by"] == "content"
        (seg,) = entry["hops"]
        live = edge["hops"][0]
        assert seg["order"] == live["order"] == "declared"
        assert _holds(seg) == pytest.approx(_holds(live), abs=HOLD_TOLERANCE_S)
        assert seg["request_delay_s"] == pytest.approx(live["request_delay_s"], abs=1e-6)


def test_forwarded_traceparent_pairs_by_trace_and_content_agrees(traced: Rig) -> None:
    """With traceparent forwarded the flows share a trace: paired by trace, no
    trace_context_dropped; the same records with the trace ids taken away pair by content with
    the same partners and holds within 2 ms."""
    asked = traced.ask_at_once(list(VIA_REPLIES))
    edges = traced.edge_records(asked)
    flows = traced.by_flow()
    untraced = []
    for edge in edges:
        (seg,) = edge["hops"]
        inner = flows[seg["inner_flow_id"]]
        assert seg["paired_by"] == "trace" and inner["trace_id"] == edge["trace_id"]
        assert edge["pairing"] == {"paired_by": "trace", "match": "unique", "candidates": 0}
        assert "trace_context_dropped" not in [f["kind"] for f in edge["findings"]]
        untraced += [edge, {**inner, "trace_id": "lost-" + inner["flow_id"]}]
    joined = {j["flow_ids"][0]: j for j in join(untraced)}
    for edge in edges:
        entry = joined[edge["flow_id"]]
        assert entry["paired_by"] == "content"
        assert entry["flow_ids"][1] == edge["hops"][0]["inner_flow_id"]
        assert _holds(entry["hops"][0]) == pytest.approx(
            _holds(edge["hops"][0]), abs=HOLD_TOLERANCE_S
        )
