"""The error hierarchy: one base the command line catches, usage errors the user can fix."""

from __future__ import annotations

import gzip
import inspect
from pathlib import Path

import pytest

from hopmeter import errors
from hopmeter.cli import main
from hopmeter.core.decoding import GzipDecoder
from hopmeter.errors import (
    DecodedSizeError,
    DecodingError,
    HopmeterError,
    OtelConfigError,
    StreamLimitError,
    UsageError,
)

CLASSES = [
    c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__
]


def test_every_error_is_a_hopmeter_error() -> None:
    """Each error hopmeter raises on purpose is caught by the command line's one handler."""
    assert HopmeterError in CLASSES and len(CLASSES) > 1
    assert all(issubclass(c, HopmeterError) for c in CLASSES)


def test_errors_the_user_fixes_are_usage_errors() -> None:
    """Port, tokenizer, scenario, transcript, chaos and OpenTelemetry errors are usage errors."""
    usage = {c.__name__ for c in CLASSES if issubclass(c, UsageError) and c is not UsageError}
    assert usage == {
        "PortError",
        "TokenizerError",
        "ScenarioError",
        "TranscriptError",
        "ChaosError",
        "OtelConfigError",
    }
    assert issubclass(OtelConfigError, ValueError)  # configuration code expects a ValueError


def test_a_compression_bomb_is_both_a_decoding_error_and_a_limit() -> None:
    """A bomb stopped by the decoder's cap is caught as a decoding failure and as a limit."""
    bomb = gzip.compress(bytes(1_000_000))
    with pytest.raises(DecodedSizeError) as caught:
        GzipDecoder(max_bytes=10_000).decode(bomb)
    assert isinstance(caught.value, DecodingError)
    assert isinstance(caught.value, StreamLimitError)


def test_the_command_line_prints_an_error_as_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A HopmeterError (here, an unreadable records file) is one line on stderr and status 2."""
    missing = tmp_path / "none.jsonl"
    assert main(["report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"hopmeter: cannot read records from {missing}: No such file or directory\n"


def test_a_usage_error_names_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error from a command (a mistyped scenario key) is one line naming the known keys."""
    assert main(["upstream", "--scenario", "colaesce=2"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hopmeter: unknown scenario key 'colaesce'")
    assert "coalesce" in line


@pytest.mark.parametrize(
    ("given", "named"),
    [(["--chaos", "bogus"], "--chaos"), (["--set", "hopmeter_chaos=bogus"], "hopmeter_chaos")],
)
def test_a_bad_value_found_at_configure_names_how_it_was_given(
    given: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hopmeter run --chaos bogus` is refused by the addon that reads it, which knows only its
    option: the one line says `--chaos`, as the user typed it (the option where `--set` gave
    it). Nothing binds: the options are refused before the proxy starts."""
    argv = ["run", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--metrics", "off", *given]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"hopmeter: {named}: unknown chaos action 'bogus'; known: rechunk, " + (
        "split_utf8, crlf, cr"
    )


def test_said_names_an_exception_and_never_raises() -> None:
    """An exception as a record says it: type and text, clipped; one whose text fails by its
    type (said in error paths, where a second exception would escape)."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    said = errors.said
    assert said(ValueError("bad byte")) == "ValueError: bad byte"
    assert said(ValueError("x" * 500)) == ("ValueError: " + "x" * 500)[:300]
    assert said(Unprintable()) == "Unprintable"


def test_an_error_line_never_says_a_password_or_key_it_quotes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A usage error quotes the value the user gave; in a container that line goes to a log
    store: a URL's password and query values, and key-shaped strings, are redacted in it."""
    assert main(["run", "ftp://admin:S3cretPW@host/?key=S3cretQ", "--metrics", "off"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "S3cret" not in line
    assert line == (
        "hopmeter: upstream 'ftp://[redacted]@host/?key=[redacted]': expected an http:// or "
        "https:// URL"
    )
