"""bench/client.py counts and times every event, even one a proxy's chunk framing cut in two."""

from __future__ import annotations

from tests.harness.bench import bench_module

EVENT = b'data: {"t":1700000000000000000,"l":-22,"choices":[]}\n\n'


def test_an_event_cut_anywhere_after_its_mark_is_read_whole() -> None:
    # mitmproxy under load frames each read as a chunk of its own, so a chunk's framing may
    # land inside an event's numbers; such a cut once crashed the client (int(b'd\r\nl":-22'))
    client = bench_module("client")
    mark_end = EVENT.index(b'{"t":') + len(b'{"t":')
    for cut in range(mark_end, len(EVENT)):
        head, tail = EVENT[:cut], EVENT[cut:]
        body = b"%x\r\n%s\r\n%x\r\n%s\r\n" % (len(head), head, len(tail), tail)
        sink = client.Sink((0, 1 << 62))
        seen, _ = client.scan(sink, body, 1700000000000000100, 1700000000000000300)
        assert seen == 1, cut
        assert (sink.kernel_ns[0], sink.user_ns[0], sink.late_us[0]) == (100, 300, -22), cut
