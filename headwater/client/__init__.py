"""The Python client: `client` (the asyncio `Client` over one connection, with its operator requests
in `admin_calls` and its cluster routing in `cluster_calls`), `broker_connection` (its I/O around
`wire.session`), `producer` with `producer_config`, `accumulator`, `sender` and `transaction` (a
transactional producer's transactions), `consumer` with `consumer_legs` (one leg per owning broker
in a cluster) and `message_batch`, `fetched` (a FETCH answer), `map_client` and `routed_maps`,
`router` and `routing_table` (which broker owns which partition), `credentials` (TLS and the
handshake), `port_probe` (what kind of port closed on us without a word: TLS or Kafka),
`reconnect`, `schema_codec`, and `blocking` (plain sockets, for locust). It imports only
`headwater.wire`; the public names are re-exported by `headwater`."""
