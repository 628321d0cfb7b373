"""`hopmeter run`'s mitmproxy master: every addon mitmdump has, only the live ones on the hook path.

mitmdump's `DumpMaster` runs 35 addons and its `AddonManager` walks all of them for every hook:
a plain reverse-proxied flow fires 14 hooks, ~490 addon visits, of which five do anything. That
walk was 43% of bare mitmproxy's CPU per flow (~9.6 M instructions of 22.3 M, callgrind).

`LeanMaster` registers the same addons as `DumpMaster(with_dumper=False)`, so every option and
command exists and every `--set NAME=VALUE` is accepted and checked exactly as mitmdump does.
Before the servers start (`run`), it drops from the hook chain each addon that does nothing under
the options as they are (`prune`): an addon whose own option the user set stays, and so does
every addon a listener's mode may need. Dropped addons stay registered (`addons.get`, their
commands and options still work). `LeanAddonManager` dispatches a hook only to the addons that
implement it, looked up once per hook name.

`mitmdump -s "$(hopmeter --addon-path)"` keeps the user's own master: none of this applies there.
"""

from __future__ import annotations

import asyncio
import inspect
import types
from typing import Any

from mitmproxy import addonmanager, command, ctx, exceptions, hooks, master, options
from mitmproxy import addons as mitm_addons
from mitmproxy import log as mitmlog
from mitmproxy.addons import errorcheck, keepserving, readfile, termlog
from mitmproxy.proxy import mode_specs

# Addons that do nothing per flow, connection or start while every option they own (registered in
# their `load`) and every option named here keeps its default: they stay in the hook chain only
# when one of those was set. Read in mitmproxy 12.3.1's addons (their hooks return at once, or
# act on state only those options or a console command create).
INERT_UNLESS_SET: dict[str, tuple[str, ...]] = {
    "blocklist": (),
    "anticache": (),
    "anticomp": (),
    "clientplayback": (),  # the `replay.client` command needs a console: not in `hopmeter run`
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
    "keepserving": ("rfile", "client_replay", "server_replay"),
    "readfilestdin": ("rfile",),
}
# Addons only a console or a command reaches (`hopmeter run` has neither): never on the hook path.
CONSOLE_ONLY = frozenset({"browser", "commandhistory", "comment", "cut", "export"})
# Addons that act only on DNS (a `dns` mode, or the DNS a WireGuard/local/transparent listener
# carries) or on the mitm.it page a regular/upstream/SOCKS listener answers: dropped only when
# every listener is a reverse proxy to a scheme that is not DNS.
NOT_FOR_REVERSE = frozenset({"dnsresolver", "stripdnshttpsrecords", "onboarding"})


def addon_name(addon: Any) -> str:
    """mitmproxy's name for an addon: its `name` attribute, else its class name in lower case."""
    return str(getattr(addon, "name", addon.__class__.__name__.lower()))


class LeanAddonManager(addonmanager.AddonManager):
    """mitmproxy's AddonManager whose `trigger_event` visits only the addons implementing the hook.

    Same semantics: one `safecall` per top-level addon in chain order, sync and async hooks,
    `AddonHalt` stops the chain. An addon with sub-addons (`addons`, e.g. the script loader, whose
    scripts change when reloaded) is walked at each call as mitmproxy does; the others' bound hook
    methods are looked up once per hook name, again after any change to the chain.
    """

    def __init__(self, master_: Any) -> None:
        super().__init__(master_)
        # hook name -> [(top-level addon, its bound hook, or None: walk it as mitmproxy does)]
        self._plans: dict[str, list[tuple[Any, Any]]] = {}

    def invalidate(self) -> None:
        """Forget the looked-up hooks (the chain changed)."""
        self._plans.clear()

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
    """A master with DumpMaster's addons registered and only the live ones in the hook chain."""

    def __init__(self, opts: options.Options) -> None:
        # What Master.__init__ builds, with LeanAddonManager, and without the legacy log-event
        # handler (each log record woke the loop and walked every addon's deprecated add_log hook)
        self.options = opts
        self.commands = command.CommandManager(self)
        self.addons = LeanAddonManager(self)
        self._termlog_addon = termlog.TermLog()
        self.addons.add(self._termlog_addon)
        self.log = mitmlog.Log(self)
        self._legacy_log_events = mitmlog.LegacyLogEvents(self)  # never installed
        self.event_loop = asyncio.get_running_loop()
        self.should_exit = asyncio.Event()
        ctx.master = self
        ctx.log = self.log
        ctx.options = self.options
        self.owned: dict[str, frozenset[str]] = {}  # addon name -> the options its load added
        self.pruned: list[str] = []
        extra = [keepserving.KeepServing(), readfile.ReadFileStdin(), errorcheck.ErrorCheck()]
        for addon in [*mitm_addons.default_addons(), *extra]:  # DumpMaster's, in its order
            before = set(opts.keys())
            self.addons.add(addon)
            self.owned[addon_name(addon)] = frozenset(opts.keys() - before)

    def live(self, addon: Any) -> bool:
        """Whether `addon` may act under the options as they are now."""
        name = addon_name(addon)
        if name in CONSOLE_ONLY:
            return False
        if name in NOT_FOR_REVERSE:
            return not only_http_reverse(self.options.mode)
        if name in INERT_UNLESS_SET:
            names = self.owned.get(name, frozenset()) | set(INERT_UNLESS_SET[name])
            return any(self.options._options[n].has_changed() for n in names)
        return True

    def prune(self) -> None:
        """Drop from the hook chain the addons that are inert under the current options."""
        keep = []
        for addon in self.addons.chain:
            if self.live(addon):
                keep.append(addon)
            else:
                self.pruned.append(addon_name(addon))
        self.addons.chain = keep
        self.addons.invalidate()

    async def run(self) -> None:
        self.prune()  # the options are final: `hopmeter run` has no console to change them
        await super().run()


def only_http_reverse(modes: list[str]) -> bool:
    """Whether every listener is a reverse proxy whose traffic is not DNS."""
    for spec in modes:
        try:
            mode = mode_specs.ProxyMode.parse(spec)
        except ValueError:
            return False
        if not isinstance(mode, mode_specs.ReverseMode) or mode.scheme == "dns":
            return False
    return bool(modes)
