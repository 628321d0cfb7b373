"""Bare mitmproxy for the bench: stream every response body, do nothing else.

    mitmdump -q -s bench/bare_addon.py --mode reverse:http://127.0.0.1:9000@8080

Without `flow.response.stream` mitmproxy holds the whole body (DESIGN §9); with it set to True
each chunk is forwarded as it arrives. This is the floor hopmeter's own cost is measured against.
"""

from mitmproxy import http


class StreamAll:
    """Sets `flow.response.stream = True` in responseheaders; nothing more."""

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        flow.response.stream = True


addons = [StreamAll()]
