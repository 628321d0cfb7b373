"""`hopmeter demo --browser`'s choices: which clients to run, which Chromium; the page's clients
and the demo's list agree. (The demo itself runs in tests/integration/test_browser.py.)"""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from hopmeter.demo.chat_page import CLIENTS, chromium_path, clients_from
from hopmeter.errors import UsageError


def test_clients_are_all_or_a_list_of_known_ones() -> None:
    """ "all" is every client in the page's order; a list keeps its order; a name the page does
    not know is one line naming the choices."""
    assert clients_from("all") == list(CLIENTS)
    assert clients_from("per_token, good") == ["per_token", "good"]
    with pytest.raises(UsageError, match="expected all or a comma list of good"):
        clients_from("good,telepathy")
    with pytest.raises(UsageError):
        clients_from(",")


def test_the_demo_lists_the_page_s_clients() -> None:
    """The clients the demo can run are those demo.js defines, in its order."""
    js = (files("hopmeter") / "data" / "browser" / "demo.js").read_text()
    table = js[js.index("const CLIENTS = {") : js.index("};", js.index("const CLIENTS = {"))]
    assert tuple(re.findall(r"^  (\w+): \[", table, flags=re.MULTILINE)) == CLIENTS


def test_chromium_comes_from_the_environment_or_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """$HOPMETER_CHROMIUM wins; without it and without chromium on PATH, one line says how to
    get it."""
    monkeypatch.setenv("HOPMETER_CHROMIUM", "/opt/my/chromium")
    assert chromium_path() == "/opt/my/chromium"
    monkeypatch.delenv("HOPMETER_CHROMIUM")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="apt install chromium"):
        chromium_path()
