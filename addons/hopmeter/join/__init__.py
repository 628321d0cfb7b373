"""What `hopmeter join` reads beyond records: OTLP files, and spans over OTLP, live (`--serve`).

files.py (records, OTLP JSON or protobuf files, told apart by content), otlp.py (protobuf in,
responses out), window.py (spans of one trace for a bounded time, paired as soon as both sides
are in), http.py and grpc.py (the OTLP receivers), service.py (the running service: receivers,
window, metrics, joined records). docs/fleet.md says how to deploy it.
"""
