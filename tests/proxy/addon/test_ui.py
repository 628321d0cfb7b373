"""Tests for hopmeter.proxy.addon.ui, in process: marks, comments, the record kept, views,
commands."""

from __future__ import annotations

import io as stdio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions, flow, http, io
from mitmproxy.contentviews import Metadata
from mitmproxy.test import taddons, tflow

from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.ui import META_KEY, HopView, record_of
from hopmeter.proxy.addon.views import HopmeterContentview, HopmeterRecordContentview

WORDS = ["Hello", " 🦙", " there", " friend", " of", " mine", " today", " and", " more"]
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}],"model":"gpt-4o"}\n\n' % w.encode()
    for w in WORDS
] + [b"data: [DONE]\n\n"]


class Updates:
    """Remembers the flows of every `update` hook (what mitmweb and the console redraw)."""

    def __init__(self) -> None:
        self.flows: list[flow.Flow] = []

    def update(self, flows: list[flow.Flow]) -> None:
        self.flows += flows


class Ui:
    """A HopMeter, a HopView and an update recorder in mitmproxy's test context."""

    def __init__(self, tctx: taddons.context, meter: HopMeter, view: HopView, up: Updates):
        self.tctx, self.meter, self.view, self.updates = tctx, meter, view, up


def _context(interactive: bool) -> Iterator[Ui]:
    meter = HopMeter()
    view = HopView(meter.ending)
    updates = Updates()
    with taddons.context(meter, view, updates) as tctx:
        # declared by mitmproxy's proxy server addon, which the test context does not load
        tctx.options.add_option("store_streamed_bodies", bool, False, "keep streamed bodies")
        if interactive:  # the options mitmweb's own addon declares
            tctx.options.add_option("web_port", int, 8081, "mitmweb's port")
            tctx.options.add_option("web_columns", Sequence[str], ["path", "size"], "columns")
        tctx.configure(meter, hopmeter_hop="edge")
        view.running()
        yield Ui(tctx, meter, view, updates)


@pytest.fixture
def web() -> Iterator[Ui]:
    """As in mitmweb: an interactive master."""
    yield from _context(interactive=True)


@pytest.fixture
def dump() -> Iterator[Ui]:
    """As in `hopmeter run` or a plain mitmdump: nobody looks at flows."""
    yield from _context(interactive=False)


def streamed(ui: Ui, events: list[bytes] = EVENTS) -> http.HTTPFlow:
    """A chat completion streamed through the meter's hooks and tap, as mitmproxy does it."""
    f = tflow.tflow(resp=True)
    f.request.path = "/v1/chat/completions"
    f.request.timestamp_start = time.time()  # a test flow's own start is in the year 2000
    f.response.headers["content-type"] = "text/event-stream"
    f.response.headers["x-accel-buffering"] = "no"
    f.response.content = None
    del f.response.headers["content-length"]
    ui.meter.requestheaders(f)
    ui.meter.responseheaders(f)
    tap = f.response.stream
    assert callable(tap)
    for chunk in [*events, b""]:
        tap(chunk)
    ui.meter.response(f)  # gives mitmproxy hopmeter's copy of the body (proxy.passage)
    return f


def test_in_a_ui_the_record_is_kept_marked_commented_and_redrawn(web: Ui) -> None:
    """A measured flow carries its record, a green mark, the verdict and one redraw."""
    f = streamed(web)
    rec = record_of(f)
    assert rec is not None and rec["api"] == "openai.chat" and rec["hop"] == "edge"
    assert f.marked == ":green_circle:"
    assert f.comment.startswith("TTFT ") and f.comment.endswith("· clean")
    assert web.updates.flows == [f]


def test_a_streamed_body_is_shown_from_hopmeters_bounded_copy(web: Ui) -> None:
    """mitmweb shows a streamed body from hopmeter's copy (hopmeter_keep_body), never by
    turning on mitmproxy's unbounded store_streamed_bodies."""
    f = streamed(web)
    assert f.response is not None and f.response.raw_content == b"".join(EVENTS)
    assert not web.tctx.options.store_streamed_bodies


def test_the_comment_column_is_added_unless_columns_were_chosen(web: Ui) -> None:
    """mitmweb's default columns gain the comment; columns a user chose are left as they are."""
    assert web.tctx.options.web_columns == ["path", "size", "comment"]
    web.tctx.options.update(web_columns=["path"])
    web.view.running()
    assert web.tctx.options.web_columns == ["path"]


def test_without_a_ui_nothing_happens_per_flow(dump: Ui) -> None:
    """In a plain mitmdump: no record in the flow, no mark, no comment, no redraw, no listener."""
    f = streamed(dump)
    assert META_KEY not in f.metadata and not f.marked and not f.comment
    assert dump.updates.flows == []
    assert dump.meter.ending.listeners == [] and dump.view not in dump.meter.observers


