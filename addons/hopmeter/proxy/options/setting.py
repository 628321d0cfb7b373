"""One setting of `hopmeter run` or of hopmeter's addons, declared once (`Setting`), and each of
its spellings derived from that declaration: the flag's argparse arguments, its HOPMETER_*
variable (hopmeter.env names it after the flag), the mitmproxy option's `loader.add_option`, the
value the option's text reads as, and the option's value from the flag's.

Durations and sizes are text in their options (mitmproxy's `--set`, its `set` command and its
console editor cannot set a float option at all) and in their flags' values, which become the
options' text unchanged; each is read once, when its addon is configured, by the one grammar of
hopmeter.argtypes (`0.5`, `0.5s`, `500ms`). A flag checks its value with the same grammar before
anything starts, so a bad one is refused naming the flag (or its variable).
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hopmeter.argtypes import parse_bytes, parse_seconds, positive_int, positive_seconds, seconds


class Kind(enum.Enum):
    """What a setting's value is, on the command line and in its mitmproxy option."""

    TEXT = "text"  # a string as given
    SWITCH = "switch"  # a flag without a value; a bool option
    ON_OFF = "on|off"  # a flag that takes `on` or `off`; a bool option
    INT = "int"  # a whole number
    COUNT = "count"  # a whole number, 1 or more
    LIST = "list"  # a repeatable flag (several values in its variable); a list option
    SECONDS = "seconds"  # a duration above 0, as text
    SECONDS_OR_ZERO = "seconds, 0 or more"  # a duration where 0 means none, as text
    SIZE = "size"  # bytes with a binary unit (8MiB), as text
    SIZE_OR_ZERO = "size, 0 or more"  # bytes where 0 means none, as text


DURATIONS = (Kind.SECONDS, Kind.SECONDS_OR_ZERO)
# What mitmproxy's `loader.add_option` takes for each kind's option.
OPTION_TYPES: dict[Kind, Any] = {
    Kind.TEXT: str,
    Kind.SWITCH: bool,
    Kind.ON_OFF: bool,
    Kind.INT: int,
    Kind.COUNT: int,
    Kind.LIST: Sequence[str],
    Kind.SECONDS: str,
    Kind.SECONDS_OR_ZERO: str,
    Kind.SIZE: str,
    Kind.SIZE_OR_ZERO: str,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One setting: its flag of `hopmeter run`, its mitmproxy option, or both (docs/cli.md).

    A setting with a flag and an option is one value under two names: the flag's value is the
    option's. A switch can instead set another setting's option to a value when given (`sets`:
    `--quiet` sets hopmeter_console to off). A flag without an option is the process's own
    (`--workers`, `--loop`).
    """

    help: str  # what it does, lower case: --help, the option's help (capitalised), docs/cli.md
    flag: str = ""  # --flag-name; a bare name is the positional argument; "" for an option alone
    option: str = ""  # the mitmproxy option it is (hopmeter_*); "" for a flag of the process
    kind: Kind = Kind.TEXT
    default: Any = ""  # the option's default and the flag's
    addon: str = ""  # which addon's `load` declares the option (hopmeter.proxy.options.declare)
    metavar: str | None = None
    choices: tuple[Any, ...] = ()
    sets: tuple[str, Any] | None = None  # a switch's (option, value) when it is given
    run: Any = None  # what `hopmeter run` sets the option to, where it differs from `default`
    default_doc: str = ""  # the default in words, where its value does not say it
    more: str = ""  # what docs/cli.md says beyond --help (markdown)
    dest: str = ""  # the flag's attribute, where it differs from the flag's name
    hidden: bool = False  # a flag for hopmeter's own use: no help, no variable, not documented

    @property
    def positional(self) -> bool:
        """The setting is the command's positional argument."""
        return bool(self.flag) and not self.flag.startswith("-")

    @property
    def attribute(self) -> str:
        """The name of the flag's value on argparse's namespace."""
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    @property
    def option_help(self) -> str:
        """The help as mitmproxy shows it for the option: a sentence."""
        text = self.help[:1].upper() + self.help[1:]
        return text if text.endswith(".") else text + "."

    def flag_arguments(self) -> tuple[list[str], dict[str, Any]]:
        """What `parser.add_argument` takes for the flag."""
        kw: dict[str, Any] = {"help": argparse.SUPPRESS if self.hidden else self._flag_help()}
        if self.positional:
            return [self.attribute], {**kw, "nargs": "?", "metavar": self.metavar}
        if self.dest:
            kw["dest"] = self.dest
        if self.kind is Kind.SWITCH:
            return [self.flag], {**kw, "action": "store_true"}
        if self.kind is Kind.LIST:
            return [self.flag], {**kw, "action": "append", "default": [], "metavar": self.metavar}
        kw |= {"default": self.default, "metavar": self.metavar, "type": self._flag_type()}
        if self.kind is Kind.ON_OFF:
            kw |= {"default": "on" if self.default else "off", "choices": ("on", "off")}
        if self.choices:
            kw |= {"choices": list(self.choices), "metavar": None}
        return [self.flag], {k: v for k, v in kw.items() if v is not None}

    def option_value(self, value: Any) -> Any:
        """The option's value given the flag's."""
        if self.kind is Kind.ON_OFF:
            return value == "on"
        if self.kind is Kind.LIST:
            return list(value)
        return value

    def read(self, value: Any) -> Any:
        """What the option's value means: seconds for a duration, bytes for a size, else the
        value itself; a bad one is a UsageError naming the option, with an example."""
        if self.kind in DURATIONS:
            return parse_seconds(value, self.option, zero_ok=self.kind is Kind.SECONDS_OR_ZERO)
        if self.kind in (Kind.SIZE, Kind.SIZE_OR_ZERO):
            return parse_bytes(value, self.option, zero_ok=self.kind is Kind.SIZE_OR_ZERO)
        return value

    def default_words(self) -> str:
        """The default as docs/cli.md and --help say it."""
        if self.default_doc:
            return self.default_doc
        if self.kind in (Kind.SWITCH, Kind.ON_OFF):
            return "on" if self.default else "off"
        if self.default in ("", None, ()):
            return "none"
        return str(self.default)

    def _flag_help(self) -> str:
        text = self.help
        if not self.sets and self.kind is not Kind.SWITCH and self.default_words() != "none":
            said = f"default: {self.default_words()}"
            text = f"{text[:-1]}; {said})" if text.endswith(")") else f"{text} ({said})"
        return text.replace("%", "%%")  # argparse formats help with %

    def _flag_type(self) -> Callable[[str], Any] | None:
        if self.kind is Kind.INT:
            return int
        if self.kind is Kind.COUNT:
            return positive_int
        if self.kind in DURATIONS:
            return _duration_text(positive_seconds if self.kind is Kind.SECONDS else seconds)
        if self.choices and isinstance(self.choices[0], enum.Enum):
            return type(self.choices[0])
        return None


def _duration_text(check: Callable[[str], float]) -> Callable[[str], str]:
    """A duration flag's type: the value checked by the one grammar of durations (a bad one is
    argparse's one line naming the flag), kept as text: its option reads it."""

    def duration(value: str) -> str:
        check(value)
        return value

    return duration
