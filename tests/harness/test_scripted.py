"""The scripted upstream leaves no socket behind when it stops, whatever its connections did."""

from __future__ import annotations

import gc
import socket
import warnings

import pytest

from tests.harness.scripted import Exchange, ScriptedUpstream


async def _answer(ex: Exchange) -> None:
    await ex.head({"content-type": "text/event-stream"})


@pytest.mark.loopback
def test_connections_accepted_as_it_stops_are_closed() -> None:
    # connections the upstream accepted in the moment before it stopped (handlers not begun yet)
    # were once cancelled before they owned their sockets: the collector warned, later, in
    # whichever test ran then
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            with ScriptedUpstream(_answer) as upstream:
                clients = [
                    socket.create_connection(("127.0.0.1", upstream.port)) for _ in range(20)
                ]
            for client in clients:
                client.close()
            gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
