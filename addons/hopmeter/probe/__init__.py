"""`hopmeter probe`: a canary request through the real path, judged at the client.

`canary` is what the probe asks for and what a `hopmeter upstream` at the origin will send back;
`judge` is sans-I/O (a scenario and the client's stamped reads in, a verdict out), and `strict`
its checks of a canary that came back, every byte and hold against what the upstream sent; `http`
is the one small streaming HTTP/1.1 client that stamps every read (the demo uses it too);
`output` is what the probe prints, its secrets redacted; `command` is the subcommand.
"""
