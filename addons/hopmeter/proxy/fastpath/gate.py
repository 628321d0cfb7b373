"""Whether `hopmeter run`'s fast paths may be installed: the releases and code they were read in.

The relay repeats what mitmproxy's layers, h11's body readers and asyncio's stream reader do with
a read, and leans on their private state (hopmeter.proxy.fastpath.internals). A release that
changes any of it could make a repeated step differ from the real one, so at start `check()`
compares what is installed with what the fast paths were read against:

- the versions: mitmproxy's minor release, h11's, Python's (`SUPPORTED`);
- the code: a digest of the source of each function the fast paths mirror or lean on
  (`MIRRORED`), which must be one of those recorded in `FINGERPRINTS` for that function. A
  patch release that leaves them as they were passes; one that changes any of them does not.

On any difference the fast paths stay off (mitmproxy moves every read itself, as without
hopmeter's shortcuts), and the reason is one line naming what differed. The relay behind an
HTTP/2 upstream also leans on h2, whose releases mitmproxy's own requirement lets vary:
`check_h2_upstream()` compares h2's version and the code of what that part mirrors
(`SUPPORTED_H2`, `MIRRORED_H2`) apart, and a difference there turns off that part alone. `python -m
hopmeter.proxy.fastpath.gate` prints the digests of the running interpreter's libraries, to
record a new release once its code has been read.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import linecache
import sys
from collections.abc import Callable
from typing import Any

from mitmproxy import version as mitmproxy_version

from hopmeter.proxy.fastpath import h2_frames
from hopmeter.proxy.fastpath.internals import (
    BufferedH2Connection,
    ChunkedReader,
    ClientTLSLayer,
    ConnectionHandler,
    ContentLengthReader,
    FrameBuffer,
    H2Connection,
    H2ConnectionStateMachine,
    H2Stream,
    H2StreamStateMachine,
    Http1Client,
    Http1Connection,
    Http1Server,
    Http2Client,
    Http2Connection,
    Http2Server,
    Http10Reader,
    HttpClient,
    HttpLayer,
    HttpStream,
    Layer,
    NextLayer,
    TimeoutWatchdog,
    TLSLayer,
    TunnelLayer,
    WindowManager,
    chunk_header_re,
    make_body_reader,
)

# Releases whose code was read (a version is supported when it starts with one of these).
SUPPORTED: dict[str, tuple[str, ...]] = {
    "mitmproxy": ("12.0.", "12.1.", "12.2.", "12.3."),
    "h11": ("0.16.",),
    "python": ("3.12.", "3.13."),
}

# What the fast paths mirror or lean on, by the name a mismatch is reported with.
MIRRORED: dict[str, Any] = {
    # the read loop and its steps (the relay's server_event and ReadShortcut, backpressure)
    "mitmproxy ConnectionHandler.handle_connection": ConnectionHandler.handle_connection,
    "mitmproxy ConnectionHandler.server_event": ConnectionHandler.server_event,
    "mitmproxy ConnectionHandler.drain_writers": ConnectionHandler.drain_writers,
    "mitmproxy ConnectionHandler.close_connection": ConnectionHandler.close_connection,
    "mitmproxy TimeoutWatchdog.register_activity": TimeoutWatchdog.register_activity,
    # the layers a read passes through, and when they only pass it on
    "mitmproxy Layer.handle_event": Layer.handle_event,
    "mitmproxy NextLayer.handle_event": NextLayer.handle_event,
    "mitmproxy NextLayer._ask": NextLayer._ask,
    "mitmproxy HttpLayer._handle_event": HttpLayer._handle_event,
    "mitmproxy HttpLayer.event_to_child": HttpLayer.event_to_child,
    # where a request finds its upstream connection in the list `connections` prunes, where a
    # connection enters it, and where a connection's end is stamped (`timestamp_end`)
    "mitmproxy HttpLayer.get_connection": HttpLayer.get_connection,
    "mitmproxy HttpLayer.register_connection": HttpLayer.register_connection,
    "mitmproxy ConnectionHandler.open_connection": ConnectionHandler.open_connection,
    "mitmproxy HttpClient._handle_event": HttpClient._handle_event,
    "mitmproxy HttpStream.start_response_stream": HttpStream.start_response_stream,
    "mitmproxy HttpStream.state_stream_response_body": HttpStream.state_stream_response_body,
    "mitmproxy Http1Connection._handle_event": Http1Connection._handle_event,
    "mitmproxy Http1Connection.read_body": Http1Connection.read_body,
    "mitmproxy Http1Client.read_headers": Http1Client.read_headers,
    "mitmproxy Http1Server.send": Http1Server.send,
    "mitmproxy make_body_reader": make_body_reader,
    # the client's TLS layer: when it only passes a read on, and what it does with what is sent
    "mitmproxy TunnelLayer._handle_event": TunnelLayer._handle_event,
    "mitmproxy TunnelLayer._handle_command": TunnelLayer._handle_command,
    "mitmproxy TunnelLayer.event_to_child": TunnelLayer.event_to_child,
    "mitmproxy TLSLayer.send_data": TLSLayer.send_data,
    "mitmproxy TLSLayer.tls_interact": TLSLayer.tls_interact,
    # an upstream's TLS layer: it hands each read's plaintext to its child (`event_to_child`)
    "mitmproxy TLSLayer.receive_data": TLSLayer.receive_data,
    "mitmproxy ClientTLSLayer.receive_handshake_data": ClientTLSLayer.receive_handshake_data,
    # an HTTP/2 client's connection: what it does with a piece of the response's body
    "mitmproxy Http2Server._handle_event": Http2Server._handle_event,
    "mitmproxy Http2Connection._handle_event": Http2Connection._handle_event,
    "mitmproxy Http2Connection.is_open_for_us": Http2Connection.is_open_for_us,
    "mitmproxy BufferedH2Connection.send_data": BufferedH2Connection.send_data,
    # the body readers whose pieces and state the relay repeats
    "h11 ChunkedReader.__init__": ChunkedReader.__init__,
    "h11 ChunkedReader.__call__": ChunkedReader.__call__,
    "h11 ContentLengthReader.__call__": ContentLengthReader.__call__,
    "h11 Http10Reader.__call__": Http10Reader.__call__,
    "h11 chunk_header_re": chunk_header_re.pattern,
    # the stream reader and writer whose state the read shortcut and backpressure read
    "asyncio StreamReader.read": asyncio.StreamReader.read,
    "asyncio StreamReader._wait_for_data": asyncio.StreamReader._wait_for_data,  # type: ignore[attr-defined]
    "asyncio StreamReader.feed_data": asyncio.StreamReader.feed_data,
    "asyncio StreamReaderProtocol.data_received": asyncio.StreamReaderProtocol.data_received,
    "asyncio StreamWriter.drain": asyncio.StreamWriter.drain,
    "asyncio FlowControlMixin._drain_helper": (
        asyncio.streams.FlowControlMixin._drain_helper  # type: ignore[attr-defined]
    ),
}


def _getter(cls: type, name: str) -> Any:
    """The function behind `cls`'s property `name`."""
    return vars(cls)[name].fget


