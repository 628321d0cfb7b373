"""`hopmeter join --serve`: hopmeter spans in over OTLP, per-segment holds out, live.

otlp.py (protobuf in, responses out), window.py (spans of one trace for a bounded time, paired as
soon as both sides are in), http.py and grpc.py (the OTLP receivers), service.py (the running
service: receivers, window, metrics, joined records). docs/fleet.md says how to deploy it.
"""
