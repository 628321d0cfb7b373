"""`hopmeter demo`: the demo upstream, the proxy in front of it and sample streams through both
(`command.py`), or a chat page through a browser-measuring proxy (`chat_page.py`).

It sits above the tools it runs (hopmeter.proxy, hopmeter.upstream, hopmeter.probe): none of
them imports it.
"""
