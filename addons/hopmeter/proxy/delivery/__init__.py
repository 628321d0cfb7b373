"""Following each chunk's bytes out to the client: `conn` wraps a client connection's writer
(the real write first, then the count), `lane` looks at the buffers while bytes wait and says,
per flow, when each chunk left the process and was sent (docs/design.md §4, "Bytes out")."""
