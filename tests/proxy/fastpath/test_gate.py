"""Tests for hopmeter.proxy.fastpath.gate: the fast paths are allowed only with the releases and
the code they were read against, and a difference is one line naming it."""

from __future__ import annotations

import linecache
from typing import Any

import pytest

from hopmeter.proxy.fastpath import gate


def test_the_installed_libraries_pass() -> None:
    """mitmproxy, h11, h2 and Python as installed here are those the table was read in."""
    assert gate.check() is None
    assert gate.check_h2_upstream() is None


def test_every_mirrored_function_has_its_fingerprints() -> None:
    """The table and the lists of mirrored functions name the same functions (a function two
    paths mirror is in each list, with one entry in the table)."""
    mirrored = set(gate.MIRRORED) | set(gate.MIRRORED_H2) | set(gate.MIRRORED_H2_FRAMES)
    assert set(gate.FINGERPRINTS) == mirrored
    assert not set(gate.MIRRORED) & set(gate.MIRRORED_H2)
    assert all(gate.FINGERPRINTS.values())


@pytest.mark.parametrize(
    ("library", "version"), [("mitmproxy", "12.4.0"), ("h11", "0.17.0"), ("python", "3.14.0")]
)
def test_a_release_not_read_turns_them_off_in_one_line(library: str, version: str) -> None:
    """A release outside those read is named, with the ones read, in a line that says where it
    is counted."""

    def versions(name: str) -> str:
        return version if name == library else gate.version_of(name)

    line = gate.check(version=versions)
    assert line is not None and "\n" not in line
    assert f"{library} {version} is not a release they were read against" in line
    assert 'hopmeter_relay_declined_total{reason="version"}' in line


def test_changed_code_is_named_by_its_first_function() -> None:
    """A release whose mirrored functions changed is named by the first that differs and how
    many more did."""
    changed = {"mitmproxy Http1Connection.read_body", "h11 ChunkedReader.__call__"}

    def digest(obj: Any) -> str:
        name = next(n for n, o in gate.MIRRORED.items() if o is obj)
        return "0" * 16 if name in changed else gate.fingerprint(obj)

    line = gate.check(digest=digest)
    assert line is not None
    assert f"mitmproxy {gate.version_of('mitmproxy')}'s Http1Connection.read_body" in line
    assert "(and 1 more)" in line


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ("h2 FrameBuffer.__next__", "h2 {h2}'s FrameBuffer.__next__"),
        ("mitmproxy Http2Client.handle_h2_event", "mitmproxy {mitmproxy}'s Http2Client"),
    ],
)
def test_changed_http2_code_turns_off_the_relay_behind_http2_upstreams_alone(
    changed: str, named: str
) -> None:
    """What only the relay behind an HTTP/2 upstream leans on (h2, mitmproxy's HTTP/2 client)
    turns that part off, in a line of its own; the other fast paths stay."""

    def digest(obj: Any) -> str:
        name = next(n for n, o in (gate.MIRRORED | gate.MIRRORED_H2).items() if o is obj)
        return "0" * 16 if name == changed else gate.fingerprint(obj)

    assert gate.check(digest=digest) is None
    line = gate.check_h2_upstream(digest=digest)
    assert line is not None and "\n" not in line
    assert line.startswith("hopmeter: the relay behind HTTP/2 upstreams is off: ")
    where = {"h2": gate.version_of("h2"), "mitmproxy": gate.version_of("mitmproxy")}
    assert named.format(**where) in line


def test_an_h2_release_not_read_turns_off_the_relay_behind_http2_upstreams_alone() -> None:
    """An h2 outside the releases read: named, and only that part is off."""

    def versions(name: str) -> str:
        return "4.5.0" if name == "h2" else gate.version_of(name)

    assert gate.check(version=versions) is None
    line = gate.check_h2_upstream(version=versions)
    assert line is not None and "h2 4.5.0 is not a release they were read against" in line


def test_changed_h2_send_code_turns_off_the_relays_own_frame_steps_alone() -> None:
    """A change in what h2_frames stands in for (here h2's `H2Stream.send_data`) turns off its
    steps alone, in a line of its own: the relay, behind HTTP/2 upstreams too, stays on."""
    changed = gate.MIRRORED_H2_FRAMES["h2 H2Stream.send_data"]

    def digest(obj: Any) -> str:
        return "0" * 16 if obj is changed else gate.fingerprint(obj)

    assert gate.check(digest=digest) is None
    assert gate.check_h2_upstream(digest=digest) is None
    line = gate.check_h2_frames(digest=digest)
    assert line is not None and "\n" not in line
    assert line.startswith("hopmeter: the relay's own HTTP/2 DATA frame steps are off: ")
    assert f"h2 {gate.version_of('h2')}'s H2Stream.send_data" in line
    assert "the relay stays on" in line


def test_code_that_cannot_be_read_turns_them_off() -> None:
    """No source to compare (a frozen build) is a difference, not a pass."""

    def digest(obj: Any) -> str:
        raise OSError("could not get source code")

    line = gate.check(digest=digest)
    assert line is not None and "is not the code they were read against" in line


def test_a_fingerprint_is_the_digest_of_the_source() -> None:
    """The same source gives the same digest; a pattern's text is digested as it is."""
    assert gate.fingerprint(gate.check) == gate.fingerprint(gate.check)
    assert gate.fingerprint(b"abc") != gate.fingerprint(b"abd")
    assert len(gate.fingerprint(b"abc")) == 16


def test_the_check_leaves_no_source_lines_behind() -> None:
    """The sources read for the digests are not kept in linecache after the check (it runs once
    at start; the lines would stay for the process's life), and a file cached before stays."""
    linecache.getlines(gate.__file__)
    before = set(linecache.cache)
    assert gate.check() is None
    assert gate.check_h2_upstream() is None
    assert gate.check_h2_frames() is None
    assert set(linecache.cache) == before
