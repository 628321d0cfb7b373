"""The token timeline as span attributes: the head kept, the rest counted, absurd input refused."""

from __future__ import annotations

from typing import Any

import pytest

from hopmeter.core import timeline
from hopmeter.core.timeline import DROPPED, OFFSET, SPAN_US, T_US, TOKENS, VERSION, decode, encode
from hopmeter.errors import OtlpError, TimelineError


def test_only_token_events_travel_in_microseconds() -> None:
    """Role preludes and [DONE] (0 tokens) are left out; times are whole microseconds."""
    events = [[0.05, 0, 0], [0.0600004, 1, 5], [0.8, 1, 9], [0.81, 0, 9]]
    assert encode(events) == {VERSION: 1, T_US: [60000, 800000], OFFSET: [5, 9]}


def test_tokens_travel_only_when_an_event_carried_more_than_one() -> None:
    """Per-event token counts are sent only when some event carried several."""
    assert encode([[0.1, 2, 4], [0.2, 1, 6]])[TOKENS] == [2, 1]


def test_the_head_is_kept_past_the_cap() -> None:
    """Past the cap the first events stay, the rest and the record's dropped are counted, and
    the whole stream's token span is carried."""
    events = [[i / 10, 1, i] for i in range(1, 11)]
    attrs = encode(events, events_dropped=3, cap=4)
    assert attrs[T_US] == [100000, 200000, 300000, 400000]
    assert attrs[DROPPED] == 6 + 3
    assert attrs[SPAN_US] == 900000


def test_round_trip_gives_the_records_events() -> None:
    """Decoding what encode wrote gives back the token events, in the record's shape."""
    events = [[0.1, 1, 4], [0.25, 3, 9], [0.5, 1, 12]]
    line = decode(encode(events))
    assert line is not None and line.events() == events
    assert len(line) == 3 and line.dropped == 0 and line.span_us is None
    assert line.nbytes() == 3 * 4 * 3


def test_a_span_without_a_timeline_decodes_to_none() -> None:
    """No timeline attributes: None, not an error."""
    assert decode({"hopmeter.hop": "edge"}) is None


@pytest.mark.parametrize(
    ("attrs", "why"),
    [
        ({T_US: [1, 2, 3], OFFSET: [1, 2]}, "differ in length"),
        ({T_US: [5, 4], OFFSET: [1, 2]}, "goes back"),
        ({T_US: [1, 2], OFFSET: [3, 2]}, "goes back"),
        ({T_US: ["1", "2"], OFFSET: [1, 2]}, "other than integers"),
        ({T_US: [1.5, 2], OFFSET: [1, 2]}, "other than integers"),
        ({T_US: [True, 2], OFFSET: [1, 2]}, "other than integers"),
        ({T_US: [-1, 2], OFFSET: [1, 2]}, "out of range"),
        ({T_US: [1, 2**40], OFFSET: [1, 2]}, "out of range"),
        ({T_US: "1,2", OFFSET: [1, 2]}, "not an array"),
        ({T_US: [0] * 16_385, OFFSET: [0] * 16_385}, "at most 16384"),
        ({T_US: [1], OFFSET: [1], TOKENS: [0]}, "one count of 1 or more"),
        ({T_US: [1], OFFSET: [1], TOKENS: [1, 1]}, "one count of 1 or more"),
        ({T_US: [1], OFFSET: [1], VERSION: 2}, "is not 1"),
        ({T_US: [1], OFFSET: [1], DROPPED: -3}, "not a count"),
        ({T_US: [1], OFFSET: [1], SPAN_US: "long"}, "not a count"),
    ],
)
def test_absurd_timelines_are_refused(attrs: dict[str, Any], why: str) -> None:
    """Unequal lengths, disorder, non-integers, out-of-range values, too many elements and an
    unknown version raise TimelineError, an OtlpError."""
    with pytest.raises(TimelineError, match=why) as exc:
        decode(attrs)
    assert isinstance(exc.value, OtlpError)


def test_the_cap_keeps_a_span_under_the_collectors_limits() -> None:
    """A capped timeline of the longest streams stays at the documented 1,024 events."""
    events = [[i / 1000, 1, i] for i in range(1, 9000)]
    assert len(encode(events)[T_US]) == timeline.MAX_EVENTS == 1024


def test_out_times_travel_per_token_event_and_come_back_aligned() -> None:
    """When the hop followed its bytes out, each token event's out time travels in µs (-1 where
    it was not followed) and decodes back beside the events; a prelude's out time is left out."""
    events = [[0.1, 0, 0], [0.2, 1, 2], [0.3, 2, 5], [0.4, 1, 7]]
    outs = [0.1001, 0.2002, None, 0.4004]
    attrs = encode(events, out_s=outs)
    assert attrs[timeline.OUT_US] == [200200, -1, 400400]
    line = decode(attrs)
    assert line is not None
    assert line.outs() == [0.2002, None, 0.4004]
    assert timeline.OUT_US not in encode(events)  # not followed: nothing travels
    assert decode(encode(events)).outs() == []  # type: ignore[union-attr]


@pytest.mark.parametrize("out_us", [[-2, 1], [1], [1.5, 2]])
def test_absurd_out_times_are_refused(out_us: list[Any]) -> None:
    """Out times below -1, of the wrong length or not integers make the timeline malformed."""
    attrs = {T_US: [1, 2], OFFSET: [1, 2], timeline.OUT_US: out_us}
    with pytest.raises(TimelineError):
        decode(attrs)