# The relay behind an HTTP/2 upstream (hopmeter.proxy.fastpath.h2_upstream): h2's releases read,
# and what it mirrors or leans on, in mitmproxy's HTTP/2 client and in h2.
SUPPORTED_H2: dict[str, tuple[str, ...]] = {"h2": ("4.3.", "4.4.")}
MIRRORED_H2: dict[str, Any] = {
    # what mitmproxy's HTTP/2 client does with a read of DATA frames
    "mitmproxy Http2Client._handle_event": Http2Client._handle_event,
    "mitmproxy Http2Client._handle_event2": Http2Client._handle_event2,
    "mitmproxy Http2Client.handle_h2_event": Http2Client.handle_h2_event,
    "mitmproxy Http2Connection.handle_h2_event": Http2Connection.handle_h2_event,
    "mitmproxy Http2Connection.close_connection": Http2Connection.close_connection,
    "mitmproxy BufferedH2Connection.receive_data": BufferedH2Connection.receive_data,
    # what h2 does with them: the checks a frame passes, the events it gives, the acknowledgement
    "h2 H2Connection.receive_data": H2Connection.receive_data,
    "h2 H2Connection._receive_frame": H2Connection._receive_frame,
    "h2 H2Connection._receive_data_frame": H2Connection._receive_data_frame,
    "h2 H2Connection._get_stream_by_id": H2Connection._get_stream_by_id,
    "h2 H2Connection.acknowledge_received_data": H2Connection.acknowledge_received_data,
    "h2 H2Connection.inbound_flow_control_window": _getter(
        H2Connection, "inbound_flow_control_window"
    ),
    "h2 H2Stream.receive_data": H2Stream.receive_data,
    "h2 H2Stream._track_content_length": H2Stream._track_content_length,
    "h2 H2Stream.inbound_flow_control_window": _getter(H2Stream, "inbound_flow_control_window"),
    "h2 FrameBuffer.add_data": FrameBuffer.add_data,
    "h2 FrameBuffer.__next__": FrameBuffer.__next__,
    "h2 FrameBuffer._update_header_buffer": FrameBuffer._update_header_buffer,
    "h2 WindowManager.window_consumed": WindowManager.window_consumed,
}

