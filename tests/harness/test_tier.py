"""The fast tier's guard, run on small test files by pytest's own `pytester` (in this process)."""

from __future__ import annotations

import ast
import os
import socket
import subprocess

import pytest
import uvloop

from tests.harness.tier import INTEGRATION, FastTier

INI = """
[pytest]
markers =
    integration: starts a process
    loopback: opens a socket
"""


def _run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    """Run `source` as a test file under the fast tier's plugin."""
    pytester.makeini(INI)
    pytester.makepyfile(test_it=source)
    return pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q", plugins=[FastTier()]
    )


def test_a_process_fails_the_test_naming_the_integration_marker(pytester: pytest.Pytester) -> None:
    """A test that starts a process fails there, naming itself, the command and the marker."""
    result = _run(
        pytester,
        """
        import subprocess

        def test_ls(tmp_path):
            subprocess.run(["ls", "-l"], check=True)
            (tmp_path.parent / "reached").touch()
        """,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*test_it.py::test_ls started a process (ls -l)*mark it @pytest.mark.integration*"]
    )
    assert not (pytester.path / "reached").exists()


def test_a_socket_fails_the_test_even_when_the_code_catches_the_error(
    pytester: pytest.Pytester,
) -> None:
    """A bind caught by the code under test still fails the test, naming the loopback marker."""
    result = _run(
        pytester,
        """
        import socket

        def test_serve():
            try:
                socket.create_server(("127.0.0.1", 0))
            except Exception:
                pass
        """,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*opened a socket (bind ('127.0.0.1', 0))*@pytest.mark.loopback*"])


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_event_loops_servers_and_clients_are_barred(pytester: pytest.Pytester, loop: str) -> None:
    """asyncio's and uvloop's servers and connections are barred alike (uvloop skips socket)."""
    result = _run(
        pytester,
        f"""
        import asyncio, uvloop, pytest

        async def serve():
            await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)

        async def connect():
            await asyncio.open_connection("127.0.0.1", 9)

        @pytest.mark.parametrize("step", [serve, connect])
        def test_it(step):
            {loop}.run(step())
        """,
    )
    result.assert_outcomes(failed=2)
    assert result.stdout.str().count("mark it @pytest.mark.loopback") >= 2


def test_a_skip_for_a_missing_tool_is_a_failure(pytester: pytest.Pytester) -> None:
    """A test that skips because it could not start a process fails: it needs a marker instead."""
    result = _run(
        pytester,
        """
        import shutil, subprocess, pytest

        def test_nginx():
            try:
                subprocess.run(["nginx", "-v"])
            except Exception:
                pytest.skip("nginx is not installed")
        """,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*started a process (nginx -v)*"])


def test_marked_tests_are_left_out_and_the_rest_run_with_loops_and_pipes(
    pytester: pytest.Pytester,
) -> None:
    """Marked tests are deselected; a plain test still runs event loops, socketpairs and pipes."""
    result = _run(
        pytester,
        """
        import asyncio, os, socket, subprocess, uvloop, pytest

        @pytest.mark.integration
        def test_process():
            subprocess.run(["true"], check=True)

        @pytest.mark.loopback
        def test_socket():
            socket.create_server(("127.0.0.1", 0)).close()

        def test_plain():
            asyncio.run(asyncio.sleep(0))
            uvloop.run(asyncio.sleep(0))
            a, b = socket.socketpair()
            a.sendall(b"x")
            assert b.recv(1) == b"x"
            a.close(), b.close()
            r, w = os.pipe()
            os.close(r), os.close(w)
        """,
    )
    result.assert_outcomes(passed=1, deselected=2)


def test_the_guard_is_removed_after_each_test(pytester: pytest.Pytester) -> None:
    """What the guard replaces is put back once the test is over."""
    owners = [(subprocess.Popen, "__init__"), (os, "fork"), (uvloop.Loop, "create_server")]
    owners += [(socket.socket, name) for name in ("bind", "connect", "connect_ex", "sendto")]
    before = [getattr(owner, name) for owner, name in owners]
    _run(pytester, "def test_nothing():\n    pass\n").assert_outcomes(passed=1)
    assert [getattr(owner, name) for owner, name in owners] == before


def _marks(module: ast.Module) -> list[str]:
    """The markers a test module's `pytestmark` names (one, or a list of them)."""
    for node in module.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return [ast.unparse(v) for v in values]
    return []


def test_every_integration_file_is_marked_so_the_tier_may_skip_the_folder() -> None:
    """Each tests/integration/test_*.py marks all its tests integration, as the fast tier, which
    leaves the folder out uncollected, takes for granted."""
    files = sorted(INTEGRATION.glob("test_*.py"))
    unmarked = [
        f.name for f in files if "pytest.mark.integration" not in _marks(ast.parse(f.read_text()))
    ]
    assert len(files) > 30 and unmarked == []
