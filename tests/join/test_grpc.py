"""The OTLP/gRPC receiver, called by grpcio (a real gRPC implementation, as the Collector's is)."""

from __future__ import annotations

import contextlib
import gzip
import socket
import struct
import time
from collections.abc import Iterator

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from hopmeter.join import grpc as receiver
from hopmeter.join.grpc import EXPORT_PATH, Code, GrpcReceiver, export
from hopmeter.join.service import JoinService
from tests.harness.otlp import hop_span, request_of
from tests.join.conftest import Served

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
EDGE = bytes.fromhex("00f067aa0ba902b7")
ORIGIN = bytes.fromhex("b7ad6b7169203331")


@pytest.fixture
def served(service: JoinService) -> Iterator[Served]:
    s = Served(GrpcReceiver(service, max_message=1 << 20).serve)
    yield s
    s.close()


@pytest.fixture
def channel(served: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{served.port}") as ch:
        yield ch


@pytest.mark.loopback
@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip])
def test_grpcio_exports_join_a_pair(
    channel: grpc.Channel, served: Served, service: JoinService, compression: grpc.Compression
) -> None:
    """Two Export calls (uncompressed or gzip) carry the edge's and origin's spans: OK, and the
    segment is aligned."""
    stub = TraceServiceStub(channel)
    for span in (hop_span(TRACE, EDGE), hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE)):
        response = stub.Export(request_of([span]), timeout=10, compression=compression)
        assert not response.HasField("partial_success")
    assert served.call(lambda: service.segments["true"]) == 1
    assert served.call(lambda: service.requests["grpc", "OK"]) == 2


@pytest.mark.loopback
def test_absurd_spans_come_back_in_partial_success(channel: grpc.Channel) -> None:
    """A span with an absurd timeline is reported rejected, the call still OK."""
    stub = TraceServiceStub(channel)
    bad = hop_span(TRACE, EDGE, t_us=[3, 2, 1], offsets=[1, 2, 3])
    response = stub.Export(request_of([bad]), timeout=10)
    assert response.partial_success.rejected_spans == 1


@pytest.mark.loopback
def test_garbage_and_oversized_messages_get_their_codes(channel: grpc.Channel) -> None:
    """Undecodable bytes are INVALID_ARGUMENT, a message past the limit RESOURCE_EXHAUSTED, an
    unknown method UNIMPLEMENTED."""
    export_call = channel.unary_unary(EXPORT_PATH)
    with pytest.raises(grpc.RpcError) as bad:
        export_call(b"\xff\xff\xff", timeout=10)
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as big:
        export_call(bytes(2 << 20), timeout=10)
    assert big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as other:
        channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")(
            b"", timeout=10
        )
    assert other.value.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.loopback
def test_past_the_buffer_budget_calls_are_unavailable(
    channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When messages in flight would pass the budget, the call is UNAVAILABLE (retried)."""
    monkeypatch.setattr(receiver, "MAX_BUFFERED", 1000)
    with pytest.raises(grpc.RpcError) as busy:
        channel.unary_unary(EXPORT_PATH)(bytes(5000), timeout=10)
    assert busy.value.code() is grpc.StatusCode.UNAVAILABLE


def _framed(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(message)) + message


@pytest.mark.parametrize(
    ("headers", "body", "code"),
    [
        ({"content-type": "application/json"}, _framed(b""), Code.INVALID_ARGUMENT),
        ({"content-type": "application/grpc+json"}, _framed(b"{}"), Code.UNIMPLEMENTED),
        ({"content-type": "application/grpc+proto"}, _framed(b""), Code.OK),
        ({}, b"\x00\x00", Code.INVALID_ARGUMENT),
        ({}, _framed(b"abc") + b"more", Code.INVALID_ARGUMENT),
        ({"grpc-encoding": "snappy"}, _framed(b"x", compressed=True), Code.UNIMPLEMENTED),
        ({"grpc-encoding": "gzip"}, _framed(b"not gzip", compressed=True), Code.INVALID_ARGUMENT),
        (
            {"grpc-encoding": "gzip"},
            _framed(gzip.compress(bytes(4096), mtime=0), compressed=True),
            Code.RESOURCE_EXHAUSTED,
        ),
        ({}, _framed(b""), Code.OK),
    ],
)
def test_export_checks_the_call_before_decoding(
    service: JoinService, headers: dict[str, str], body: bytes, code: int
) -> None:
    """Framing, content type and message encoding are checked, each with its status."""
    call = {":path": EXPORT_PATH, "content-type": "application/grpc", **headers}
    assert export(service, call, body, max_message=1000)[0] == code


@pytest.mark.loopback
def test_a_call_whose_message_stops_coming_is_answered_and_freed(
    service: JoinService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends part of a message, then only pings (the connection never idles):
    the call is answered DEADLINE_EXCEEDED and reset NO_ERROR once its data stopped for the
    call timeout, its bytes leave the buffer budget, and the connection takes the next call."""
    monkeypatch.setattr(receiver, "CALL_TIMEOUT_S", 0.5)
    grpc_receiver = GrpcReceiver(service, max_message=1 << 20)
    served = Served(grpc_receiver.serve)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    head = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "join"),
        (":path", EXPORT_PATH),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    events: list[h2.events.Event] = []
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:

            def exchange() -> None:
                sock.sendall(client.data_to_send())
                sock.settimeout(0.1)
                with contextlib.suppress(TimeoutError):
                    events.extend(client.receive_data(sock.recv(65536)))

            client.initiate_connection()
            client.send_headers(1, head)
            client.send_data(1, struct.pack(">BI", 0, 100) + b"0123456789")  # 10 of 100 bytes
            exchange()
            for _ in range(50):  # the receiver reads it: its 15 bytes count against the budget
                if served.call(lambda: grpc_receiver.buffered) == 15:
                    break
                exchange()
            assert served.call(lambda: grpc_receiver.buffered) == 15
            ended = set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # pings keep the connection busy meanwhile
                client.ping(b"12345678")
                exchange()
                time.sleep(0.05)
                ended = {type(e) for e in events if getattr(e, "stream_id", None) == 1}
                if h2.events.StreamReset in ended:
                    break
            trailers = [
                dict(e.headers) for e in events if isinstance(e, h2.events.ResponseReceived)
            ]
            assert trailers and trailers[0][b"grpc-status"] == b"4"
            assert h2.events.StreamReset in ended
            assert served.call(lambda: grpc_receiver.buffered) == 0
            assert served.call(lambda: service.requests["grpc", "DEADLINE_EXCEEDED"]) == 1
            client.send_headers(3, head)
            client.send_data(3, _framed(b""), end_stream=True)  # an empty export: OK
            for _ in range(50):
                exchange()
                if any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in events):
                    break
            (last,) = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
            assert dict(last.headers)[b"grpc-status"] == b"0"
    finally:
        served.close()