# The relay's own steps for an HTTP/2 DATA frame (hopmeter.proxy.fastpath.h2_frames):
# what they stand in for, received (behind an HTTP/2 upstream) and sent (to an HTTP/2 client).
MIRRORED_H2_FRAMES: dict[str, Any] = {
    "mitmproxy BufferedH2Connection.send_data": BufferedH2Connection.send_data,
    "h2 H2Connection.send_data": H2Connection.send_data,
    "h2 H2Connection.local_flow_control_window": H2Connection.local_flow_control_window,
    "h2 H2Connection._prepare_for_sending": H2Connection._prepare_for_sending,
    "h2 H2Connection.data_to_send": H2Connection.data_to_send,
    "h2 H2Connection._receive_data_frame": H2Connection._receive_data_frame,
    "h2 H2Connection.acknowledge_received_data": H2Connection.acknowledge_received_data,
    "h2 H2ConnectionStateMachine.process_input": H2ConnectionStateMachine.process_input,
    "h2 H2Stream.send_data": H2Stream.send_data,
    "h2 H2Stream.receive_data": H2Stream.receive_data,
    "h2 H2Stream.acknowledge_received_data": H2Stream.acknowledge_received_data,
    "h2 H2Stream._track_content_length": H2Stream._track_content_length,
    "h2 H2StreamStateMachine.process_input": H2StreamStateMachine.process_input,
    "h2 H2StreamStateMachine.data_received": H2StreamStateMachine.data_received,
    "h2 WindowManager.window_consumed": WindowManager.window_consumed,
    "h2 WindowManager.process_bytes": WindowManager.process_bytes,
}

