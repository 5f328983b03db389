"""The request handlers: `broker` (one handler per request type, and the per-topic turns they
run in, from `topic_turns`), `reply` (what a handler answers and what the answer waits for),
`admin_requests`, `consumer_requests`, `map_requests`, `create_partitions` and `lookup`."""
