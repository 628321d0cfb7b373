"""The sans-I/O core: parsers, accounting and detectors.

Nothing in this package imports mitmproxy or prometheus_client, opens a socket or reads a clock;
every stateful piece takes bytes and a time (`feed(data, now)`) and returns events.
"""