# The first 16 hex digits of the sha256 of each mirrored function's source (inspect.getsource;
# a pattern's text), and the releases it was read in: `python -m hopmeter.proxy.fastpath.gate` on
# Python 3.12.1 and 3.13.0, with each mitmproxy 12 release and each h2 release listed installed
# in turn (the code of each from its release's wheel on PyPI).
_M12 = "mitmproxy 12.0.1, 12.1.2, 12.2.0, 12.2.3, 12.3.0, 12.3.1"
_M12_2 = "mitmproxy 12.0.1, 12.1.2, 12.2.0, 12.2.3"
_M12_3 = "mitmproxy 12.3.0, 12.3.1"  # a comment's spelling mended: the same code
_M12_30 = "mitmproxy 12.0.1, 12.1.2, 12.2.0, 12.2.3, 12.3.0"
_M12_31 = "mitmproxy 12.3.1"  # `data: Buffer` for `data: bytes`: the same code
_H11 = "h11 0.16.0"
_H2 = "h2 4.3.0, 4.4.0, 4.4.1"
_H2_3 = "h2 4.3.0"
_H2_4 = "h2 4.4.0, 4.4.1"  # memoryviews for bytes, comments' spelling: the same code
_PY = "Python 3.12.1, 3.13.0"
FINGERPRINTS: dict[str, dict[str, str]] = {
    "mitmproxy ConnectionHandler.handle_connection": {"95c3f93e9824e527": _M12},
    "mitmproxy ConnectionHandler.server_event": {"a2b42657ebe8bf6d": _M12},
    "mitmproxy ConnectionHandler.drain_writers": {"6b57434604561e3e": _M12},
    "mitmproxy ConnectionHandler.close_connection": {"c0d10cc05dd65b80": _M12},
    "mitmproxy TimeoutWatchdog.register_activity": {"41e033f7debf79d3": _M12},
    "mitmproxy Layer.handle_event": {"fd88b0fb09ceddbb": _M12},
    "mitmproxy NextLayer.handle_event": {"4e9724eb64588ac2": _M12},
    "mitmproxy NextLayer._ask": {"4d8ace76d8488336": _M12},
    "mitmproxy HttpLayer._handle_event": {"6ba31883cc7a06b3": _M12},
    "mitmproxy HttpLayer.get_connection": {"1aa1c63e3175766c": _M12},
    "mitmproxy HttpLayer.register_connection": {"deed6282affc431f": _M12},
    "mitmproxy ConnectionHandler.open_connection": {"5e0b3cbaf7a4030a": _M12},
    "mitmproxy HttpLayer.event_to_child": {"1095f6e1581d1780": _M12},
    "mitmproxy HttpClient._handle_event": {"bc1cae775a49a4fe": _M12},
    "mitmproxy HttpStream.start_response_stream": {"b0de9e9a5ee27276": _M12},
    "mitmproxy HttpStream.state_stream_response_body": {"3fb6320300d3ddd5": _M12},
    "mitmproxy Http1Connection._handle_event": {"2ac8db3e43ae743f": _M12},
    "mitmproxy Http1Connection.read_body": {"aece271029af36e4": _M12},
    "mitmproxy Http1Client.read_headers": {"415454c5fa8b5981": _M12},
    "mitmproxy Http1Server.send": {"cc218a1337c0f5cf": _M12},
    "mitmproxy make_body_reader": {"9b076acda459637b": _M12},
    "mitmproxy TunnelLayer._handle_event": {"00676a887c456cec": _M12},
    "mitmproxy TunnelLayer._handle_command": {"11ede598b3b37965": _M12},
    "mitmproxy TunnelLayer.event_to_child": {"119a33642637d420": _M12},
    "mitmproxy TLSLayer.send_data": {"35a29a1b0b0cb184": _M12},
    "mitmproxy TLSLayer.tls_interact": {"62d6d57d43dd1a2e": _M12},
    "mitmproxy TLSLayer.receive_data": {"85c0e6b656c324e5": _M12},
    "mitmproxy ClientTLSLayer.receive_handshake_data": {"a0ee021f92f6d0ff": _M12},
    "mitmproxy Http2Server._handle_event": {"7282fa18e70a3eaa": _M12},
    "mitmproxy Http2Connection._handle_event": {
        "a7f4a7a71d31074b": _M12_2,
        "7fc814a8a507f234": _M12_3,
    },
    "mitmproxy Http2Connection.is_open_for_us": {"ada9ae25ced6deaf": _M12},
    "mitmproxy BufferedH2Connection.send_data": {"eeb7918d96b19708": _M12},
    "mitmproxy Http2Client._handle_event": {"02de05a5b89f087b": _M12},
    "mitmproxy Http2Client._handle_event2": {"a3b722b18c3f46fa": _M12},
    "mitmproxy Http2Client.handle_h2_event": {"ff6f4bd9271693b8": _M12},
    "mitmproxy Http2Connection.handle_h2_event": {"f6b6a52b12548102": _M12},
    "mitmproxy Http2Connection.close_connection": {"44b76ed198e7916a": _M12},
    "mitmproxy BufferedH2Connection.receive_data": {
        "7dd57c12dc7ead79": _M12_30,
        "1ebc3cf9b6b1e3d6": _M12_31,
    },
    "h2 H2Connection.receive_data": {"23c10edc87abe72d": _H2_3, "4470c8fafce8153a": _H2_4},
    "h2 H2Connection._receive_frame": {"39b2e16b4fd74ed0": _H2},
    "h2 H2Connection._receive_data_frame": {"09803eef3f564140": _H2},
    "h2 H2Connection._get_stream_by_id": {"1e663cf23fe28e33": _H2},
    "h2 H2Connection.acknowledge_received_data": {"a4280c825a0c3987": _H2},
    "h2 H2Connection.inbound_flow_control_window": {"6c294fa4153650f8": _H2},
    "h2 H2Stream.receive_data": {"50acc2e021f36c39": _H2},
    "h2 H2Stream._track_content_length": {"a4580a2f3c858963": _H2},
    "h2 H2Stream.inbound_flow_control_window": {"725d632fedd3fa2a": _H2},
    "h2 FrameBuffer.add_data": {"0913882b32ea9f9e": _H2_3, "887d4a892f823f4a": _H2_4},
    "h2 FrameBuffer.__next__": {
        "6d36dd5061e8a22a": "h2 4.3.0, 4.4.0",
        "54792a1319f7ef52": "h2 4.4.1",  # the consumed frame deleted in place: the same bytes
    },
    "h2 FrameBuffer._update_header_buffer": {"754ab91814882ca9": _H2_3, "e32970a56626afcc": _H2_4},
    "h2 WindowManager.window_consumed": {"db17e4434e9a0aca": _H2},
    # the relay's own DATA frame steps (h2_frames); 4.4 sends a memoryview's bytes and an empty
    # frame on a closed window, which it never takes: the same code for it
    "h2 H2Connection.send_data": {"a4ee8a23830f1974": _H2_3, "9f67cb77f02c01d0": _H2_4},
    "h2 H2Connection.local_flow_control_window": {"e8b7dd814ce6bc1d": _H2},
    "h2 H2Connection._prepare_for_sending": {"6be16b5970454a30": _H2},
    "h2 H2Connection.data_to_send": {"d681c42548b1f8cc": _H2},
    "h2 H2ConnectionStateMachine.process_input": {"6b63d1d8847896ff": _H2},
    "h2 H2Stream.send_data": {"c185563e5dc31679": _H2_3, "9742a001ccca6af7": _H2_4},
    "h2 H2Stream.acknowledge_received_data": {"c1e0fcca00665e73": _H2},
    "h2 H2StreamStateMachine.process_input": {"26e4dd5f305754ee": _H2},
    "h2 H2StreamStateMachine.data_received": {"403edf4d8eec67ad": _H2},
    "h2 WindowManager.process_bytes": {"fcefd87a1d0d0ee6": _H2},
    "h11 ChunkedReader.__init__": {"232ef6fe23fd20ab": _H11},
    "h11 ChunkedReader.__call__": {"2618d847a89a1505": _H11},
    "h11 ContentLengthReader.__call__": {"83205782bcb1dcf6": _H11},
    "h11 Http10Reader.__call__": {"dd4e39bb717b9ccc": _H11},
    "h11 chunk_header_re": {"b098c5209a1ea966": _H11},
    "asyncio StreamReader.read": {"b3e781f2317fe198": _PY},
    "asyncio StreamReader._wait_for_data": {"3064c5757b9dd9af": _PY},
    "asyncio StreamReader.feed_data": {"f1dc194f7bceb07d": _PY},
    "asyncio StreamReaderProtocol.data_received": {"e57e2bc9772342e5": _PY},
    "asyncio StreamWriter.drain": {"31d717c85b1be487": _PY},
    "asyncio FlowControlMixin._drain_helper": {"567c79b19c953058": _PY},
}


