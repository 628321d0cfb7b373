"""The sans-I/O core: what hopmeter measures and concludes, from bytes and times.

Wire formats (which API a body speaks, SSE and NDJSON framing, content decoding, the per-API
parsers in apis/), token counting, the per-flow meter with its figures and detectors, why an
upstream failed, the flow record and its vocabulary, the bytes out to a client (delivery, ledger),
hops and the join (pairing flows, segment holds, which hop is outer, trace context, spans and
their OTLP form), and the browser's beacon and its findings.

Nothing in this package imports mitmproxy or prometheus_client, opens a socket or reads a clock;
every stateful piece takes bytes and a time (`feed(data, now)`) and returns events.
"""
