"""Tests for hopmeter.proxy.addon.views: the content views, and where they are registered."""

from __future__ import annotations

import pytest
from mitmproxy.contentviews import Metadata
from mitmproxy.test import taddons, tflow

from hopmeter.proxy.addon import views
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.ui import META_KEY, HopView
from hopmeter.proxy.addon.views import HopmeterContentview, HopmeterRecordContentview


def test_view_priorities_and_refusals() -> None:
    """Auto for measured event streams, by hand for other measured replies, never for requests;
    a stream with no record yet (mitmdump's flow details print before it exists) shows as
    mitmproxy shows it."""
    f = tflow.tflow(resp=True)
    view = HopmeterContentview()
    sse = Metadata(flow=f, http_message=f.response, content_type="text/event-stream")
    assert view.render_priority(b"{}", Metadata(flow=f, http_message=f.response)) == -1
    assert view.render_priority(b"data: x\n\n", sse) == -1
    f.metadata[META_KEY] = {"api": "openai.chat"}
    assert view.render_priority(b"{}", Metadata(flow=f, http_message=f.response)) == 0
    assert view.render_priority(b"data: x\n\n", sse) == views.AUTO_PRIORITY
    assert view.render_priority(b"", Metadata(flow=f, http_message=f.request)) == -1
    with pytest.raises(ValueError, match="responses only"):
        view.prettify(b"", Metadata(flow=f, http_message=f.request))
    with pytest.raises(ValueError, match="no hopmeter record"):
        HopmeterRecordContentview().prettify(b"", Metadata(flow=tflow.tflow(resp=True)))


@pytest.mark.parametrize("wanted", [True, False])
def test_the_views_are_registered_unless_left_out(
    wanted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HopView registers both views when it loads, and none when told to leave them out (as
    `hopmeter run` does)."""
    registered: list[object] = []
    monkeypatch.setattr(views, "register", registered.append)
    meter = HopMeter()
    with taddons.context(meter, HopView(meter.ending, views=wanted)):
        pass
    assert registered == ([meter.ending] if wanted else [])