def version_of(library: str) -> str:
    """The version of `library` ("python": the interpreter's) the running code comes from."""
    if library == "python":
        return ".".join(map(str, sys.version_info[:3]))
    if library == "mitmproxy":
        return str(mitmproxy_version.VERSION)
    return str(importlib.import_module(library).__version__)


def fingerprint(obj: Any) -> str:
    """The digest of a function's source (a pattern's text), as FINGERPRINTS records it."""
    raw = obj if isinstance(obj, bytes) else inspect.getsource(obj).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def check(
    version: Callable[[str], str] = version_of, digest: Callable[[Any], str] = fingerprint
) -> str | None:
    """None when the fast paths may be installed; else one line naming what differs.

    Run once, before the proxy starts. The sources `inspect` reads for the digests go through
    `linecache`, which would keep every line of each file for the process's life (objects a
    full collection walks, files a traceback's `checkcache` stats): the entries it adds are
    dropped again, so nothing of the check stays behind for the flows.
    """
    why = _uncached(_check, version, digest, SUPPORTED, MIRRORED)
    return None if why is None else _off(why)


def check_h2_upstream(
    version: Callable[[str], str] = version_of, digest: Callable[[Any], str] = fingerprint
) -> str | None:
    """None when the relay may be armed behind an HTTP/2 upstream (the fast paths installed);
    else one line naming what differs in h2 or in mitmproxy's HTTP/2 client. As `check`."""
    why = _uncached(_check, version, digest, SUPPORTED_H2, MIRRORED_H2)
    return None if why is None else _off_h2(why)


