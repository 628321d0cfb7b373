"""Tests for hopmeter.proxy.addon.meter, in process: mitmproxy's test context and flows, no
sockets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from mitmproxy import exceptions, http, io
from mitmproxy.test import taddons, tflow

from hopmeter.core.record import FlowResult
from hopmeter.export import FlowObserver
from hopmeter.proxy.addon import ending as ending_module
from hopmeter.proxy.addon import tap as tap_module
from hopmeter.proxy.addon.failures import classify_error
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.meter_options import parse_listeners
from tests.harness.live_client import live_client, run, unread
from tests.harness.procs import until

SSE = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],"model":"gpt-4o"}\n\n'
DONE = b"data: [DONE]\n\n"


class Recorder(FlowObserver):
    """Remembers every notice it gets."""

    def __init__(self) -> None:
        self.results: list[FlowResult] = []
        self.notices: list[str] = []

    def observe(self, result: FlowResult) -> None:
        self.results.append(result)

    def stream_started(self) -> None:
        self.notices.append("started")

    def stream_finished(self) -> None:
        self.notices.append("finished")

    def internal_error(self, where: str) -> None:
        self.notices.append(f"error:{where}")


class Raiser(FlowObserver):
    """Raises from every notice."""

    def observe(self, result: FlowResult) -> None:
        raise RuntimeError("observe")

    def stream_started(self) -> None:
        raise RuntimeError("stream_started")

    def stream_finished(self) -> None:
        raise RuntimeError("stream_finished")

    def internal_error(self, where: str) -> None:
        raise RuntimeError("internal_error")


@pytest.fixture
def meter() -> Iterator[HopMeter]:
    """A HopMeter in mitmproxy's test context, configured as `hopmeter run` would."""
    hm = HopMeter()
    with taddons.context(hm) as tctx:
        tctx.configure(hm, hopmeter_hop="edge", hopmeter_stream="all")
        yield hm


def sse_flow(**kwargs: Any) -> http.HTTPFlow:
    """A chat completion request with an event-stream response whose body is still to come."""
    flow = tflow.tflow(resp=True, **kwargs)
    flow.request.path = "/v1/chat/completions"
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = None
    return flow


def stream_through(meter: HopMeter, flow: http.HTTPFlow, chunks: list[bytes]) -> list[bytes]:
    """Run the hooks and the response tap as mitmproxy does; what the client would get."""
    meter.requestheaders(flow)
    meter.responseheaders(flow)
    tap = flow.response.stream
    assert callable(tap)
    out = [tap(chunk) for chunk in [*chunks, b""]]
    meter.response(flow)
    return [piece for piece in out if isinstance(piece, bytes)]


