"""hopmeter: a transparent measuring reverse proxy for LLM token streams."""

__version__ = "0.1.0"
