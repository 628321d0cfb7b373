"""Tests for hopmeter.proxy.addon.passage: which bodies hopmeter streams, chains, keeps or leaves to
mitmproxy, and how mitmproxy's own failures end a flow. In process, mitmproxy's test context."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from mitmproxy import exceptions, http
from mitmproxy import flow as flow_module
from mitmproxy.addons.disable_h2c import DisableH2C
from mitmproxy.test import taddons, tflow

from hopmeter.argtypes import parse_bytes
from hopmeter.core.record import FlowResult
from hopmeter.errors import UsageError
from hopmeter.export import FlowObserver
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.passage import (
    CRASH_LOGGER,
    CRASH_MESSAGE,
    FLOW_CAP,
    TOTAL_CAP,
    BodyBudget,
    BodyCopy,
    FlowPassage,
    PassageTap,
)
from hopmeter.proxy.addon.tap import MeasureQueue

SSE = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"model":"gpt-4o"}\n\n'
DONE = b"data: [DONE]\n\n"


class Records(FlowObserver):
    """Keeps each finished record."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.results: list[FlowResult] = []

    def observe(self, result: FlowResult) -> None:
        self.records.append(result.record)
        self.results.append(result)


@pytest.fixture
def tctx() -> Iterator[tuple[taddons.context, HopMeter, Records]]:
    """A HopMeter as a plain mitmdump loads it, with mitmproxy's modify_body option declared."""
    hm = HopMeter()
    records = Records()
    hm.add_observer(records)
    with taddons.context(hm) as ctx:
        ctx.options.add_option("modify_body", list, [], "mitmproxy's ModifyBody option")
        ctx.options.add_option("store_streamed_bodies", bool, False, "mitmproxy's option")
        ctx.configure(hm, hopmeter_hop="edge")
        yield ctx, hm, records


def _flow(content_type: str = "text/event-stream", length: bool = False) -> http.HTTPFlow:
    flow = tflow.tflow(resp=True)
    flow.request.path = "/v1/chat/completions"
    assert flow.response is not None
    flow.response.headers["content-type"] = content_type
    flow.response.content = None
    if not length:
        del flow.response.headers["content-length"]
    return flow


def _headers(hm: HopMeter, flow: http.HTTPFlow) -> http.HTTPFlow:
    """The headers hooks as mitmproxy runs them: the request's before any response exists."""
    response, flow.response = flow.response, None
    hm.requestheaders(flow)
    flow.response = response
    hm.responseheaders(flow)
    return flow


def _stream(hm: HopMeter, flow: http.HTTPFlow, chunks: list[bytes]) -> list[bytes]:
    """mitmproxy's streaming of a response body through whatever callable is set."""
    assert flow.response is not None
    stream = flow.response.stream
    assert callable(stream)
    out: list[bytes] = []
    for chunk in [*chunks, b""]:
        got = stream(chunk)
        out += [got] if isinstance(got, bytes) else list(got)
    hm.response(flow)
    return [piece for piece in out if piece]


def test_a_body_copy_keeps_what_fits_under_both_bounds() -> None:
    """A copy keeps every byte up to its flow's bound, the open copies together up to the total
    bound; past either it keeps the part that fits and says which bound cut it."""
    budget = BodyBudget(10)
    a, b = BodyCopy(6, budget), BodyCopy(100, budget)
    for data in (b"abcd", b"efgh"):
        a.add(data)
    assert (a.size, a.seen, a.clipped) == (6, 8, FLOW_CAP)
    b.add(b"0123456789")
    assert (b.size, b.clipped, budget.held) == (4, TOTAL_CAP, 10)
    assert a.take() == b"abcdef" and budget.held == 4
    b.release()
    b.release()  # once only
    assert budget.held == 0 and budget.clipped == {FLOW_CAP: 1, TOTAL_CAP: 1}


