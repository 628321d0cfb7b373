"""hopmeter's content views, for mitmweb, the console and mitmdump's flow details: "hopmeter"
(the timeline of a response: hopmeter.report.timeline) and "hopmeter-record" (the record as
JSON). Imported by `HopView.load` (hopmeter.proxy.addon.ui) where flows may be shown: importing
mitmproxy's content views costs an idle `hopmeter run` ~1.3 MiB, and it shows none.
"""

from __future__ import annotations

import orjson
from mitmproxy import contentviews, http
from mitmproxy.contentviews import Contentview, Metadata

from hopmeter.proxy.addon.ending import Ending
from hopmeter.proxy.addon.ui import record_of

# Media types the "hopmeter" view is chosen for automatically (above json's 1 and raw's 0.1),
# once the flow has its record: before that (mitmdump's flow details print at the `response`
# hook, before the record is made) the stream shows as mitmproxy shows it, its raw events
STREAM_TYPES = frozenset(
    {"text/event-stream", "application/x-ndjson", "application/ndjson", "application/jsonl"}
)
AUTO_PRIORITY = 2.0


def register(ending: Ending | None) -> None:
    """Add both views to mitmproxy's (`ending`: the live flows' threshold, for the timeline)."""
    contentviews.add(HopmeterContentview(ending))
    contentviews.add(HopmeterRecordContentview())


class HopmeterContentview(Contentview):
    """hopmeter's timeline of a response: verdict, findings and fixes, figures, a row per event."""

    def __init__(self, ending: Ending | None = None) -> None:
        self.ending = ending

    @property
    def name(self) -> str:
        return "hopmeter"

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        msg = metadata.http_message
        if not isinstance(msg, http.Response):
            raise ValueError("the hopmeter view shows responses only")
        f = metadata.flow
        path = f.request.path.split("?", 1)[0] if isinstance(f, http.HTTPFlow) else "/"
        rec = record_of(f)
        live = None
        if self.ending is not None and rec is None:  # a flow in flight: the threshold now
            live = self.ending.options.stall_threshold_s
        from hopmeter.report import timeline  # noqa: PLC0415 - see _show

        return timeline.render(
            data,
            rec,
            content_type=metadata.content_type or "",
            path=path,
            stall_threshold_s=live,
        )

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        if not isinstance(metadata.http_message, http.Response):
            return -1
        if record_of(metadata.flow) is None:
            return -1  # by hand only: nothing measured to show yet
        if (metadata.content_type or "") in STREAM_TYPES:
            return AUTO_PRIORITY
        return 0  # by hand on any other measured reply


class HopmeterRecordContentview(Contentview):
    """The flow's hopmeter record as JSON (mitmweb's Copy button copies it)."""

    @property
    def name(self) -> str:
        return "hopmeter-record"

    @property
    def syntax_highlight(self) -> contentviews.SyntaxHighlight:
        return "yaml"  # the console colours JSON's keys and values with it

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        rec = record_of(metadata.flow)
        if rec is None:
            raise ValueError("no hopmeter record in this flow")
        return orjson.dumps(rec, option=orjson.OPT_INDENT_2).decode()

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        return -1  # never chosen automatically
