"""Tests for hopmeter.proxy.addon.observers: every observer called, each guarded, and hopmeter's
own faults counted without ever raising."""

from __future__ import annotations

import logging

import pytest

from hopmeter.core.record import FlowResult
from hopmeter.export import FlowObserver
from hopmeter.proxy.addon.observers import Observers


class Noted(FlowObserver):
    """Notes what it is told."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def observe(self, result: FlowResult) -> None:
        self.notes.append(str(result.record["n"]))

    def internal_error(self, where: str) -> None:
        self.notes.append(f"error:{where}")


class Broken(FlowObserver):
    """Raises from every notice."""

    def observe(self, result: FlowResult) -> None:
        raise RuntimeError("observe")

    def internal_error(self, where: str) -> None:
        raise RuntimeError("internal_error")


def result(n: int) -> FlowResult:
    return FlowResult(record={"n": n}, figures=None, tokens=None)


def test_observers_are_called_in_order_and_once_each() -> None:
    """Each observer is added once, called in the order added, and not after it is removed."""
    obs = Observers()
    a, b = Noted(), Noted()
    for o in (a, b, a):
        obs.add_observer(o)
    assert list(obs) == [a, b] and a in obs
    obs.notify(lambda o: o.observe(result(1)))
    obs.remove_observer(a)
    obs.notify(lambda o: o.observe(result(2)))
    assert a.notes == ["1"] and b.notes == ["1", "2"] and a not in obs


def test_a_raising_observer_is_counted_and_the_others_still_run() -> None:
    """An observer that raises costs nobody else its notice; the fault is counted once, and the
    error notice that raises too is not retried."""
    obs = Observers()
    good = Noted()
    obs.add_observer(Broken())
    obs.add_observer(good)
    obs.notify(lambda o: o.observe(result(1)))
    assert good.notes == ["error:observer", "1"]  # told of the fault as it happened
    assert obs.internal_errors == 1


def test_faults_are_counted_logged_and_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    """A measuring fault, a fast path's and the relay's are each counted, told to observers by
    where they happened, and logged with the error; none raises, even past a broken observer."""
    obs = Observers()
    noted = Noted()
    obs.add_observer(Broken())
    obs.add_observer(noted)
    with caplog.at_level(logging.WARNING):
        obs.internal_error("response_tap", ValueError("parser bug"))
        obs.fast_path_failed("framing", OSError("gone"))
        obs.relay_failed("RuntimeError: cut", cut=True)
        obs.relay_failed("RuntimeError: early", cut=False)
    assert obs.internal_errors == 4
    assert noted.notes == ["error:response_tap", "error:framing", "error:relay", "error:relay"]
    text = caplog.text
    assert "ValueError: parser bug" in text and "OSError: gone" in text
    assert "connection was reset" in text and "mitmproxy's layers move the rest" in text
