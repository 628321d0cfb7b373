"""One client connection's bytes, from the write that carried each chunk to the kernel sending it.

The stream callable stamps when a chunk was *read*; mitmproxy then writes it to the client's
transport in the same synchronous step. What happens next is the client's side: the transport's
user-space buffer drains as the kernel takes the bytes, and the kernel's send queue drains as the
client's TCP window lets it send. The proxy layer (hopmeter.proxy.delivery.lane) counts the bytes
written to the client's transport and samples the two queues (the buffer's length and Linux's
SIOCOUTQNSD); this module turns those byte counts into per-chunk times, with no clock and no
socket of its own (docs/design.md §4, "delivery").

Every queue is first in, first out, so with `written` the bytes handed to the transport so far and
a chunk's `END` the value of `written` right after the write that carried its last byte:

    the chunk left the process  <=>  written - user_buffered           >= END
    the kernel sent it          <=>  written - user_buffered - unsent  >= END

Bytes queued before counting began are ahead of every counted byte and cancel out. A chunk seen
by a sample is only known to have passed between that sample and the one before, so each chunk
keeps the last moment it was *seen waiting* (`WAITED`): client wait is built from those lower
bounds and can come out short by a sampling interval, never long.

HTTP/2 adds a stage before the socket: mitmproxy keeps a stream's bytes in its own per-stream
buffer while the client's flow-control window is closed (`hold` / `release`).

Memory: a ledger and a flow's FlowChunks live as long as a connection or a stream, so their queues
are plain lists taken from the head by slicing (an empty deque holds a 64-slot block, ~760 bytes),
and the per-chunk columns that almost never differ from another are kept only once they do.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

# A tracked chunk is a plain list: it is built on the proxy's hot path, once per chunk, where a
# list of ten costs ~95 ns and an object with ten slots ~340 ns (measured, CPython 3.12). These
# name its slots; times are the proxy's monotonic clock, in seconds.
N = 0  # bytes the stream callable returned for the chunk
T_IN = 1  # when the stream callable read it
END = 2  # `written` right after the write that carried its last byte; -1 until written
T_WRITE = 3  # when mitmproxy handed it to the client's transport
OUT = 4  # its last byte left the process: T_WRITE when the write took it at once, else a sample
SENT = 5  # the first sample that saw the kernel had sent its last byte
WAITED = 6  # the last moment it was seen waiting on the client (None: never seen waiting)
GONE = 7  # why it stopped being followed before it was seen sent (None: still followed or sent)
HELD = 8  # HTTP/2: it waited in mitmproxy's stream buffer for the client's window
H2_END = 9  # HTTP/2: the stream's bytes handed to mitmproxy up to and including this chunk
SLOTS = 10

# Chunks followed at once on one client connection (in the buffers or HTTP/2 stream buffers).
# A record lists at most 4,096 chunks a flow (core.meter.MAX_CHUNKS); HTTP/2 runs streams side by
# side, and 16,384 covers four full flows at once. Past it, a chunk is not followed (GONE).
MAX_FOLLOWED = 16_384

# Reasons a chunk was not followed to the end, as records show them.
NO_WRITE = "no write carried the chunk"
SHORT_WRITE = "a write shorter than the chunk came first"
TOO_MANY = "too many chunks queued on this connection"


def new_chunk(n: int, t_in: float) -> list[Any]:
    """A chunk of `n` bytes read at `t_in`, not yet written."""
    return [n, t_in, -1, None, None, None, None, None, False, 0]


class Ledger:
    """One client connection's bytes, from the stream callable to the kernel's send queue.

    The proxy layer calls `arm` from the stream callable, `wrote` from its wrapper around the
    transport's write, and `sample` whenever it has read the two queues' lengths.
    """

    __slots__ = ("armed", "held", "kernel", "last", "user", "written")

    def __init__(self) -> None:
        self.written = 0  # bytes handed to the transport since counting began
        self.last = -math.inf  # when the last sample was taken (none yet)
        self.armed: list[Any] | None = None  # the chunk the next write carries
        # first in, first out; taken from the head a run at a time (`del q[:k]`)
        self.user: list[list[Any]] = []  # written, maybe still in the user-space buffer
        self.kernel: list[list[Any]] = []  # out of the process, not yet seen sent
        self.held: dict[int, list[list[Any]]] = {}  # HTTP/2 stream id -> chunks in its buffer

    def followed(self) -> int:
        """Chunks followed now."""
        return len(self.user) + len(self.kernel) + sum(map(len, self.held.values()))

    def pending(self) -> bool:
        """Whether any chunk still waits to be seen sent."""
        return bool(self.user or self.kernel or self.held)

    def arm(self, c: list[Any]) -> None:
        """The next write carries chunk `c` (the stream callable returns it, mitmproxy writes it
        in the same step). A chunk still armed never got its write: it is not followed."""
        if self.armed is not None:
            self.armed[GONE] = NO_WRITE
        self.armed = c

    def disarm(self) -> None:
        """The step that armed a chunk ended without writing it (seen by a later sample)."""
        if self.armed is not None:
            self.armed[GONE] = NO_WRITE
            self.armed = None

    def wrote(self, nbytes: int, now: float, buffered: bool) -> bool:
        """A write of `nbytes` returned at `now`, leaving the user-space buffer non-empty or not.

        True when it carried the armed chunk and that chunk is now followed. A write shorter than
        the chunk is not its write (framing and encryption only add bytes): the chunk is dropped
        rather than guessed at.
        """
        self.written += nbytes
        c = self.armed
        if c is None:
            return False
        self.armed = None
        if nbytes < c[N]:
            c[GONE] = SHORT_WRITE
            return False
        if len(self.user) + len(self.kernel) >= MAX_FOLLOWED:
            c[GONE] = TOO_MANY
            return False
        c[END] = self.written
        c[T_WRITE] = now
        if buffered:  # send() did not take it all: its tail waits in user space
            c[WAITED] = now
            self.user.append(c)
            return True
        # the buffer is empty after this write, so every byte before it has left too
        user, kernel = self.user, self.kernel
        if user:
            for b in user:
                b[OUT] = now
                b[WAITED] = max(b[T_WRITE], self.last)
            kernel += user
            user.clear()
        c[OUT] = now
        kernel.append(c)
        return True

    def sample(self, now: float, prev: float, user_bytes: int, unsent_bytes: int) -> bool:
        """The user-space buffer held `user_bytes` and the kernel `unsent_bytes` not yet sent, at
        `now`; the previous sample was at `prev`. True when some chunk moved on.

        A chunk that moves on was still waiting at `prev` if it was already in that stage then,
        so `prev` becomes its last moment seen waiting.
        """
        self.last = now
        out_bytes = self.written - user_bytes
        sent_bytes = out_bytes - unsent_bytes
        user, kernel = self.user, self.kernel
        k = 0
        for c in user:
            if c[END] > out_bytes:
                break
            c[OUT] = now
            c[WAITED] = max(c[T_WRITE], prev)
            k += 1
        if k:
            kernel += user[:k]
            del user[:k]
        j = 0
        for c in kernel:
            if c[END] > sent_bytes:
                break
            c[SENT] = now
            if c[OUT] <= prev:  # in the kernel at the last sample, and not sent then
                c[WAITED] = prev
            j += 1
        if j:
            del kernel[:j]
        return bool(k or j)

    def hold(self, c: list[Any], sid: int, stream_end: int) -> None:
        """HTTP/2: chunk `c` waits in stream `sid`'s buffer for the client's window."""
        c[HELD] = True
        c[H2_END] = stream_end
        c[WAITED] = c[T_IN]
        q = self.held.get(sid)
        if q is None:
            q = self.held[sid] = []
        if len(q) >= MAX_FOLLOWED:
            c[GONE] = TOO_MANY
            return
        q.append(c)

    def release(self, sid: int, emitted: int, now: float) -> bool:
        """HTTP/2: stream `sid` has handed `emitted` bytes to the connection by the write that just
        returned at `now`. Its chunks up to there are written: their frames are in this write or
        an earlier one, so `written` now is an upper bound of their end. True if any moved."""
        q = self.held.get(sid)
        if q is None:
            return False
        k = 0
        for c in q:
            if c[H2_END] > emitted:
                break
            c[END] = self.written
            c[T_WRITE] = c[WAITED] = now
            k += 1
        if k:
            self.user += q[:k]  # out of the process is left to a sample to see
            del q[:k]
        if not q:
            del self.held[sid]
        return k > 0

    def drop_stream(self, sid: int, why: str, now: float) -> None:
        """HTTP/2: stream `sid`'s buffer was dropped unsent (reset): its held chunks are gone."""
        for c in self.held.pop(sid, ()):
            c[GONE] = why
            c[WAITED] = now

    def give_up(self, why: str, last: float) -> None:
        """Stop following every chunk (the connection closed, or measuring failed); `last` is the
        last sample's time. What was seen stays: a chunk out of the process keeps its out time."""
        self.disarm()
        for c in self.user:
            c[WAITED] = max(c[T_WRITE], last)
            c[GONE] = why
        for c in self.kernel:
            if c[OUT] <= last:
                c[WAITED] = last
            c[GONE] = why
        for q in self.held.values():
            for c in q:
                c[WAITED] = max(c[T_IN], last)
                c[GONE] = why
        self.user.clear()
        self.kernel.clear()
        self.held.clear()