@pytest.mark.parametrize("value", ["x", "-1", "4q", "0.5"])
def test_a_bad_size_names_the_option(value: str) -> None:
    """A size that is not one is one line naming the option and the form it wants; 0 (keep
    nothing) and mitmproxy's short form (4m) pass."""
    with pytest.raises(UsageError, match=r"hopmeter_keep_body .*expected a size in bytes"):
        parse_bytes(value, "hopmeter_keep_body", zero_ok=True)
    assert parse_bytes("0", "o", zero_ok=True) == 0 and parse_bytes("4m", "o") == 4 << 20


def test_bad_options_are_mitmproxy_option_errors(tctx: Any) -> None:
    """A bad size or filter is refused by mitmproxy's option machinery, naming the option."""
    ctx, hm, _ = tctx
    with pytest.raises(exceptions.OptionsError, match="hopmeter_keep_body_total"):
        ctx.configure(hm, hopmeter_keep_body_total="lots")
    with pytest.raises(exceptions.OptionsError, match="hopmeter_buffer"):
        ctx.configure(hm, hopmeter_buffer="~nonsense(")


def test_an_event_stream_is_streamed_and_its_body_kept(tctx: Any) -> None:
    """Plain mitmproxy: an event stream is streamed by hopmeter's tap; the bytes the client got
    become the response's content at the `response` hook."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert isinstance(flow.response.stream, PassageTap)  # type: ignore[union-attr]
    out = _stream(hm, flow, [SSE, DONE])
    assert flow.response is not None and flow.response.raw_content == b"".join(out)
    (record,) = records.records
    assert record["mitmproxy"]["body_kept_bytes"] == len(b"".join(out)) > 0
    # the request's start on the monotonic clock rides along (live pairing), not in the record
    (result,) = records.results
    assert result.mono_start_s is not None and "mono_start_s" not in str(record)


def test_a_json_reply_of_known_length_stays_buffered_in_plain_mitmproxy(tctx: Any) -> None:
    """Plain mitmproxy (hopmeter_stream=streams): a JSON reply with a Content-Length is left to
    mitmproxy to buffer, so a response hook may edit it; hopmeter run (all) streams it."""
    ctx, hm, _ = tctx
    flow = _headers(hm, _flow("application/json", length=True))
    assert flow.response is not None and flow.response.stream is False
    ctx.configure(hm, hopmeter_stream="all")
    flow = _headers(hm, _flow("application/json", length=True))
    assert flow.response is not None and callable(flow.response.stream)


def test_an_unknown_length_body_is_streamed(tctx: Any) -> None:
    """A body of unknown length (chunked, read to the close) is never held whole."""
    _, hm, _ = tctx
    flow = _headers(hm, _flow("application/json", length=False))
    assert flow.response is not None and callable(flow.response.stream)


def test_a_request_body_stays_buffered_as_mitmproxy_has_it(tctx: Any) -> None:
    """Plain mitmproxy's addon (hopmeter_stream=streams) leaves a request body to mitmproxy, so
    a `request` hook acts before anything is sent upstream; its size, model and stream flag are
    read from the body at the `request` hook. A body mitmproxy streams itself stays streamed,
    through the request tap, which hands its bytes on as they are and counts them (its size was
    0 and its model unread); with hopmeter_stream=all (hopmeter run) hopmeter streams it through
    its request tap."""
    ctx, hm, records = tctx
    flow = _flow()
    flow.request.content = b'{"model": "gpt-4o-mini", "stream": true, "messages": []}'
    _headers(hm, flow)
    assert flow.request.stream is False
    hm.request(flow)
    _stream(hm, flow, [b"data: [DONE]\n\n"])
    hm.response(flow)
    (rec,) = records.records
    assert rec["request"]["bytes"] == len(flow.request.content)
    assert rec["model"] == "gpt-4o-mini"
    assert rec["mitmproxy"]["request_buffered_by"] == "not_a_stream"
    large = _flow()
    large.request.stream = True  # mitmproxy's stream_large_bodies
    _headers(hm, large)
    tap = large.request.stream
    assert callable(tap)
    body = [b'{"model": "gpt-4o", "stream": true, "messages": [', b"1" * 5000, b"]}"]
    assert [tap(piece) for piece in [*body, b""]] == [*body, b""]  # the same bytes, in order
    _stream(hm, large, [b"data: [DONE]\n\n"])
    hm.response(large)
    assert records.records[-1]["request"]["bytes"] == sum(map(len, body))
    assert records.records[-1]["model"] == "gpt-4o"
    ctx.configure(hm, hopmeter_stream="all")
    assert callable(_headers(hm, _flow()).request.stream)


def test_modify_body_and_hopmeter_buffer_leave_bodies_buffered(tctx: Any) -> None:
    """A body modify_body or hopmeter_buffer matches is not streamed (request or response), so
    the edit applies; a spec that does not match changes nothing (hopmeter_stream=all, where
    hopmeter streams request bodies)."""
    ctx, hm, _ = tctx
    ctx.configure(hm, hopmeter_stream="all", modify_body=["/~u nomatch/a/b"])
    flow = _headers(hm, _flow())
    assert callable(flow.request.stream) and callable(flow.response.stream)  # type: ignore[union-attr]
    ctx.configure(hm, modify_body=["/~u completions/a/b"])
    flow = _headers(hm, _flow())
    assert flow.request.stream is False and flow.response.stream is False  # type: ignore[union-attr]
    ctx.configure(hm, modify_body=[], hopmeter_buffer="~s")
    flow = _headers(hm, _flow())
    assert callable(flow.request.stream) and flow.response.stream is False  # type: ignore[union-attr]


def test_another_addons_callable_runs_first_on_every_piece() -> None:
    """A chained callable sees every chunk and the end call; what it returns (bytes, lists,
    empty pieces) is what goes out, what hopmeter counts and what the copy keeps."""
    seen: list[bytes] = []

    def theirs(data: bytes) -> bytes | list[bytes]:
        seen.append(data)
        if not data:
            return b"tail"
        return [data.upper(), b"", b"!"]

    tap = PassageTap(None, MeasureQueue(), lambda where, exc: None)
    tap.inner = theirs
    tap.body = BodyCopy(1 << 20, BodyBudget(1 << 20))
    out = [tap(b"ab"), tap(b"cd"), tap(b"")]
    assert seen == [b"ab", b"cd", b""]
    assert out == [[b"AB", b"!"], [b"CD", b"!"], [b"tail"]]
    assert tap.bytes_out == 10 and tap.body.take() == b"AB!CD!tail"


def test_a_failing_copy_never_touches_the_bytes() -> None:
    """A copy that fails is dropped and counted as hopmeter's error; the chunk goes out."""
    errors: list[str] = []
    tap = PassageTap(None, MeasureQueue(), lambda where, exc: errors.append(where))
    tap.body = BodyCopy(10, None)  # type: ignore[arg-type]  # a budget that breaks on use
    assert tap(b"data") == b"data" and tap(b"more") == b"more"
    assert errors == ["body_copy"] and tap.body is None