def check_h2_frames(
    version: Callable[[str], str] = version_of, digest: Callable[[Any], str] = fingerprint
) -> str | None:
    """None when the relay may take an HTTP/2 DATA frame's steps itself (h2_frames); else one
    line naming what differs in h2 (then h2 takes every frame, as it does for mitmproxy)."""
    why = _uncached(_check, version, digest, SUPPORTED_H2, MIRRORED_H2_FRAMES)
    if why is None:
        why = h2_frames.check()
    return None if why is None else _off_h2_frames(why)


def _uncached(check: Callable[..., str | None], *args: Any) -> str | None:
    """`check(*args)`, with what it added to `linecache` dropped again."""
    cached = set(linecache.cache)
    try:
        return check(*args)
    finally:
        for name in set(linecache.cache) - cached:
            linecache.cache.pop(name, None)


def _check(
    version: Callable[[str], str],
    digest: Callable[[Any], str],
    supported: dict[str, tuple[str, ...]],
    mirrored: dict[str, Any],
) -> str | None:
    for library, prefixes in supported.items():
        try:
            found = version(library)
        except Exception:  # not installed as a distribution (a vendored copy): unknown
            found = "of unknown version"
        if not found.startswith(prefixes):
            read = ", ".join(p.rstrip(".") for p in prefixes)
            return f"{library} {found} is not a release they were read against ({read})"
    changed = []
    for name, obj in mirrored.items():
        try:
            seen = digest(obj)
        except Exception:  # no source to read (a frozen build): cannot be compared
            seen = "unreadable"
        if seen not in FINGERPRINTS.get(name, {}):
            changed.append(name)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        library, _, function = changed[0].partition(" ")
        where = f"{library} {version(library) if library != 'asyncio' else version('python')}"
        return f"{where}'s {function} is not the code they were read against{more}"
    return None


def _off(why: str) -> str:
    return (
        f"hopmeter: the relay and the other fast paths are off: {why}; every read goes "
        f'through mitmproxy\'s own layers (hopmeter_relay_declined_total{{reason="version"}})'
    )


def _off_h2(why: str) -> str:
    return (
        f"hopmeter: the relay behind HTTP/2 upstreams is off: {why}; their reads go through "
        f'mitmproxy\'s own layers (hopmeter_relay_declined_total{{reason="version"}})'
    )


def _off_h2_frames(why: str) -> str:
    return (
        f"hopmeter: the relay's own HTTP/2 DATA frame steps are off: {why}; h2 takes every "
        "frame the relay moves (the relay stays on)"
    )


def main() -> None:
    """Print the running interpreter's fingerprints, to record them in FINGERPRINTS."""
    where = {
        "mitmproxy": version_of("mitmproxy"),
        "h11": version_of("h11"),
        "h2": version_of("h2"),
        "asyncio": version_of("python"),
    }
    for name, obj in (MIRRORED | MIRRORED_H2 | MIRRORED_H2_FRAMES).items():
        print(f"{name}\t{fingerprint(obj)}\t{where[name.split(' ', 1)[0]]}")


if __name__ == "__main__":
    main()
