"""The `headwater` command: one module per command group. `main` parses the arguments and
dispatches; `parser` declares the client commands' arguments and `output` prints their results.
`serve` (in `main`) and `compact_command` are the only places that reach the server or Spark; every
other command is a client of the protocol and imports only `headwater.client` and
`headwater.wire`."""
