"""What follows from the whole table of settings (hopmeter.proxy.options.declared.SETTINGS):
`hopmeter run`'s flags (`add_flags`), the options each addon declares (`declare`) and reads
(`read`), and the options `hopmeter run` sets (`run_options`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from hopmeter.log import get_logger
from hopmeter.proxy.options.declared import SETTINGS
from hopmeter.proxy.options.setting import OPTION_TYPES, Kind, Setting

# Every mitmproxy option hopmeter declares, by name; every flag of `hopmeter run`, in order.
OPTIONS: dict[str, Setting] = {s.option: s for s in SETTINGS if s.option}
FLAGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.flag)

log = get_logger()


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every flag of `hopmeter run` to `parser`, in the table's order."""
    for setting in FLAGS:
        names, kwargs = setting.flag_arguments()
        parser.add_argument(*names, **kwargs)


def declare(loader: Any, addon: str) -> None:
    """Declare the options `addon` owns with mitmproxy's loader (an addon's `load`), and refuse
    a `--set` value for one of them that mitmproxy could not convert (`refuse_unconvertible`)."""
    owned = [s for s in SETTINGS if s.option and s.addon == addon]
    if not owned:
        raise ValueError(f"no option is declared for the addon {addon!r}")
    for s in owned:
        choices = tuple(str(c) for c in s.choices) or None
        loader.add_option(s.option, OPTION_TYPES[s.kind], option_default(s), s.option_help, choices)
    refuse_unconvertible(getattr(getattr(loader, "master", None), "options", None), owned)


def refuse_unconvertible(opts: Any, owned: list[Setting]) -> None:
    """mitmproxy keeps `--set` values for a script's options until the script has loaded, then
    converts them; one it cannot convert (a switch or a number given another word, a value not
    among an option's choices) makes it drop the whole script without a word (mitmproxy 12:
    hopmeter would not run at all). Convert them here as mitmproxy would: a bad one is logged
    as an error naming the option and what it takes (mitmdump then stops at start-up, as for
    its own options) and dropped, so that the option keeps its default."""
    deferred = getattr(opts, "deferred", None)
    if not isinstance(deferred, dict):
        return
    for s in owned:
        given = getattr(deferred.get(s.option), "val", None)  # mitmproxy's unconverted strings
        if not isinstance(given, list):
            continue
        problem = unconvertible(s, [str(v) for v in given])
        if problem is not None:
            del deferred[s.option]
            log.error(f"hopmeter: --set {s.option}={' '.join(given)}: {problem}")


def unconvertible(setting: Setting, given: list[str]) -> str | None:
    """Why mitmproxy could not convert `--set` strings to `setting`'s option, or None."""
    if setting.kind is Kind.LIST:
        return None
    if len(given) > 1:
        return "given more than once; give it once"
    word = given[0] if given else ""
    kind = OPTION_TYPES[setting.kind]
    if kind is bool:
        return None if word in ("", "true", "false", "toggle") else "expected true or false"
    if not given:
        return f"a value is required ({setting.option}=VALUE)"
    if kind is int:
        try:
            int(word)
        except ValueError:
            return "expected a whole number"
    if setting.choices and word not in {str(c) for c in setting.choices}:
        return f"expected one of {', '.join(str(c) for c in setting.choices)}"
    return None


def said_by_flag(message: str, set_by_name: Iterable[str] = ()) -> str:
    """A configure error `message` that begins with an option's name, said with the `hopmeter
    run` flag that sets it instead; unchanged for an option given by name (`set_by_name`: the
    names `--set` gave) or one without a flag."""
    name, sep, rest = message.partition(": ")
    setting = OPTIONS.get(name)
    if not sep or setting is None or not setting.flag or name in set(set_by_name):
        return message
    return f"{setting.flag}: {rest}"


def option_default(setting: Setting) -> Any:
    """The option's default as mitmproxy holds it."""
    return list(setting.default) if setting.kind is Kind.LIST else setting.default


def read(options: Any, name: str) -> Any:
    """Option `name` as it means: seconds for a duration, bytes for a size, else its value; a
    bad one is a UsageError naming the option (an addon's `configure` turns it into
    mitmproxy's OptionsError)."""
    return OPTIONS[name].read(getattr(options, name))


def default(name: str) -> Any:
    """What option `name` means by default: an addon's value before it is configured."""
    setting = OPTIONS[name]
    return setting.read(option_default(setting))


def run_options(args: argparse.Namespace | None = None, **given: Any) -> dict[str, Any]:
    """The options `hopmeter run` sets: the value of each flag that has an option (from `args`,
    else the flag's default), what the switches that set an option say (the first one given in
    the table's order wins), `hopmeter run`'s own values (`Setting.run`), then `given`."""
    unknown = sorted(set(given) - OPTIONS.keys())
    if unknown:
        raise ValueError(f"not a hopmeter option: {', '.join(unknown)}")
    values = {s.option: s.run for s in SETTINGS if s.option and s.run is not None}
    for s in FLAGS:
        if s.option and args is not None:
            values[s.option] = s.option_value(getattr(args, s.attribute))
        elif s.option:
            values[s.option] = option_default(s)
        elif s.sets is not None:
            values.setdefault(s.sets[0], option_default(OPTIONS[s.sets[0]]))
    for s in reversed(FLAGS):
        if s.sets is not None and args is not None and getattr(args, s.attribute):
            values[s.sets[0]] = s.sets[1]
    return values | given