def test_a_1xx_taken_for_the_final_response_is_an_error(tctx: Any) -> None:
    """A 103 reaching the `response` hook ends the flow as an error with no final response in the
    record, and kills the flow so mitmproxy closes the client's connection."""
    _, hm, records = tctx
    flow = _flow()
    hm.requestheaders(flow)
    assert flow.response is not None
    flow.response.status_code = 103
    flow.response.reason = "Early Hints"
    hm.responseheaders(flow)
    hm.response(flow)
    assert flow.error is not None and flow.error.msg == "Connection killed."
    (record,) = records.records
    assert record["ended"] == "error" and "response" not in record
    assert record["mitmproxy"]["informational"] == [103]
    assert record["findings"][0]["kind"] == "proxy_failed"


def test_a_mitmproxy_crash_ends_that_clients_flows_only(tctx: Any) -> None:
    """mitmproxy's "has crashed!" line for a connection ends the flows of that client in flight
    as errors with the exception named; another client's flow goes on."""
    _, hm, records = tctx
    hm.running()
    ours, theirs = _flow(), _flow()
    theirs.client_conn.peername = ("127.0.0.1", 9999)
    for flow in (ours, theirs):
        hm.requestheaders(flow)
        hm.responseheaders(flow)
    try:
        raise NotImplementedError("HTTP trailers are not implemented yet.")
    except NotImplementedError:
        logging.getLogger(CRASH_LOGGER).error(
            CRASH_MESSAGE, exc_info=True, extra={"client": ours.client_conn.peername}
        )
    hm.done()  # ends what is still in flight (theirs) as shutdown
    by_flow = {r["flow_id"]: r for r in records.records}
    assert by_flow[ours.id]["ended"] == "error"
    error = "NotImplementedError: HTTP trailers are not implemented yet."
    assert by_flow[ours.id]["mitmproxy"]["error"] == error
    assert by_flow[theirs.id]["ended"] == "shutdown"


