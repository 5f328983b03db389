"""The network front end: `accepting` and `listener` (the accept loop, which survives running
out of file descriptors), `admission` (how many connections may wait to authenticate, in all and
per address), `connection_core` (a connection's rules without its I/O, under both ports: frame
limits, authentication state, requests waiting and answers in order, memory charges, what runs
off the loop, quota mutes, write back-pressure), `client_connection` (the native port's shell
around it: bytes in, frames decoded, handlers called, replies and deliveries out) with its
security hooks in `guard`, `traffic` (what went out, how late) and
`stage_trace` (where a sampled message's time went: read, appended, answered, dispatched).
Imports `requests` and `security` (and the topic contract its consumers implement)."""
