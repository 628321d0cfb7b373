"""`hopmeter run`'s mitmproxy master: every addon mitmdump has, fewer of them per flow.

mitmdump's `DumpMaster` runs 35 addons and its `AddonManager` walks all of them for every hook:
a plain reverse-proxied flow fires 14 hooks, ~490 addon visits, of which five do anything. That
walk was 43% of bare mitmproxy's CPU per flow (~9.6 M instructions of 22.3 M, callgrind).

`LeanMaster` registers the same addons as `DumpMaster(with_dumper=False)`, in the same order, so
every option and command exists and every `--set NAME=VALUE` is accepted, checked and acted on
exactly as mitmdump does. `LeanAddonManager` dispatches a hook only to the addons that implement
it, looked up once per hook name and again after any change to the chain or the options. The
addons whose per-flow hooks do nothing while their options keep their defaults
(`INERT_UNLESS_SET`: map_remote, modify_headers, proxyauth, save_stream_file, ...) are skipped
for per-flow hooks until one of those options is set; they still get every lifecycle hook
(load, configure, running, done) and keep their commands. With `scripts` set nothing is skipped:
a script may reach any addon through its commands.

`LeanOptions` reads a bool, number, string or None option without the two deep copies mitmproxy's
`OptManager.__getattr__` makes of every value it returns: mitmproxy reads `store_streamed_bodies`
for every chunk of a streamed body, and the copies were ~2% of the proxy's CPU per event (perf).
A copy of such a value is the value itself, so every read returns what it returned before. Such a
value, once read, is kept in the instance's `__dict__`, where Python's own attribute lookup finds
it without calling `__getattr__` (whose call, after the failed lookup's AttributeError, was
~2.3k instructions per event); every change of any option forgets them all first.

`mitmdump -s "$(hopmeter --addon-path)"` keeps the user's own master: none of this applies there.
"""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

from mitmproxy import addonmanager, command, ctx, exceptions, hooks, master, options, optmanager
from mitmproxy import addons as mitm_addons
from mitmproxy import log as mitmlog
from mitmproxy.addons import errorcheck, keepserving, readfile, termlog

# Addons whose per-flow hooks return at once while every option they register in their `load`
# (and every option named here) keeps its default, read in mitmproxy 12.3's addons: their hooks
# act on state only those options (or a command, see `scripts`) create.
INERT_UNLESS_SET: dict[str, tuple[str, ...]] = {
    "blocklist": (),
    "anticache": (),
    "anticomp": (),
    "proxyauth": (),
    "scriptloader": (),
    "serverplayback": (),  # its request hook does nothing until server_replay loads flows
    "mapremote": (),
    "maplocal": (),
    "modifybody": (),
    "modifyheaders": (),
    "stickyauth": (),
    "stickycookie": (),
    "save": (),
    "savehar": (),
    "upstreamauth": (),
}
# Hooks every addon gets, skipped or not: once per process, and what keeps an addon ready for an
# option set later (configure) or lets it clean up (done).
LIFECYCLE = frozenset({"load", "configure", "running", "done"})


# Option values a deep copy returns unchanged (the same object): LeanOptions returns them as kept.
IMMUTABLE_VALUES = frozenset({bool, int, float, str, bytes, type(None)})


class LeanOptions(options.Options):
    """mitmproxy's Options; reading an option whose value is immutable skips the deep copies.

    `_Option.current()` deep-copies the default (its `default` property) and then the value; for
    the types in IMMUTABLE_VALUES both copies are the object itself. Lists, tuples and anything
    else still go through mitmproxy's own read, as do unknown names (its AttributeError).

    An immutable value read is kept in `__dict__` under the option's name (`_kept` lists them),
    so the next read is a plain attribute lookup. Every change to options (`update`, `set`,
    `reset`, `add_option`, a rollback) ends in `changed.send`, and `_forget` is its first
    receiver: every kept value goes before any subscriber or addon reads an option, and the
    values are set before the signal is sent, so no read ever sees a value older than the
    option's.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__["_kept"] = set()
        super().__init__(**kwargs)
        # first in line: before mitmproxy's own subscribers and every addon's configure
        changed = self.changed
        changed.disconnect(self._notify_subscribers)
        changed.connect(self._forget)
        changed.connect(self._notify_subscribers)
        self._forget(set())

    def _forget(self, updated: set[str]) -> None:
        """Drop every kept value (an option changed, or was added)."""
        d = self.__dict__
        kept = d["_kept"]
        for name in kept:
            d.pop(name, None)
        kept.clear()

    def __getattr__(self, attr: str) -> Any:
        d = self.__dict__
        opt = d.get("_options", {}).get(attr)
        if opt is not None:
            value = opt.value
            if value is optmanager.unset:
                value = opt._default
            if type(value) in IMMUTABLE_VALUES:
                kept = d.get("_kept")
                if kept is not None:
                    d[attr] = value  # read next time without this call
                    kept.add(attr)
                return value
        return super().__getattr__(attr)


def addon_name(addon: Any) -> str:
    """mitmproxy's name for an addon: its `name` attribute, else its class name in lower case."""
    return str(getattr(addon, "name", addon.__class__.__name__.lower()))