def test_the_default_section_is_left_out() -> None:
    """A flow hopmeter streamed with nothing kept, edited or failed adds no record section."""
    assert FlowPassage().as_dict() is None
    assert FlowPassage(stream="buffered", buffered_by="modify_body").as_dict() == {
        "stream": "buffered",
        "buffered_by": "modify_body",
    }


def test_what_the_record_says_is_taken_once_the_flow_ended() -> None:
    """seen() is the record's section and what its findings need: nothing for a flow moved the
    usual way; an edit after streaming counts the bytes that went out; a buffered body's edit is
    no finding (the client got the edit)."""
    assert FlowPassage().seen() is None
    streamed = FlowPassage(stream="chained", edited=True, body=BodyCopy(100, BodyBudget(1000)))
    streamed.body.add(b"x" * 42)  # type: ignore[union-attr]
    taken = streamed.seen()
    assert taken is not None and taken.section == streamed.as_dict()
    assert taken.edited_after_streaming and taken.streamed_bytes == 42
    buffered = FlowPassage(stream="buffered", buffered_by="modify_body", edited=True).seen()
    assert buffered is not None and not buffered.edited_after_streaming
    assert buffered.findings() == []


def test_a_stream_mode_that_is_not_one_is_refused(tctx: Any) -> None:
    """hopmeter_stream takes 'streams' or 'all' (mitmproxy's `choices` show them; nothing else
    enforces them): anything else is an error naming the option, not a silent 'streams'."""
    ctx, hm, _ = tctx
    with pytest.raises(exceptions.OptionsError, match="hopmeter_stream must be one of"):
        ctx.configure(hm, hopmeter_stream="bogus")


def test_an_edit_by_a_hook_before_hopmeter_s_to_a_streamed_body_is_noted(tctx: Any) -> None:
    """An addon loaded before hopmeter (the order the docs give) whose `response` hook sets a
    streamed body's content edits what the client already got: the record says so, as for an
    addon loaded after hopmeter."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert flow.response is not None and callable(flow.response.stream)
    for chunk in [b"data: [DONE]\n\n", b""]:
        flow.response.stream(chunk)
    flow.response.content = b"EDITED"  # their response hook, before hopmeter's
    hm.response(flow)
    (rec,) = records.records
    assert rec["mitmproxy"]["edited"] == "after_streaming"
    assert "edited_after_streaming" in [f["kind"] for f in rec["findings"]]


def test_only_an_http2_json_body_of_no_stated_length_is_held_for_its_length(tctx: Any) -> None:
    """hopmeter run streams request bodies; an HTTP/2 one without a length that is a JSON
    document (an LLM API's request) is held and sent with its length (mitmproxy 12 would send
    it unframed to an HTTP/1 upstream); a bodiless method, a gRPC body and HTTP/1 stay as
    they come."""
    ctx, hm, _ = tctx
    ctx.configure(hm, hopmeter_stream="all")

    def h2(method: str, content_type: str) -> http.HTTPFlow:
        flow = _flow()
        flow.request.http_version = "HTTP/2.0"
        flow.request.method = method
        flow.request.headers["content-type"] = content_type
        del flow.request.headers["content-length"]
        return _headers(hm, flow)

    assert h2("POST", "application/json").request.stream is False
    assert callable(h2("POST", "application/grpc").request.stream)
    assert callable(h2("GET", "application/json").request.stream)
    assert callable(_headers(hm, _flow()).request.stream)  # HTTP/1: framed on its own


def test_a_reply_an_addon_set_at_the_request_hook_is_no_edit(tctx: Any) -> None:
    """A reply an addon sets before the upstream (server replay, map_local) reaches the client
    as mitmproxy sends it, through no stream callable: its body is no edit after streaming."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert flow.response is not None
    flow.response.content = b"data: [DONE]\n\n"  # the tap never ran: mitmproxy sent it whole
    hm.response(flow)
    (rec,) = records.records
    assert "edited_after_streaming" not in [f["kind"] for f in rec["findings"]]


