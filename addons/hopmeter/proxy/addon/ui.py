"""hopmeter inside mitmweb and the mitmproxy console: marks, verdicts, a content view, commands.

Loaded with the other addons (`mitmweb -s "$(hopmeter --addon-path)"`), `HopView`:
- keeps each finished record in `flow.metadata["hopmeter"]` (JSON types only, so it is saved with
  the flow in a .mitm file), right after the record is built, and again when pairing adds its hops;
- marks the flow by its worst finding and sets its comment to a one-line verdict, then fires the
  `update` hook so mitmweb (websocket `flows/update`) and the console redraw it;
- registers the content views "hopmeter" (the timeline of hopmeter.report.timeline, chosen
  automatically for event streams) and "hopmeter-record" (the record as JSON, to copy:
  hopmeter.proxy.addon.views), except in `hopmeter run`, which shows no flow: mitmproxy's
  content views are ~1.3 MiB of an idle proxy's memory (bench/idle_memory.py);
- adds the commands hopmeter.report, hopmeter.record and hopmeter.record.clip;
- adds the comment column to mitmweb's flow list when the user has not chosen its columns.
(The body a view shows is the copy hopmeter keeps of each streamed body, bounded by
`hopmeter_keep_body`: hopmeter.proxy.addon.passage.)

In `hopmeter run` and a plain mitmdump it does nothing per flow: no UI, no cost. (`mitmdump -w`
would not keep the record anyway: mitmproxy writes a flow to the file in its `response` hook, and
the record is built just after it.)
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mitmproxy.types
import orjson
from mitmproxy import command, ctx, exceptions, flow, hooks, http
from mitmproxy.addonmanager import Loader

from hopmeter.core.record import FlowResult
from hopmeter.core.vocab import Severity
from hopmeter.export import FlowObserver
from hopmeter.log import get_logger
from hopmeter.proxy import options
from hopmeter.proxy.addon.ending import Ending

log = get_logger()


META_KEY = "hopmeter"  # flow.metadata[META_KEY]: the flow's record, once it has ended
# A mark per worst severity; the names are keys of mitmproxy.utils.emoji.emoji (what flow.mark
# accepts), and filters match them: `~marker red_circle`.
MARKS: Mapping[Severity | None, str] = {
    Severity.ERROR: ":red_circle:",
    Severity.WARNING: ":orange_circle:",
    Severity.INFO: ":large_blue_circle:",
    None: ":green_circle:",
}
UNMEASURED_MARK = ":white_circle:"  # an LLM request with no measured response
# Options that exist only in mitmweb and in the console: their presence says a person is looking.
INTERACTIVE_OPTIONS = ("web_port", "console_layout")


def record_of(f: flow.Flow | None) -> dict[str, Any] | None:
    """The hopmeter record stored in a flow, if any."""
    rec = f.metadata.get(META_KEY) if f is not None else None
    return rec if isinstance(rec, dict) else None


def json_safe(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as plain JSON types (what a .mitm file can hold), without the reply text."""
    kept = {k: v for k, v in record.items() if k != "content"}
    doc: dict[str, Any] = orjson.loads(orjson.dumps(kept))
    return doc


