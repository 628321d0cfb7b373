"""Where finished flows and notices go, and where hopmeter's own faults are counted.

`Observers` holds the observers (hopmeter.export.FlowObserver: the outputs of
hopmeter.proxy.addon.outputs, mitmweb's view, a script's own) and calls each in a guard: one that
raises is counted as an internal error and the others still run. `internal_error` is what every
measuring step calls when it fails (the stream taps from their `except` clauses), so it never
raises; it counts (`hopmeter_internal_errors_total{where}`, through the observers) and logs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

from hopmeter.errors import said
from hopmeter.export import FlowObserver
from hopmeter.log import get_logger

log = get_logger()


class Observed(Protocol):
    """What an output needs of the addon it observes: to be added and removed."""

    def add_observer(self, observer: FlowObserver) -> None: ...

    def remove_observer(self, observer: FlowObserver) -> None: ...


class Observers:
    """The observers, called in order, each guarded; and the count of internal errors."""

    def __init__(self) -> None:
        self.observers: list[FlowObserver] = []
        self.internal_errors = 0

    def __iter__(self) -> Iterator[FlowObserver]:
        return iter(self.observers)

    def __contains__(self, observer: object) -> bool:
        return observer in self.observers

    def add_observer(self, observer: FlowObserver) -> None:
        """Hand every finished flow (and the stream and error notices) to `observer` too."""
        if observer not in self.observers:
            self.observers.append(observer)

    def remove_observer(self, observer: FlowObserver) -> None:
        """Stop handing flows to `observer`."""
        if observer in self.observers:
            self.observers.remove(observer)

    def notify(self, notice: Callable[[FlowObserver], None], where: str = "observer") -> None:
        """Call `notice` on every observer; one that raises is counted and the rest still run."""
        for obs in self.observers:
            try:
                notice(obs)
            except Exception as exc:
                self.internal_error(where, exc)

    def internal_error(self, where: str, exc: BaseException | None = None) -> None:
        """Count a bug in measuring code; the flow goes on unmeasured. Never raises.

        The stream taps call this from their `except` clauses, where an exception would escape
        into mitmproxy and drop a chunk: so an observer that fails here is not told again (no
        recursion) and not allowed out, and a failing log call is swallowed too.
        """
        self._count(where)
        with contextlib.suppress(Exception):
            log.warning(
                "hopmeter: measuring failed; the flow is forwarded unmeasured",
                where=where,
                error=said(exc) if exc else None,
            )

    def record_lost(self, where: str, exc: BaseException, flow_id: str | None) -> None:
        """Building a flow's record failed at `where` after its bytes went through: counted as
        an internal error there, and logged naming the flow whose record is lost. Never
        raises."""
        self._count(where)
        with contextlib.suppress(Exception):
            log.warning(
                "hopmeter: a flow's record could not be made and is lost (the flow itself went "
                "through, its bytes untouched)",
                where=where,
                flow_id=flow_id,
                error=said(exc),
            )

    def fast_path_failed(self, where: str, exc: BaseException) -> None:
        """A fault in one of `hopmeter run`'s fast paths past mitmproxy (framing, backpressure)
        before it had done anything: mitmproxy's own method took over. Counted and logged as an
        internal error; the flow goes on, measured. Never raises."""
        self._count(where)
        with contextlib.suppress(Exception):
            log.warning(
                "hopmeter: a fast path past mitmproxy failed; mitmproxy's own step took over",
                where=where,
                error=said(exc),
            )

    def relay_failed(self, error: str, cut: bool) -> None:
        """A fault in `hopmeter run`'s relay, counted and logged (see HopMeter.relay_failed).
        Never raises."""
        self._count("relay")
        with contextlib.suppress(Exception):
            if cut:
                log.warning(
                    "hopmeter: the relay failed while moving a read; the client's connection "
                    "was reset so that it can tell its response is not whole (recorded ended "
                    "error)",
                    error=error,
                )
            else:
                log.warning(
                    "hopmeter: the relay failed before moving a read; mitmproxy's layers move "
                    "the rest of this response",
                    error=error,
                )

    def _count(self, where: str) -> None:
        self.internal_errors += 1
        for obs in self.observers:
            with contextlib.suppress(Exception):  # the one place a failure can only be dropped
                obs.internal_error(where)