def test_a_clear_text_http2_client_is_told_why_its_connection_closed(tctx: Any) -> None:
    """An HTTP/2 connection preface on a plain listener (curl --http2-prior-knowledge), which
    mitmproxy's disable_h2c kills: an error whose proxy_failed finding names the cause and
    the fix, not a bare killed flow."""
    _, hm, records = tctx
    flow = tflow.tflow()
    flow.request.method, flow.request.path = "PRI", "*"
    flow.request.http_version = "HTTP/2.0"
    hm.requestheaders(flow)
    DisableH2C().request(flow)  # mitmproxy's own addon, as loaded by default
    hm.error(flow)
    (record,) = records.records
    assert record["ended"] == "error" and record["mitmproxy"]["killed"] is True
    (finding,) = record["findings"]
    assert finding["kind"] == "proxy_failed"
    assert finding["evidence"]["cause"] == "h2_prior_knowledge"
    assert "HTTP/2 over TLS" in finding["fix"]


def test_another_killed_flow_has_no_failure_cause(tctx: Any) -> None:
    """A flow a user's addon kills is an error marked killed, with no proxy failure."""
    _, hm, records = tctx
    flow = tflow.tflow()
    hm.requestheaders(flow)
    flow.kill()
    hm.error(flow)
    (record,) = records.records
    assert record["ended"] == "error" and record["mitmproxy"]["killed"] is True
    assert record["findings"] == []


def test_every_response_hook_sees_the_kept_body_whatever_the_load_order(tctx: Any) -> None:
    """The copy becomes the response's content at the body's end, before any `response` hook:
    a script loaded before hopmeter reads it too (mitmproxy calls the hooks in load order), and
    that is not taken for an edit."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert flow.response is not None
    stream = flow.response.stream
    assert callable(stream)
    stream(SSE)
    stream(DONE)
    stream(b"")
    seen_first = flow.response.content  # an earlier script's `response` hook
    hm.response(flow)
    assert seen_first == SSE + DONE == flow.response.raw_content
    (record,) = records.records
    assert "edited" not in record["mitmproxy"]
    assert "edited_after_streaming" not in [f["kind"] for f in record["findings"]]


def test_an_earlier_scripts_edit_of_the_given_body_is_still_seen(tctx: Any) -> None:
    """A script loaded before hopmeter that replaces the content handed over at the end edited
    a body that had already gone out: edited_after_streaming, as before."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert flow.response is not None
    stream = flow.response.stream
    assert callable(stream)
    for chunk in (SSE, DONE, b""):
        stream(chunk)
    flow.response.content = b"data: changed\n\n"
    hm.response(flow)
    (record,) = records.records
    assert record["mitmproxy"]["edited"] == "after_streaming"
    assert "edited_after_streaming" in [f["kind"] for f in record["findings"]]