class HopView(FlowObserver):
    """Shows hopmeter's measurements in mitmproxy's own interfaces (see the module's docstring)."""

    def __init__(self, ending: Ending, *, views: bool = True) -> None:
        """`views`: register the content views (not in `hopmeter run`: the module's docstring)."""
        self.ending = ending  # a flow's end: its listeners and observers
        self.views = views
        self.interactive = False
        # flows whose record may still gain hops from pairing, by flow id; weak references, so
        # bounded by the flows mitmproxy itself keeps, and each is dropped when pairing emits it
        self.flows: weakref.WeakValueDictionary[str, http.HTTPFlow] = weakref.WeakValueDictionary()

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.UI)
        if self.views:
            from hopmeter.proxy.addon import views  # noqa: PLC0415 - see the module's docstring

            views.register(self.ending)

    def running(self) -> None:
        self.interactive = any(hasattr(ctx.options, name) for name in INTERACTIVE_OPTIONS)
        columns = getattr(ctx.options, "web_columns", None)
        if columns is not None and not ctx.options.has_changed("web_columns"):
            # mitmweb's default flow list has no comment column: add it, where the verdict shows
            ctx.options.update(web_columns=[*columns, "comment"])
        if self.interactive:  # elsewhere nobody looks at flows: no listener, no cost per flow
            self.ending.add_listener(self.recorded)
            self.ending.observers.add_observer(self)

    def done(self) -> None:
        self.ending.remove_listener(self.recorded)
        self.ending.observers.remove_observer(self)

    # -- called by the flow's end --------------------------------------------------------------
    def recorded(self, f: http.HTTPFlow, result: FlowResult) -> None:
        """A flow's record was just built (before pairing): keep it, mark it, redraw it."""
        self._show(f, result.record)
        if result.record.get("trace_id"):
            self.flows[f.id] = f

    def observe(self, result: FlowResult) -> None:
        """A finished record, after pairing: the outermost flow of a trace now has its hops."""
        f = self.flows.pop(str(result.record.get("flow_id")), None)
        if f is not None and result.record.get("hops"):
            self._show(f, result.record)

    def _show(self, f: http.HTTPFlow, record: Mapping[str, Any]) -> None:
        before = record_of(f)
        f.metadata[META_KEY] = json_safe(record)
        # imported here, for a view or a UI: `hopmeter run` has neither, and the report's
        # modules would be ~0.5 MiB of its memory for nothing
        from hopmeter.report import timeline  # noqa: PLC0415

        if ctx.options.hopmeter_mark and timeline.measured(record):
            mine = before is not None and timeline.measured(before)
            if not f.marked or (mine and f.marked in (*MARKS.values(), UNMEASURED_MARK)):
                figures = record.get("figures")
                f.marked = MARKS[timeline.worst_severity(record)] if figures else UNMEASURED_MARK
            if not f.comment or (mine and f.comment == timeline.verdict(before or {})):
                f.comment = timeline.verdict(record)
        ctx.master.addons.trigger(hooks.UpdateHook([f]))  # mitmweb and the console redraw it

    # -- commands ------------------------------------------------------------------------------
    @command.command("hopmeter.report")
    def report(self, flows: Sequence[flow.Flow], path: mitmproxy.types.Path) -> str:
        """Write hopmeter's HTML report of these flows (@marked, @all, "~marker red_circle")."""
        from hopmeter.report.fleet import summarise  # noqa: PLC0415 - only when asked
        from hopmeter.report.html import render  # noqa: PLC0415
        from hopmeter.report.traces import stall_threshold, traces_of  # noqa: PLC0415

        records = self._records(flows, "hopmeter.report")
        threshold = stall_threshold(records)
        traces = traces_of(records, threshold)
        page = render(summarise(records, traces), traces, threshold_s=threshold, max_traces=200)
        out = Path(path).expanduser()
        try:
            out.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise exceptions.CommandError(
                f"hopmeter.report: cannot write {out}: {exc.strerror}; pick a writable path"
            ) from None
        done = f"hopmeter: wrote the report of {len(records)} flows to {out}"
        log.info(done)
        return done

    @command.command("hopmeter.record")
    def record(self, flows: Sequence[flow.Flow]) -> str:
        """The hopmeter records of these flows as JSON (one flow: an object; several: a list)."""
        records = self._records(flows, "hopmeter.record")
        return orjson.dumps(records[0] if len(records) == 1 else records).decode()

    @command.command("hopmeter.record.clip")
    def record_clip(self, flows: Sequence[flow.Flow]) -> None:
        """Copy these flows' hopmeter records (JSON) to the clipboard of mitmproxy's machine."""
        import pyperclip  # type: ignore[import-untyped]  # noqa: PLC0415 - mitmproxy's, only here

        text = self.record(flows)
        try:
            pyperclip.copy(text)
        except pyperclip.PyperclipException as exc:
            raise exceptions.CommandError(
                f"hopmeter.record.clip: no clipboard here ({exc}); use hopmeter.record, or the "
                f"Copy button of the hopmeter-record view"
            ) from None
        log.info("hopmeter: record copied to the clipboard", flows=len(flows))

    def _records(self, flows: Sequence[flow.Flow], name: str) -> list[dict[str, Any]]:
        records = [rec for f in flows if (rec := record_of(f)) is not None]
        if not records:
            raise exceptions.CommandError(
                f"{name}: none of these {len(flows)} flows has a hopmeter record; pick measured "
                f"flows, e.g. @all or @marked"
            )
        return records
