"""Where a callgrind dump's instructions go, by function, with Python's functions named.

Callgrind sees the interpreter's C functions only. A proxy started with PYTHONPERFSUPPORT=1 runs
every Python function through a trampoline of its own (Python 3.12's perf support) and writes
each trampoline's address and the function's name to /tmp/perf-<pid>.map; callgrind names code
without a symbol by its address, so the trampoline's inclusive cost is its Python function's (its
callees included). A Python function has no self cost of its own here (its bytecode runs in
`_PyEval_EvalFrameDefault`): the self list is C functions, the inclusive list both. The
trampolines also stop the interpreter from inlining Python-to-Python calls, so a profiled run
costs more than a plain one: its figures are for the breakdown only.

`table(dump)` reads one dump through `callgrind_annotate`; `per_unit` turns two dumps' tables
into Ir per event (their difference over the extra events) and per flow: the top functions by
inclusive Ir (C and Python), by self Ir (C), Python's alone by inclusive Ir, and hopmeter's own.
"""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+(.*)$")
_OBJ = re.compile(r"^(.*?)(?: \[([^\]]*)\])?$")
_ADDRESS = re.compile(r"^0x([0-9a-f]+)$")
HOPMETER_MARK = "/addons/hopmeter/"  # in a Python function's file: one of hopmeter's own


def perf_map(pid: int) -> dict[int, str]:
    """The trampolines' addresses and their Python functions ("py::name:file"), if written."""
    path = Path(f"/tmp/perf-{pid}.map")
    names: dict[int, str] = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            address, _, rest = line.partition(" ")
            _size, _, name = rest.partition(" ")
            if name.startswith("py::"):
                names[int(address, 16)] = name
    return names


def _annotate(dump: Path, inclusive: bool) -> dict[str, tuple[int, str]]:
    """callgrind_annotate's function table: name -> (Ir, object). A function's files are summed
    (the eval loop spans several); recursion levels (`fn'2`) are left out of the inclusive table,
    where the outermost level holds them, and summed into the self table."""
    out = subprocess.run(
        [
            "callgrind_annotate",
            "--threshold=100",
            "--auto=no",
            f"--inclusive={'yes' if inclusive else 'no'}",
            str(dump),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    table: dict[str, tuple[int, str]] = {}
    body = out.split("file:function", 1)[-1]
    for line in body.splitlines():
        found = _LINE.match(line)
        if not found:
            continue
        ir = int(found.group(1).replace(",", ""))
        where = _OBJ.match(found.group(2))
        assert where is not None
        place, obj = where.group(1), where.group(2) or ""
        if place == "PROGRAM TOTALS":
            continue
        _file, _, fn = place.rpartition(":") if ":" in place else ("", "", place)
        fn, recursion, _level = fn.partition("'")
        if recursion and inclusive:
            continue
        old, old_obj = table.get(fn, (0, ""))
        table[fn] = (old + ir, old_obj or obj)
    return table


def table(dump: Path, names: dict[int, str]) -> dict[str, dict[str, Any]]:
    """Self and inclusive Ir per function of one dump, Python's trampolines named from `names`."""
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: {"self": 0, "inclusive": 0, "obj": ""})
    for kind, inclusive in (("self", False), ("inclusive", True)):
        for fn, (ir, obj) in _annotate(dump, inclusive).items():
            address = _ADDRESS.match(fn)
            name = names.get(int(address.group(1), 16), fn) if address else fn
            row = rows[name]
            row[kind] += ir
            row["obj"] = row["obj"] or obj
    return dict(rows)


def per_unit(
    short: dict[str, dict[str, Any]],
    long: dict[str, dict[str, Any]],
    flows: int,
    short_events: int,
    long_events: int,
    *,
    top: int,
) -> dict[str, list[dict[str, Any]]]:
    """The `top` functions by inclusive and by self Ir, per event and per flow, from the two
    loads' tables (the same arithmetic as the totals: per event = the difference over the extra
    events, per flow = the rest of the short load). Unnamed trampolines (Python functions made
    before the map was written) and ones below zero are left out."""
    extra = flows * (long_events - short_events)
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in ("inclusive", "self"):
        event_rows, flow_rows = [], []
        for name in set(short) | set(long):
            if _ADDRESS.match(name):
                continue
            a = short.get(name, {}).get(kind, 0)
            b = long.get(name, {}).get(kind, 0)
            per_event = (b - a) / extra
            per_flow = (a - per_event * flows * short_events) / flows
            obj = (long.get(name) or short.get(name) or {}).get("obj", "")
            base = {"function": name, "obj": obj, "hopmeter": HOPMETER_MARK in name}
            event_rows.append({**base, "ir": round(per_event)})
            flow_rows.append({**base, "ir": round(per_flow)})
        for rows, unit in ((event_rows, "event"), (flow_rows, "flow")):
            rows.sort(key=lambda r: -r["ir"])
            out[f"{kind}_per_{unit}"] = [r for r in rows[:top] if r["ir"] > 0]
            if kind == "inclusive":
                python = [r for r in rows if r["function"].startswith("py::") and r["ir"] > 0]
                out[f"python_inclusive_per_{unit}"] = python[:top]
                ours = [r for r in python if r["hopmeter"]]
                out[f"hopmeter_inclusive_per_{unit}"] = ours[:top]
    return out


def render(functions: dict[str, list[dict[str, Any]]], limit: int = 20) -> str:
    """The per-event tables as text, hopmeter's own functions marked `*`."""
    lines = []
    for key in ("python_inclusive", "hopmeter_inclusive", "self"):
        lines.append(f"  {key.replace('_', ' ')} Ir per event:")
        for row in functions.get(f"{key}_per_event", [])[:limit]:
            mark = "*" if row["hopmeter"] else " "
            name = row["function"].removeprefix("py::")
            lines.append(f"  {mark} {row['ir'] / 1e3:9.2f} k  {name}")
    return "\n".join(lines)
