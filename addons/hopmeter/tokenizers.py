"""Token counters per model, loaded once and cached; a tokenizer that cannot load falls back."""

from __future__ import annotations

from hopmeter.core.accounting import Counter
from hopmeter.core.tokens import check_tokenizer, make_counter
from hopmeter.log import get_logger

log = get_logger()

# Model names come from traffic, so the cache is bounded; 256 distinct models is far more than one
# deployment serves, and a miss only costs a dictionary lookup in the tokenizer library's own cache.
MAX_CACHED_MODELS = 256


class Counters:
    """Chooses a counter by model name, or uses the one named by `--tokenizer`."""

    def __init__(self, tokenizer: str | None) -> None:
        """Raises TokenizerError when a named tokenizer cannot be used (checked at start-up)."""
        if tokenizer:
            check_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self._by_model: dict[str | None, Counter] = {}
        self._warned: set[str] = set()

    def for_model(self, model: str | None) -> Counter:
        """The counter for `model` (the forced tokenizer when one was given)."""
        key = None if self.tokenizer else model
        counter = self._by_model.get(key)
        if counter is None:
            counter = make_counter(model, self.tokenizer)
            reason = getattr(counter, "fallback_reason", None)
            if reason and reason not in self._warned:
                self._warned.add(reason)
                log.warning("hopmeter: tokens are estimated", reason=reason)
            if len(self._by_model) >= MAX_CACHED_MODELS:
                self._by_model.clear()
            self._by_model[key] = counter
        return counter

    def preload(self) -> None:
        """Load the default encoding now (~0.3 s), not on the first flow's event loop turn."""
        self.for_model(None)


def load_counter(tokenizer: str | None) -> Counters:
    """The counters for this process; `tokenizer` forces one encoding or file for every flow."""
    return Counters(tokenizer)