# Per-chunk flags in FlowChunks.flags.
FLAG_HELD, FLAG_SENT, FLAG_OUT = 1, 2, 4
_SENT_OUT = FLAG_SENT | FLAG_OUT  # the usual chunk's flags: sent, out at its write, not held
_OUT_BIT = bytes(f & FLAG_OUT for f in range(256))  # bytes.translate: a flags byte -> its FLAG_OUT


class FlowChunks:
    """One flow's followed chunks: those still moving as lists, the rest packed in arrays.

    A moving chunk costs ~200 bytes as a list; once it has been seen sent (or given up on) its
    times and flags are packed, so a long stream holds lists only for what is still on its way to
    the client. Packed, a chunk costs 9 bytes while every chunk of the flow left the process at its
    write and none was seen waiting (a client that keeps up); the `out` and `waited` columns (8
    bytes a chunk each) are made, filled back for the chunks before, at the first chunk that needs
    them: then 17 or 25 bytes a chunk for the whole flow. They read back whole either way.
    """

    __slots__ = ("_out", "_waited", "flags", "live", "t_write", "why")

    def __init__(self) -> None:
        self.live: list[list[Any]] = []  # in order; packed from the head
        self.t_write = array("d")  # nan: never written
        self._out: array[float] | None = None  # None: every chunk out at its write, or never out
        self._waited: array[float] | None = None  # None: no chunk seen waiting
        self.flags = bytearray()
        self.why: str | None = None  # the first reason a chunk was not followed to the end

    def __len__(self) -> int:
        return len(self.flags) + len(self.live)

    @property
    def out(self) -> array[float]:
        """When each packed chunk's last byte left the process (nan: never seen out)."""
        if self._out is not None:
            return self._out
        out = array("d", self.t_write)  # out at its write, but where no sample saw it out
        seen = self.flags.translate(_OUT_BIT)
        i = seen.find(0)
        while i >= 0:
            out[i] = math.nan
            i = seen.find(0, i + 1)
        return out

    @property
    def waited(self) -> array[float]:
        """The last moment each packed chunk was seen waiting (nan: never seen waiting)."""
        if self._waited is not None:
            return self._waited
        return array("d", [math.nan]) * len(self.flags)

    def add(self, c: list[Any]) -> None:
        """Follow chunk `c` (the proxy's FlowOut appends it as the stream callable makes it)."""
        self.live.append(c)

    def pack(self) -> None:
        """Move the chunks at the head that are done (sent or given up on) into the arrays.

        While neither the `out` nor the `waited` column is kept, the usual chunk (sent, out at
        its write, never held nor seen waiting) is packed inline: `_put`'s two appends for it,
        without the call. Any other chunk goes through `_put` (tests/core/test_ledger.py holds
        the two together).
        """
        live = self.live
        k = 0
        plain = self._out is None and self._waited is None
        for c in live:
            if c[SENT] is None and c[GONE] is None:
                break
            k += 1
            if (
                plain
                and c[GONE] is None
                and c[WAITED] is None
                and not c[HELD]
                and c[OUT] is not None
                and c[OUT] == c[T_WRITE]
            ):
                self.t_write.append(c[T_WRITE])
                self.flags.append(_SENT_OUT)
            else:
                self._put(c)
                plain = self._out is None and self._waited is None
        if k:
            del live[:k]

    def _put(self, c: list[Any]) -> None:
        if c[GONE] is not None and self.why is None:
            self.why = c[GONE]
        nan = math.nan
        t_write, out, waited = c[T_WRITE], c[OUT], c[WAITED]
        if self._out is not None:
            self._out.append(nan if out is None else out)
        elif out is not None and out != t_write:  # the first chunk that left after its write
            self._out = self.out
            self._out.append(out)
        if waited is not None:
            if self._waited is None:  # the first chunk seen waiting
                self._waited = self.waited
            self._waited.append(waited)
        elif self._waited is not None:
            self._waited.append(nan)
        self.t_write.append(nan if t_write is None else t_write)
        flags = (FLAG_HELD if c[HELD] else 0) | (FLAG_SENT if c[SENT] is not None else 0)
        self.flags.append(flags | (FLAG_OUT if out is not None else 0))

    def done(self) -> bool:
        """Whether every chunk was seen sent or given up on."""
        self.pack()
        return not self.live

    def settle(self, why: str) -> None:
        """Pack everything, chunks still on their way included (they count as not seen sent)."""
        self.pack()
        for c in self.live:
            if c[SENT] is None and c[GONE] is None and self.why is None:
                self.why = why
            self._put(c)
        self.live.clear()