class LeanAddonManager(addonmanager.AddonManager):
    """mitmproxy's AddonManager whose `trigger_event` visits only the addons implementing the hook.

    Same semantics: one `safecall` per top-level addon in chain order, sync and async hooks,
    `AddonHalt` stops the chain. An addon with sub-addons (`addons`, e.g. the script loader, whose
    scripts change when reloaded) is walked at each call as mitmproxy does; the others' bound hook
    methods are looked up once per hook name, again after any change to the chain or options.
    `skip(addon)` says which addons sit out the per-flow hooks (none unless set).
    """

    def __init__(self, master_: Any) -> None:
        super().__init__(master_)
        # hook name -> [(top-level addon, its bound hook, or None: walk it as mitmproxy does)]
        self._plans: dict[str, list[tuple[Any, Any]]] = {}
        self.skip: Callable[[Any], bool] = lambda addon: False

    def invalidate(self) -> None:
        """Forget the looked-up hooks (the chain or the options changed)."""
        self._plans.clear()

    def _configure_all(self, updated: Any) -> None:
        super()._configure_all(updated)
        self._plans.clear()  # an option may bring a skipped addon back (or let it go)

    def register(self, addon: Any) -> Any:
        self._plans.clear()
        return super().register(addon)

    def add(self, *addons: Any) -> None:
        super().add(*addons)
        self._plans.clear()

    def remove(self, addon: Any) -> None:
        super().remove(addon)
        self._plans.clear()

    def clear(self) -> None:
        super().clear()
        self._plans.clear()

    def _plan(self, name: str) -> list[tuple[Any, Any]]:
        plan: list[tuple[Any, Any]] = []
        for top in self.chain:
            if name not in LIFECYCLE and self.skip(top):
                continue
            if hasattr(top, "addons"):
                plan.append((top, None))
                continue
            func = getattr(top, name, None)
            if not func or isinstance(func, types.ModuleType):
                continue  # mitmproxy skips a module imported under a hook's name too
            plan.append((top, func if callable(func) else None))  # None: mitmproxy's error
        self._plans[name] = plan
        return plan

    async def trigger_event(self, event: hooks.Hook) -> None:
        plan = self._plans.get(event.name)
        if plan is None:
            plan = self._plan(event.name)
        if not plan:
            return
        args = event.args()
        for addon, func in plan:
            try:
                with addonmanager.safecall():
                    if func is None:
                        await self.invoke_addon(addon, event)
                    else:
                        res = func(*args)
                        if res is not None and inspect.isawaitable(res):
                            await res
            except exceptions.AddonHalt:
                return


class LeanMaster(master.Master):
    """A master with DumpMaster's addons, the inert ones skipped for per-flow hooks, and
    `scripts` (hopmeter's own addons) where mitmdump loads `-s` scripts: right after its script
    loader, so they run where they run in `mitmdump -s "$(hopmeter --addon-path)"`, before the
    addons that read or edit a finished flow (modify_body, save, ...)."""

    def __init__(
        self,
        opts: options.Options,
        log: termlog.TermLog | None = None,
        scripts: Sequence[Any] = (),
    ) -> None:
        # What Master.__init__ builds, with LeanAddonManager, and without the legacy log-event
        # handler (each log record woke the loop and walked every addon's deprecated add_log hook);
        # `log` stands in for mitmproxy's TermLog (hopmeter run's writes its lines off the loop)
        self.options = opts
        self.commands = command.CommandManager(self)
        self.addons = LeanAddonManager(self)
        self._termlog_addon = log if log is not None else termlog.TermLog()
        self.addons.add(self._termlog_addon)
        self.log = mitmlog.Log(self)
        self._legacy_log_events = mitmlog.LegacyLogEvents(self)  # never installed
        self.event_loop = asyncio.get_running_loop()
        self.should_exit = asyncio.Event()
        ctx.master = self
        ctx.log = self.log
        ctx.options = self.options
        self.owned: dict[str, frozenset[str]] = {}  # addon name -> the options its load added
        # ErrorCheck repeats a startup error on stderr: the log's own line may still be queued
        # (hopmeter.proxy.addon.outlets) when it exits the process
        check = errorcheck.ErrorCheck(repeat_errors_on_stderr=True)
        extra = [keepserving.KeepServing(), readfile.ReadFileStdin(), check]
        for addon in [*mitm_addons.default_addons(), *extra]:  # DumpMaster's, in its order
            before = set(opts.keys())
            self.addons.add(addon)
            self.owned[addon_name(addon)] = frozenset(opts.keys() - before)
            if addon_name(addon) == "scriptloader":
                self.addons.add(*scripts)
        self.addons.skip = self.inert

    def changed(self, name: str) -> bool:
        """Whether option `name` differs from its default."""
        return bool(getattr(self.options, name) != self.options.default(name))

    def inert(self, addon: Any) -> bool:
        """Whether `addon`'s per-flow hooks do nothing under the options as they are now."""
        name = addon_name(addon)
        if name not in INERT_UNLESS_SET or self.changed("scripts"):
            return False
        names = self.owned.get(name, frozenset()) | set(INERT_UNLESS_SET[name])
        return not any(self.changed(n) for n in names)

    def skipped(self) -> list[str]:
        """The names of the addons that sit out the per-flow hooks now, in chain order."""
        return [addon_name(a) for a in self.addons.chain if self.inert(a)]