def test_a_users_mark_and_comment_are_kept(web: Ui) -> None:
    """A mark or comment set before the record arrives is not overwritten."""
    f = tflow.tflow(resp=True)
    f.marked, f.comment = ":grapes:", "look at this"
    web.view.recorded(f, _result({"api": "openai.chat", "figures": {"tokens": 3}}))
    assert (f.marked, f.comment) == (":grapes:", "look at this")
    assert record_of(f) is not None


def test_hops_from_pairing_update_the_record_mark_and_comment(web: Ui) -> None:
    """When pairing adds hops with a finding, the record, mark and verdict follow."""
    f = tflow.tflow(resp=True)
    first = {"flow_id": f.id, "trace_id": "t", "api": "openai.chat", "figures": {"tokens": 3}}
    web.view.recorded(f, _result(first))
    assert f.marked == ":green_circle:"
    held = {"severity": "error", "kind": "whole_body_hold", "evidence": {}, "fix": "x"}
    later = {**first, "findings": [held], "hops": [{"segment": "edge>origin"}]}
    web.view.observe(_result(later))
    assert f.marked == ":red_circle:" and f.comment.endswith("whole_body_hold")
    assert (record_of(f) or {})["hops"] == [{"segment": "edge>origin"}]


def test_flows_that_are_no_llm_reply_are_not_marked(web: Ui) -> None:
    """A plain page (api other, nothing found) keeps its record but gets no mark or comment."""
    f = tflow.tflow(resp=True)
    web.view.recorded(f, _result({"api": "other", "figures": {}, "findings": []}))
    assert record_of(f) is not None and not f.marked and not f.comment


def test_the_view_renders_a_flow_read_back_from_a_file(web: Ui, tmp_path: Path) -> None:
    """Saved and read back, the flow keeps its record and the view renders it with no meter."""
    f = streamed(web)
    buf = stdio.BytesIO()
    io.FlowWriter(buf).add(f)
    (loaded,) = list(io.FlowReader(stdio.BytesIO(buf.getvalue())).stream())
    assert isinstance(loaded, http.HTTPFlow) and loaded.response is not None
    assert record_of(loaded) == record_of(f) and loaded.marked == ":green_circle:"
    meta = Metadata(flow=loaded, http_message=loaded.response, content_type="text/event-stream")
    view = HopmeterContentview()
    assert view.render_priority(loaded.response.content or b"", meta) == 2
    text = view.prettify(loaded.response.content or b"", meta)
    assert text.splitlines()[1] == f"✔ {loaded.comment}"
    assert '" 🦙"' in text
    record_text = HopmeterRecordContentview().prettify(b"", meta)
    assert '"schema": "hopmeter.flow/1"' in record_text


def test_commands_write_the_report_and_return_records(web: Ui, tmp_path: Path) -> None:
    """hopmeter.report writes HTML and says so; hopmeter.record returns JSON; both refuse
    flows without a record, naming the fix."""
    flows = [streamed(web), streamed(web)]
    out = tmp_path / "report.html"
    said = web.view.report(flows, str(out))
    assert said == f"hopmeter: wrote the report of 2 flows to {out}"
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert web.view.record(flows[:1]).startswith('{"schema":"hopmeter.flow/1"')
    assert web.view.record(flows).startswith('[{"schema"')
    with pytest.raises(exceptions.CommandError, match="none of these 1 flows has a hopmeter"):
        web.view.record([tflow.tflow()])
    with pytest.raises(exceptions.CommandError, match="cannot write"):
        web.view.report(flows, str(tmp_path / "missing" / "r.html"))


def test_clipboard_without_a_clipboard_is_one_clear_error(
    web: Ui, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine with no clipboard, hopmeter.record.clip says so and names the alternatives."""
    import pyperclip

    def no_clipboard(text: str) -> None:
        raise pyperclip.PyperclipException("could not find a copy/paste mechanism")

    monkeypatch.setattr(pyperclip, "copy", no_clipboard)
    with pytest.raises(exceptions.CommandError, match=r"no clipboard here .* hopmeter-record view"):
        web.view.record_clip([streamed(web)])


def test_commands_are_registered_under_names_mitmweb_routes(web: Ui) -> None:
    """Command names use only [a-z.], the characters mitmweb's /commands/<name> route takes."""
    names = [n for n in web.tctx.master.commands.commands if n.startswith("hopmeter")]
    assert sorted(names) == ["hopmeter.record", "hopmeter.record.clip", "hopmeter.report"]
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyz.") for n in names)


def _result(record: dict[str, Any]) -> Any:
    from hopmeter.core.record import FlowResult

    return FlowResult(record=record, figures=None, tokens=None)
