"""Two in-memory HTTP/2 connections talking to each other, for tests and benches of the relay's
HTTP/2 steps: what one side has to send is handed to the other's `receive_data`."""

from __future__ import annotations

from typing import Any


def shake(a: Any, b: Any) -> None:
    """Move what each side has to send to the other until neither has any (at most 8 rounds:
    settings, their acknowledgements and window updates settle in fewer)."""
    for _ in range(8):
        out_a, out_b = a.data_to_send(), b.data_to_send()
        if not out_a and not out_b:
            return
        if out_a:
            b.receive_data(out_a)
        if out_b:
            a.receive_data(out_b)
