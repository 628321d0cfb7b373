"""`hopmeter probe`: a canary request through the real path, judged at the client.

`judge` is sans-I/O (a scenario and the client's stamped reads in, a verdict out); `http` is the
one small streaming HTTP/1.1 client that stamps every read (the demo uses it too); `command` is the
subcommand.
"""