def tap_whose_meter_fails(
    meter: HopMeter, flow: http.HTTPFlow, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The flow's response tap, after its headers hooks, with a meter whose feed raises."""
    meter.requestheaders(flow)
    meter.responseheaders(flow)
    assert flow.response is not None
    tap = flow.response.stream
    assert callable(tap)

    def broken_feed(data: bytes, now: float) -> None:
        raise ValueError("parser bug")

    monkeypatch.setattr(tap.meter, "feed", broken_feed)  # type: ignore[attr-defined]
    return tap


class TestHooks:
    def test_a_flow_becomes_one_record(self, meter: HopMeter) -> None:
        """Hooks and tap turn one streamed flow into one record handed to every observer."""
        rec = Recorder()
        meter.add_observer(rec)
        out = stream_through(meter, sse_flow(), [SSE, SSE, DONE])
        assert out == [SSE, SSE, DONE, b""]
        (result,) = rec.results
        assert result.record["hop"] == "edge"
        assert result.record["api"] == "openai.chat"
        assert result.record["response"]["ended"] == "complete"
        assert result.record["figures"]["events"] == 3
        assert rec.notices == ["started", "finished"]

    def test_stream_callable_is_set_before_anything_can_fail(
        self, meter: HopMeter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """When building the meter raises, the body still streams, unchanged, and it is counted."""

        def broken(**kwargs: object) -> None:
            raise RuntimeError("broken meter")

        monkeypatch.setattr(tap_module, "FlowMeter", broken)
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        out = stream_through(meter, flow, [SSE, DONE])
        assert out == [SSE, DONE, b""]
        assert meter.observers.internal_errors == 1
        assert "error:response_tap" in rec.notices
        assert rec.results[0].record["measuring_error"].startswith("RuntimeError")

    def test_a_raising_observer_never_escapes(self, meter: HopMeter) -> None:
        """An observer raising from every notice costs no byte and no other observer's record."""
        rec = Recorder()
        meter.add_observer(Raiser())
        meter.add_observer(rec)
        out = stream_through(meter, sse_flow(), [SSE, SSE, DONE])
        assert out == [SSE, SSE, DONE, b""]
        assert len(rec.results) == 1
        # started, finished and observe each raised once; the error notices did not recurse
        assert meter.observers.internal_errors == 3

    def test_a_failing_tap_with_a_raising_observer_returns_every_chunk(
        self, meter: HopMeter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The tap's error path calls observers that raise; the chunk still comes back."""
        meter.add_observer(Raiser())
        tap = tap_whose_meter_fails(meter, sse_flow(), monkeypatch)
        assert tap(SSE) == SSE
        assert tap(DONE) == DONE
        assert tap.meter is None and tap.error == "ValueError: parser bug"

    def test_a_flow_whose_measuring_failed_keeps_the_api_its_request_names(
        self, meter: HopMeter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Measuring failed mid-stream: the record (and the metrics' `api` label) still says the
        API the request's path names, not "other", beside the measuring error."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        tap = tap_whose_meter_fails(meter, flow, monkeypatch)
        for chunk in (SSE, DONE, b""):
            tap(chunk)
        meter.response(flow)
        (result,) = rec.results
        assert result.record["api"] == "openai.chat"
        assert result.record["measuring_error"] == "ValueError: parser bug"

    def test_a_record_that_cannot_be_made_is_counted_and_named_lost(
        self, meter: HopMeter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A fault while building a record (after the bytes went through): counted as an
        internal error at its link, and one log line names the flow whose record is lost."""
        rec = Recorder()
        meter.add_observer(rec)

        def broken(*args: Any) -> FlowResult:
            raise RuntimeError("record bug")

        monkeypatch.setattr(ending_module, "finish", broken)
        flow = sse_flow()
        with caplog.at_level(logging.WARNING):
            assert stream_through(meter, flow, [SSE, DONE]) == [SSE, DONE, b""]
        assert rec.results == [] and rec.notices.count("error:finish") == 1
        assert "record could not be made and is lost" in caplog.text and flow.id in caplog.text

    def test_the_request_tap_forwards_the_body_and_reads_the_model(self, meter: HopMeter) -> None:
        """The request body streams through unchanged; its model and stream flag are read."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        flow.request.stream = False
        meter.requestheaders(flow)
        body = [b'{"model": "gpt-4o-mini", ', b'"stream": true}']
        assert [flow.request.stream(b) for b in [*body, b""]] == [*body, b""]  # type: ignore[operator]
        meter.responseheaders(flow)
        flow.response.stream(DONE)  # type: ignore[operator]
        meter.response(flow)
        request = rec.results[0].record["request"]
        assert request["bytes"] == sum(map(len, body))
        assert rec.results[0].record["model"] == "gpt-4o-mini"

    def test_flows_read_from_a_file_are_not_measured_again(self, meter: HopMeter) -> None:
        """A flow that is not live (loaded from a .mitm file) gets no second record."""
        rec = Recorder()
        meter.add_observer(rec)
        stream_through(meter, sse_flow(live=False), [SSE, DONE])
        assert rec.results == []

    def test_a_measured_flow_can_still_be_saved(self, meter: HopMeter, tmp_path: Any) -> None:
        """hopmeter keeps its live state off the flow, so mitmproxy can save the flow mid-stream."""
        flow = sse_flow()
        meter.requestheaders(flow)
        meter.responseheaders(flow)
        flow.response.stream(SSE)  # type: ignore[operator]
        path = tmp_path / "flows.mitm"
        with path.open("wb") as f:
            io.FlowWriter(f).add(flow)
        meter.response(flow)
        with path.open("rb") as f:
            assert len(list(io.FlowReader(f).stream())) == 1

    def test_flows_in_flight_at_stop_are_written_as_shutdown(self, meter: HopMeter) -> None:
        """done() writes a record, ended "shutdown", for every flow still streaming."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        meter.requestheaders(flow)
        meter.responseheaders(flow)
        flow.response.stream(SSE)  # type: ignore[operator]
        meter.done()
        assert [r.record["response"]["ended"] for r in rec.results] == ["shutdown"]
        meter.response(flow)  # the end arriving after the stop adds nothing
        assert len(rec.results) == 1

    def test_flows_that_start_after_the_stop_are_forwarded_unmeasured(
        self, meter: HopMeter
    ) -> None:
        """After done() the outputs are closed: a flow still starting on an open connection
        gets its bytes through unchanged and no record (nothing could write it)."""
        rec = Recorder()
        meter.add_observer(rec)
        meter.done()
        flow = sse_flow()
        assert stream_through(meter, flow, [SSE, DONE]) == [SSE, DONE, b""]
        meter.response(flow)
        assert rec.results == [] and meter.in_flight() == 0

    def test_a_client_that_hangs_up_ends_the_flow(self, meter: HopMeter) -> None:
        """The error hook finishes a flow whose client went away, as client_gone."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        meter.requestheaders(flow)
        meter.responseheaders(flow)
        flow.response.stream(SSE)  # type: ignore[operator]
        flow.error = tflow.terr("Client disconnected.")  # type: ignore[attr-defined]
        meter.error(flow)
        assert rec.results[0].record["response"]["ended"] == "client_gone"

    def test_a_relay_fault_that_cut_the_client_ends_the_flow_as_an_error(
        self, meter: HopMeter
    ) -> None:
        """A relay fault after a read was under way (the client's connection reset) is counted,
        and the flow is recorded ended "error" with the fault, even after the stream's terminal
        event: never complete, never client_gone."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        meter.requestheaders(flow)
        meter.responseheaders(flow)
        flow.response.stream(SSE)  # type: ignore[operator]
        flow.response.stream(DONE)  # type: ignore[operator]
        meter.relay_failed(flow, RuntimeError("broken"), True)
        flow.error = tflow.terr("Client disconnected.")  # type: ignore[attr-defined]
        meter.error(flow)
        record = rec.results[0].record
        assert record["ended"] == record["response"]["ended"] == "error"
        assert record["relay_error"] == "RuntimeError: broken"
        assert meter.observers.internal_errors == 1 and rec.notices.count("error:relay") == 1

    def test_a_relay_fault_that_left_the_read_to_mitmproxy_keeps_the_flow(
        self, meter: HopMeter
    ) -> None:
        """A relay fault before anything of a read moved, or one in another fast path, is
        counted and the flow's record is as it would be."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        meter.requestheaders(flow)
        meter.responseheaders(flow)
        meter.relay_failed(flow, RuntimeError("broken"), False)
        meter.observers.fast_path_failed("framing", RuntimeError("broken"))
        for chunk in (SSE, DONE, b""):
            flow.response.stream(chunk)  # type: ignore[operator]
        meter.response(flow)
        record = rec.results[0].record
        assert record["ended"] == "complete" and "relay_error" not in record
        assert meter.observers.internal_errors == 2
        assert [n for n in rec.notices if n.startswith("error:")] == [
            "error:relay",
            "error:framing",
        ]

    def test_a_traceparent_is_added_unless_turned_off(self, meter: HopMeter) -> None:
        """Requests without trace context get one; hopmeter_trace_header=false leaves them be."""
        flow = sse_flow()
        meter.requestheaders(flow)
        assert flow.request.headers["traceparent"].startswith("00-")
        ctx_flow = sse_flow()
        with taddons.context(HopMeter()) as tctx:
            other = tctx.master.addons.get("hopmeter")
            tctx.configure(other, hopmeter_trace_header=False)
            other.requestheaders(ctx_flow)
        assert "traceparent" not in ctx_flow.request.headers

    def test_an_incoming_trace_goes_on_with_this_hop_s_span_as_the_parent(
        self, meter: HopMeter
    ) -> None:
        """A request that brings a traceparent leaves with the same trace id and flags and this
        flow's own span id as the parent; tracestate goes on untouched; the record names the
        incoming span as its parent."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        client_span = "00f067aa0ba902b7"
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        flow.request.headers["traceparent"] = f"00-{trace_id}-{client_span}-00"
        flow.request.headers["tracestate"] = "vendor=abc,hopmeter=beacon"
        stream_through(meter, flow, [SSE, DONE])
        version, trace, parent, flags = flow.request.headers["traceparent"].split("-")
        record = rec.results[0].record
        assert (version, trace, flags) == ("00", trace_id, "00")
        assert parent == record["span_id"] != client_span
        assert record["parent_span_id"] == client_span and record["trace_id"] == trace_id
        assert flow.request.headers["tracestate"] == "vendor=abc,hopmeter=beacon"
        assert record["traceparent_received"] == "valid"

    @pytest.mark.parametrize(
        "value",
        [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper-case hex
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  # 00 with a 5th field
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
            "",
            "x" * 10_000,
        ],
    )
    def test_a_malformed_traceparent_is_replaced_and_said(
        self, meter: HopMeter, value: str
    ) -> None:
        """A traceparent that is not W3C trace context: the flow gets a trace of its own and its
        tracestate is dropped (as the spec says), and the record says the client's was
        malformed, where one that sent none says absent: the client's trace lost is never taken
        for one never sent."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        flow.request.headers["traceparent"] = value
        flow.request.headers["tracestate"] = "vendor=abc"
        stream_through(meter, flow, [SSE, DONE])
        record = rec.results[0].record
        assert record["traceparent_received"] == "malformed"
        assert "tracestate" not in flow.request.headers  # W3C: discarded with its traceparent
        assert record["parent_span_id"] is None and "4bf92f35" not in record["trace_id"]
        assert flow.request.headers["traceparent"].split("-")[1] == record["trace_id"]

    def test_a_made_up_trace_forwards_this_flow_s_span(self, meter: HopMeter) -> None:
        """A request without trace context gets a new trace whose parent span is this flow's
        own, and the record has no parent."""
        rec = Recorder()
        meter.add_observer(rec)
        flow = sse_flow()
        stream_through(meter, flow, [SSE, DONE])
        _, trace, parent, flags = flow.request.headers["traceparent"].split("-")
        record = rec.results[0].record
        assert (trace, parent, flags) == (record["trace_id"], record["span_id"], "01")
        assert record["parent_span_id"] is None
        assert record["traceparent_received"] == "absent"


class TestOptions:
    def test_bad_stall_threshold_names_the_option(self) -> None:
        """A non-positive or unreadable stall threshold is refused with the option's name."""
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            for bad in ("0", "-1", "soon"):
                with pytest.raises(exceptions.OptionsError, match="hopmeter_stall_threshold"):
                    tctx.configure(hm, hopmeter_stall_threshold=bad)

    def test_stall_threshold_is_text_set_as_mitmproxys_set_does(self) -> None:
        """The threshold is a string option, so `--set`/`set` can set it; it is read as seconds."""
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            tctx.options.set("hopmeter_stall_threshold=0.25")
            assert hm.stall_threshold_s == 0.25
            tctx.master.commands.call("set", "hopmeter_stall_threshold", "750ms")
            assert hm.stall_threshold_s == 0.75
            flow = sse_flow()
            rec = Recorder()
            hm.add_observer(rec)
            stream_through(hm, flow, [SSE, DONE])
            assert rec.results[0].figures is not None

    def test_listeners_add_their_modes(self) -> None:
        """Each NAME=MODE listener names its mode and adds it to mitmproxy's modes."""
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            tctx.configure(hm, hopmeter_listeners=["edge=reverse:http://127.0.0.1:9@8081"])
            assert tctx.options.mode == ["reverse:http://127.0.0.1:9@8081"]
            assert hm.listener_names == {"reverse:http://127.0.0.1:9@8081": "edge"}

    def test_listeners_of_two_hops_pair_by_content_too(self) -> None:
        """Listeners of two hops turn content pairing on; one hop leaves it off."""
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            assert not hm.pairing.by_content
            tctx.configure(
                hm,
                hopmeter_listeners=[
                    "edge=reverse:http://127.0.0.1:1@8081",
                    "origin=reverse:http://127.0.0.1:2@8082",
                ],
            )
            assert hm.pairing.hops == {"edge", "origin"} and hm.pairing.by_content
            assert hm.pairing.order.outer_of("edge", "origin") == (True, "declared")
            tctx.configure(hm, hopmeter_content_pairing=False)  # --no-content-pairing
            assert not hm.pairing.by_content
            tctx.configure(hm, hopmeter_content_pairing=True)
            assert hm.pairing.by_content

    def test_the_fingerprint_key_comes_from_the_named_variable(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The key is read from the variable the option names; an unset one is a clear error, and
        the record's fingerprint says it is keyed."""
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            with pytest.raises(exceptions.OptionsError, match="HOPMETER_TEST_FP_KEY is not set"):
                tctx.configure(hm, hopmeter_fingerprint_key_env="HOPMETER_TEST_FP_KEY")
            monkeypatch.setenv("HOPMETER_TEST_FP_KEY", "s3cret")
            tctx.configure(hm, hopmeter_fingerprint_key_env="HOPMETER_TEST_FP_KEY")
            assert hm.fingerprint_key == b"s3cret"
            rec = Recorder()
            hm.add_observer(rec)
            stream_through(hm, sse_flow(), [SSE, DONE])
            fp = rec.results[0].record["fingerprint"]
            assert fp["keyed"] is True and "s3cret" not in str(rec.results[0].record)

    def test_bad_listener_is_one_clear_error(self) -> None:
        """A listener without NAME= is refused with an example of the right form."""
        with pytest.raises(Exception, match="expected NAME=MODE"):
            parse_listeners(["reverse:http://x@1"])

    def test_bad_chaos_and_tokenizer_name_the_option(self) -> None:
        """Unknown chaos actions and unreadable tokenizers name their option."""
        hm = HopMeter()
        with taddons.context(hm) as tctx:
            with pytest.raises(exceptions.OptionsError, match="hopmeter_chaos"):
                tctx.configure(hm, hopmeter_chaos="shuffle")
            with pytest.raises(exceptions.OptionsError, match="hopmeter_tokenizer"):
                tctx.configure(hm, hopmeter_tokenizer="/no/such.tiktoken")


@pytest.mark.parametrize(
    ("message", "ended"),
    [
        ("Client disconnected.", "client_gone"),
        ("Server disconnected.", "upstream_reset"),
        ("Connection reset by peer", "upstream_reset"),
        ("peer closed connection without sending complete message body", "upstream_reset"),
        ("something else", "error"),
    ],
)
def test_classify_error(message: str, ended: str) -> None:
    """mitmproxy's error messages map to the record's endings; with the client's connection
    already closed (an HTTP/2 client that hung up: "peer closed connection") the client left."""
    assert classify_error(message) == ended
    assert classify_error(message, client_open=False) == "client_gone"


class TestDelivery:
    def test_a_flow_without_a_live_client_says_why_it_was_not_followed(
        self, meter: HopMeter
    ) -> None:
        """Outside a running proxy there is no client transport: the record says so."""
        rec = Recorder()
        meter.add_observer(rec)
        stream_through(meter, sse_flow(), [SSE, DONE])
        section = rec.results[0].record["delivery"]
        assert section["measured"] is False and section["reason"]
        assert "chunks_out" not in rec.results[0].record

    @pytest.mark.loopback
    def test_a_live_client_gets_out_times_for_every_chunk(self) -> None:
        """On mitmproxy's own handler for a real socket, each chunk mitmproxy writes is followed
        and the record waits for the kernel to send the last one."""

        async def test() -> None:
            hm = HopMeter()
            rec = Recorder()
            async with live_client(0, hm) as live:
                live.tctx.configure(hm, hopmeter_hop="edge")
                hm.add_observer(rec)
                flow = sse_flow()
                flow.client_conn = live.handler.client
                hm.requestheaders(flow)
                hm.responseheaders(flow)
                tap = flow.response.stream  # type: ignore[union-attr]
                assert callable(tap)
                for chunk in (SSE, SSE, DONE):
                    live.writer.write(b"%x\r\n%s\r\n" % (len(chunk), tap(chunk)))  # as mitmproxy
                hm.response(flow)
                await until(lambda: rec.results, what="the record, once the client has its bytes")
                assert unread(live.peer).count(b"data: ") == 3

            record = rec.results[0].record
            assert record["delivery"]["measured"] and record["delivery"]["reason"] is None
            assert len(record["chunks_out"]) == len(record["chunks"]) == 3
            for (t_in, _), (out, sent) in zip(record["chunks"], record["chunks_out"], strict=True):
                assert t_in <= out <= sent

        run(test)
