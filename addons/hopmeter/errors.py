"""Every error hopmeter raises on purpose, in one hierarchy.

Inside the code an error is raised where the fault is known, with a message that names the
problem and the fix; the command line (hopmeter.cli) turns any `HopmeterError` into that one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations


class HopmeterError(Exception):
    """Base of every error hopmeter raises on purpose."""


class UsageError(HopmeterError):
    """A flag or value the user gave that cannot work; the message names the fix."""


class PortError(UsageError):
    """An address hopmeter must listen on cannot be bound (in use, or does not resolve)."""


class StreamLimitError(HopmeterError):
    """A bounded buffer would have grown past its limit."""


class DecodingError(HopmeterError):
    """A side copy of a body could not be decoded (bad gzip, br, zstd or deflate data)."""


class DecodedSizeError(DecodingError, StreamLimitError):
    """Decoding would produce more bytes than a measuring copy may hold (a compression bomb)."""


class TokenizerError(UsageError):
    """A tokenizer named by the user cannot be loaded; the message says what to do."""


class ScenarioError(UsageError):
    """A demo-upstream scenario key or value that does not exist or does not parse."""


class TranscriptError(UsageError):
    """A recorded stream given to the demo upstream cannot be read or replayed."""


class ChaosError(UsageError):
    """A `--chaos` action list that does not parse."""


class OtelConfigError(UsageError, ValueError):
    """An OpenTelemetry endpoint or setting that cannot work."""


class OtlpError(HopmeterError, ValueError):
    """An OTLP payload or file that is not a trace export hopmeter can read (HTTP 400)."""


class TimelineError(OtlpError):
    """A span's hopmeter.timeline attributes are present but absurd (lengths, order, range)."""


class BeaconError(HopmeterError):
    """A browser beacon that cannot be read: not JSON, a field of the wrong type or size."""


def said(exc: BaseException, limit: int = 300) -> str:
    """An exception as a record or a log line says it: its type and text, at most `limit`
    characters. Never raises (an exception whose text fails is named by its type)."""
    name = type(exc).__name__
    try:
        return f"{name}: {exc}"[:limit]
    except Exception:
        return name[:limit]
