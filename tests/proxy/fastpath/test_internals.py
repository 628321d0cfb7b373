"""Tests for hopmeter.proxy.fastpath.internals: the ways to a live client's handler, its layers and
an HTTP/2 client's stream buffers, on mitmproxy's own handler (tests.harness.live_client)."""

from __future__ import annotations

import pytest
from mitmproxy.proxy.layers.http import HttpLayer

from hopmeter.proxy.fastpath.internals import connection_handlers, layers_to_http, locate_h2
from tests.harness.live_client import flow_of, live_client, run

pytestmark = pytest.mark.loopback  # every test serves or connects on 127.0.0.1, in this process


def test_the_proxyserver_table_leads_to_the_live_handler() -> None:
    """mitmproxy's proxyserver keeps each live client's handler by the client's id."""

    async def test() -> None:
        async with live_client() as live:
            handlers = connection_handlers()
            assert handlers is not None
            assert handlers[live.handler.client.id] is live.handler

    run(test)


def test_a_connection_with_no_http_layer_has_no_chain() -> None:
    """Before a layer under the client's connection is decided there is no HTTP layer: empty."""

    async def test() -> None:
        async with live_client() as live:
            assert layers_to_http(live.handler) == []
            assert layers_to_http(object()) == []

    run(test)


def test_the_chain_ends_at_the_http_layer() -> None:
    """The layers are followed from the handler's root down to the HTTP layer, that one last."""

    class Root:
        def __init__(self, child: object) -> None:
            self.child_layer = child

    async def test() -> None:
        async with live_client() as live:
            http_layer = HttpLayer(live.handler.layer.context, mode=None)  # type: ignore[arg-type]
            mode = Root(http_layer)
            live.handler.layer.layer = mode
            live.handler.layer._handle = mode
            assert layers_to_http(live.handler) == [live.handler.layer, mode, http_layer]
            mode.child_layer = mode  # a cycle is not followed for ever
            assert layers_to_http(live.handler) == []

    run(test)


def test_an_http1_client_has_no_http2_stream() -> None:
    """locate_h2 on an HTTP/1 connection says there is no HTTP/2 connection to follow."""

    async def test() -> None:
        async with live_client() as live:
            assert isinstance(locate_h2(live.handler, flow_of(live)), str)

    run(test)
