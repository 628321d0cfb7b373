"""Flags from the environment: `HOPMETER_<FLAG>` for every flag of a command that asks for it.

Containers are configured by environment variables by convention; hopmeter keeps argparse and
lets a command's parser be bound to the environment (`bind_env`), as `hopmeter run` is:

- the name is HOPMETER_ and the long flag upper-cased, `-` as `_` (`--stall-threshold` is
  HOPMETER_STALL_THRESHOLD); a positional goes by its name (`upstream` is HOPMETER_UPSTREAM);
- values are read as on the command line, through the flag's own `type` and `choices`; a switch
  takes 1/true/yes/on or 0/false/no/off; a repeatable flag takes several values separated by
  whitespace (shell-quoted if one holds a space);
- a flag on the command line wins over the environment, and a repeatable flag given there
  replaces the environment's list rather than adding to it;
- a bad value is one line naming the variable;
- `--help` shows each flag's variable: "[env: HOPMETER_LISTEN]".

How: before parsing, each bound flag's default becomes a sentinel (a fresh list for a repeatable
one); after parsing, whatever still holds it was not on the command line and is taken from the
environment, else from the flag's own default. Defaults in `os.environ.get(...)` form would add a
repeatable flag's values to the environment's, name the flag instead of the variable in errors,
and leave a switch set by the environment impossible to tell apart from one set by hand.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

PREFIX = "HOPMETER_"
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


@dataclass(slots=True)
class Binding:
    """One flag and the variable it is also read from."""

    parser: argparse.ArgumentParser  # the (sub)command's parser: its error() names the command
    action: argparse.Action
    name: str
    default: Any


_BOUND: WeakKeyDictionary[argparse.ArgumentParser, list[Binding]] = WeakKeyDictionary()


def env_name(action: argparse.Action, prefix: str = PREFIX) -> str:
    """The variable a flag is read from: HOPMETER_ and its long name (or a positional's)."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    return variable(longs[0] if longs else action.dest, prefix)


def variable(flag: str, prefix: str = PREFIX) -> str:
    """The variable of a long flag (`--stall-threshold`: HOPMETER_STALL_THRESHOLD) or of a
    positional by its name (`upstream`: HOPMETER_UPSTREAM)."""
    return prefix + flag.removeprefix("--").upper().replace("-", "_")


def bind_env(parser: argparse.ArgumentParser, prefix: str = PREFIX) -> list[Binding]:
    """Read each of `parser`'s flags from the environment too, and say so in --help.

    Hidden flags (help=SUPPRESS) and --help itself are left alone.
    """
    bindings = []
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        name = env_name(action, prefix)
        action.help = f"{action.help or ''} [env: {name}]".strip()
        bindings.append(Binding(parser, action, name, action.default))
    _BOUND[parser] = bindings
    return bindings


def bound(parser: argparse.ArgumentParser) -> list[Binding]:
    """The bindings of `parser` and of every subcommand's parser under it."""
    out = list(_BOUND.get(parser, ()))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += bound(sub)
    return out


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]
) -> argparse.Namespace:
    """`parser.parse_args(argv)`, with every flag the command line left out taken from
    `environ` when its variable is set. `env_sources` on the result maps each flag's dest to the
    variable it came from, so that later checks can name it."""
    bindings = bound(parser)
    for b in bindings:
        b.action.default = None if _repeatable(b.action) else UNSET
    try:
        ns = parser.parse_args(argv)
    finally:
        for b in bindings:
            b.action.default = b.default
    sources: dict[str, str] = {}
    flags: dict[str, tuple[str, ...]] = {}  # variable -> its flag's option strings
    for b in bindings:
        dest = b.action.dest
        if not hasattr(ns, dest):
            continue  # another subcommand's flag
        value = getattr(ns, dest)
        if value is not UNSET and not (value is None and _repeatable(b.action)):
            continue  # given on the command line: it wins
        raw = environ.get(b.name)
        if raw is None:
            setattr(ns, dest, list(b.default) if isinstance(b.default, list) else b.default)
            continue
        setattr(ns, dest, _convert(b, raw))
        sources[dest] = b.name
        flags[b.name] = tuple(b.action.option_strings)
    ns.env_sources = sources
    ns.env_flags = flags
    return ns


def as_given(message: str, args: argparse.Namespace) -> str:
    """An error `message` with the flags (and their `hopmeter_*` options) whose values came from
    the environment named by their variables: the user set HOPMETER_RECORDS, not --records."""
    flags: Mapping[str, tuple[str, ...]] = getattr(args, "env_flags", {})
    for name, strings in flags.items():
        if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message):
            continue  # the check named the variable itself (`source`)
        option = "hopmeter_" + name.removeprefix(PREFIX).lower()
        for said in (*strings, option):
            if re.search(rf"(?<![\w-]){re.escape(said)}(?![\w-])", message):
                message = re.sub(rf"(?<![\w-]){re.escape(said)}(?![\w-])", name, message)
    return message


def source(args: argparse.Namespace, dest: str, flag: str) -> str:
    """What to call a value in an error: its variable if it came from the environment, else
    its flag."""
    sources: Mapping[str, str] = getattr(args, "env_sources", {})
    return sources.get(dest, flag)


def _repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)


def _convert(b: Binding, raw: str) -> Any:
    action, parser = b.action, b.parser
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        word = raw.strip().lower()
        if word not in TRUE | FALSE:
            parser.error(f"{b.name}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
        on = word in TRUE
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    if _repeatable(action) or action.nargs not in (None, "?"):
        try:
            parts = shlex.split(raw)
        except ValueError as exc:  # unbalanced quotes
            parser.error(f"{b.name}={raw!r}: {exc}")
        return [_one(b, raw, part) for part in parts]
    return _one(b, raw, raw)


def _one(b: Binding, raw: str, text: str) -> Any:
    action, parser = b.action, b.parser
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        parser.error(f"{b.name}={raw!r}: {exc}")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        parser.error(f"{b.name}={raw!r}: expected one of {choices}")
    return value
