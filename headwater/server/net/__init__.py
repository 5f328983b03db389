"""The network front end: `accepting` and `listener` (the accept loop, which survives running
out of file descriptors), `admission` (how many connections may wait to authenticate, in all and
per address), `client_connection` (bytes in, frames decoded, handlers called, replies and
deliveries out) with its security hooks in `guard`, and `traffic` (what went out, how late).
Imports `requests` and `security` (and the topic contract its consumers implement)."""
