"""The OTLP/HTTP receiver: the spec's status codes, bounded bodies, answers before alignment."""

from __future__ import annotations

import gzip
import http.client
import socket
import zlib
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from hopmeter.join import http as receiver
from hopmeter.join.http import HttpReceiver, TooLarge, decompress
from hopmeter.join.service import JoinService
from tests.harness.otlp import hop_span, post, request_of
from tests.join.conftest import Served

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
EDGE = bytes.fromhex("00f067aa0ba902b7")
ORIGIN = bytes.fromhex("b7ad6b7169203331")


@pytest.fixture
def served(service: JoinService) -> Iterator[Served]:
    s = Served(HttpReceiver(service, max_body=1 << 20).serve)
    yield s
    s.close()


def test_decompress_takes_gzip_deflate_and_identity() -> None:
    """gzip, zlib-wrapped and raw deflate and no encoding all give the body back."""
    body = b"spans" * 100
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decompress(gzip.compress(body), "gzip", 1000) == body
    assert decompress(zlib.compress(body), "deflate", 1000) == body
    assert decompress(raw.compress(body) + raw.flush(), "deflate", 1000) == body
    assert decompress(body, "", 1000) == body


def test_decompress_stops_at_the_limit_and_refuses_what_it_cannot_read() -> None:
    """A bomb stops at the limit, a cut body and an unknown encoding raise."""
    with pytest.raises(TooLarge):
        decompress(gzip.compress(bytes(10_000)), "gzip", 1000)
    with pytest.raises(zlib.error):
        decompress(gzip.compress(b"spans" * 100)[:-10], "gzip", 1000)
    with pytest.raises(LookupError):
        decompress(b"x", "br", 1000)


@pytest.mark.loopback
def test_a_pair_is_joined_over_one_keep_alive_connection(
    served: Served, service: JoinService
) -> None:
    """Two requests on one connection, the edge's then the origin's span: both 200, and the
    segment is aligned once the second is answered."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    for span in (hop_span(TRACE, EDGE), hop_span(TRACE, ORIGIN, hop="origin", parent=EDGE)):
        conn.request(
            "POST",
            "/v1/traces",
            request_of([span]).SerializeToString(),
            {"content-type": receiver.PROTOBUF},
        )
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("content-type") == receiver.PROTOBUF
        assert not ExportTraceServiceResponse.FromString(response.read()).HasField(
            "partial_success"
        )
    conn.close()
    assert served.call(lambda: service.segments) == {"true": 1, "false": 0}
    assert served.call(lambda: service.requests["http", "200"]) == 2


@pytest.mark.loopback
def test_json_requests_get_json_answers(served: Served) -> None:
    """An OTLP JSON request is answered in JSON."""
    status, headers, body = post(served.port, b"{}", "application/json; charset=utf-8")
    assert (status, headers["content-type"], body) == (200, "application/json", b"{}")


@pytest.mark.loopback
def test_a_declared_body_over_the_limit_is_413_and_the_upload_is_drained(served: Served) -> None:
    """Content-Length over the limit is answered 413 at once, and the client, still uploading,
    reads it rather than a reset."""
    assert post(served.port, bytes(3 << 20))[0] == 413


@pytest.mark.loopback
def test_a_chunked_body_over_the_limit_is_413(served: Served) -> None:
    """A body without Content-Length is cut off at the limit too."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        chunk = bytes(256 * 1024)
        for _ in range(5):
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413 ")


@pytest.mark.loopback
def test_past_the_buffer_budget_new_bodies_get_503_retry_after(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When bodies in flight would pass the budget, the answer is 503 with Retry-After."""
    monkeypatch.setattr(receiver, "MAX_BUFFERED", 100)
    status, headers, _ = post(served.port, bytes(200))
    assert status == 503 and headers["retry-after"] == "1"


@pytest.mark.loopback
def test_a_client_sending_a_large_body_reads_the_503_not_a_reset(
    service: JoinService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 answered before the body is read is followed by reading and discarding the body
    a while: a client still sending its 24 MB body (more than the sockets hold) gets the 503
    (and retries), not a reset."""
    monkeypatch.setattr(receiver, "MAX_BUFFERED", 100)
    body = bytes(24 << 20)
    big = Served(HttpReceiver(service, max_body=32 << 20).serve)
    try:
        with socket.create_connection(("127.0.0.1", big.port), timeout=10) as sock:
            head = (
                "POST /v1/traces HTTP/1.1\r\nhost: x\r\n"
                f"content-type: application/x-protobuf\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)  # a reset raises here, or at the read
            reply = sock.recv(4096)
    finally:
        big.close()
    assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply.lower()


@pytest.mark.loopback
def test_bad_http_is_counted_and_closed(served: Served, service: JoinService) -> None:
    """A request line that is not HTTP closes the connection and is counted."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01 not http\r\n\r\n")
        assert sock.recv(4096) == b""
    assert served.call(lambda: service.requests["http", "bad_http"]) == 1
