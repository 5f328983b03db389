"""The asyncio server, in packages by concept, each importing only those below it (checked by
tests/test_layers.py):

    serve                       the composition root: builds the parts, runs until a signal
    ops                         HTTP port, metrics, status page
    cluster                     etcd coordination, the object-store data path
    net                         listener and connections
    requests                    the handler of each request type
    security                    authentication, grants, tokens, TLS, quotas
    catalog                     every topic's files, state and lifecycle
    subscriptions   schemas     delivery; topic schemas
    topics                      topics and partitions: the produce and read paths
    (this folder)               config, logs, reply, topic_turns, memory_budget, loop_lag...

The modules of this folder are what every package may use: `config` (frozen dataclasses of the
configuration) and `config_file` (loading it from TOML), `logs` (structlog setup), `build_info` (the
version), `request_table` (every request type's topic field, grant, turn and pre-authentication
flag, declared once, on its handler, with `handles`), `reply` (what a handler answers and what the
answer waits for), `topic_turns` (per-topic turns that keep operations on a topic in order),
`memory_budget` (the bytes client backlogs may hold, per subscription and in all), `loop_lag`
(how long the event loop is held) and `open_files` (the open-files limit, raised at start, and the
reliable partitions it allows). `serve` sits on top of everything. Nothing imports this package
except the `headwater serve` command (`headwater.cli.serve_command`; `headwater.cli.main` reads the
version from `build_info`)."""