def test_a_replaced_callable_leaves_the_content_as_mitmproxy_has_it(tctx: Any) -> None:
    """An addon loaded after hopmeter that sets `stream = True` replaces hopmeter's callable:
    nothing was copied, so the content stays None (mitmproxy's "content missing"), not b""."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert flow.response is not None
    flow.response.stream = True
    hm.response(flow)
    assert flow.response.raw_content is None
    (record,) = records.records
    assert record["mitmproxy"]["stream"] == "replaced"


def test_a_reply_an_addon_set_is_measured_whole(tctx: Any) -> None:
    """A reply set at `request` (server replay, a script's `http.Response.make`): mitmproxy
    runs the headers hook, then sends the body whole, never through the stream callable. It is
    measured whole, as a buffered body (`buffered_by: addon_reply`), not as a stream that sent
    nothing and ended without its terminal event."""
    _, hm, records = tctx
    flow = tflow.tflow()
    flow.request.path = "/v1/chat/completions"
    hm.requestheaders(flow)
    hm.request(flow)
    flow.response = http.Response.make(200, SSE + DONE, {"content-type": "text/event-stream"})
    hm.responseheaders(flow)  # mitmproxy emulates it for a reply an addon set
    hm.response(flow)
    assert flow.response.raw_content == SSE + DONE
    (record,) = records.records
    assert record["mitmproxy"]["buffered_by"] == "addon_reply"
    assert record["response"]["bytes_out"] == len(SSE + DONE)
    assert record["api"] == "openai.chat" and record["ended"] == "complete"
    assert "truncated" not in [f["kind"] for f in record["findings"]]


def test_an_empty_data_frame_mid_stream_does_not_cut_the_kept_body(tctx: Any) -> None:
    """mitmproxy hands an HTTP/2 upstream's empty DATA frame mid-stream to the callable as b"",
    as it does the body's end: the copy given then is what came so far, and what comes after
    is given too (the content at the `response` hook is the whole body, nothing leaks from the
    budget)."""
    _, hm, records = tctx
    flow = _headers(hm, _flow())
    assert flow.response is not None
    stream = flow.response.stream
    assert callable(stream)
    for chunk in (SSE, b"", SSE, DONE, b""):
        stream(chunk)
    assert flow.response.raw_content == SSE + SSE + DONE  # before any response hook
    hm.response(flow)
    assert flow.response.raw_content == SSE + SSE + DONE
    (record,) = records.records
    assert record["mitmproxy"]["body_kept_bytes"] == len(SSE + SSE + DONE)
    assert "edited" not in record["mitmproxy"]
    assert hm.passage.budget.held == 0


def test_a_killed_addon_reply_claims_no_bytes_sent(tctx: Any) -> None:
    """A reply an addon set, then killed at `response` by another: never sent, so its record
    claims no bytes out."""
    _, hm, records = tctx
    flow = tflow.tflow()
    flow.request.path = "/v1/chat/completions"
    hm.requestheaders(flow)
    flow.response = http.Response.make(200, SSE + DONE, {"content-type": "text/event-stream"})
    hm.responseheaders(flow)
    flow.kill()
    hm.response(flow)
    (record,) = records.records
    assert record["ended"] == "error" and record["response"]["bytes_out"] == 0


def test_mitmproxys_own_error_on_a_flow_is_said_scrubbed_and_clipped(tctx: Any) -> None:
    """A flow mitmproxy ended with an error of its own (not a peer's close, not a kill): the
    record quotes it in `mitmproxy.error` with finding proxy_failed, without anything shaped
    like a key or the peer's bytes it quotes, and within its bound; a peer's reset says nothing
    of the kind."""
    _, hm, records = tctx
    flow = tflow.tflow()
    hm.requestheaders(flow)
    key = "sk-proj-" + "A1b2C3d4" * 6
    flow.error = flow_module.Error(f"HTTP protocol error in header {key} " + "x" * 2000)
    hm.error(flow)
    reset = tflow.tflow()
    hm.requestheaders(reset)
    reset.error = flow_module.Error("peer closed connection")
    hm.error(reset)
    quoting = tflow.tflow()  # a message that quotes the peer's bytes: they are withheld
    hm.requestheaders(quoting)
    quoting.error = flow_module.Error("Bad HTTP response line: b'the secret reply text'")
    hm.error(quoting)
    first, second, third = records.records
    assert third["mitmproxy"]["error"] == "Bad HTTP response line: b'[withheld]'"
    assert first["ended"] == "error" and key not in first["mitmproxy"]["error"]
    assert first["mitmproxy"]["error"].startswith("HTTP protocol error in header ")
    assert len(first["mitmproxy"]["error"]) <= 300
    (finding,) = first["findings"]
    assert finding["evidence"]["cause"] == "mitmproxy_flow_error"
    assert second["ended"] == "upstream_reset" and "error" not in (second.get("mitmproxy") or {})
