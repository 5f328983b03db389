"""The `headwater` command: one module per command group. `entry` is the entry point: `serve` goes
to `serve_command` (its options and the server's start, without the client library), every other
command to `main`, which parses the arguments and dispatches; `parser` declares the client commands'
arguments, `arguments` refuses text the wire cannot carry and decodes `--key-encoding` and
`--value-encoding`, and `output` prints their results; `client_commands` holds topic, produce, map,
subscription and server, `consume_command` consume, `schema_commands` schema, `token_commands` token
(the tokens file), `cluster_commands` cluster status (read from etcd), and `compact_command` the
Spark job. `serve_command`, `compact_command`, `token_commands` and `cluster_commands` are the only
modules that reach the server or Spark, and only when their command runs; every other one is a
client of the protocol and imports only `headwater.client` and `headwater.wire`."""
