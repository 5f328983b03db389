"""The request handlers: `broker` (one handler per request type, each run in its topic's turn when
it must be), `admin_requests`, `consumer_requests`, `fetch` (reading a partition by offset),
`map_requests`, `create_partitions`, `lookup`, `transaction_coordinator` (each transactional id's
state, and the end of its transactions) with `transaction_requests` (the native requests that call
it) and `transaction_placement` (where it keeps states and how it writes markers, per deployment),
`group_offsets` (a Kafka group's offsets, or a transaction's, are the cursor of the reliable
subscription of its name), `partition_ownership` (which broker serves each partition) and
`topic_definitions` (where topics are defined, and what attaches a consumer), both gathered with
producer ids and transactions into `placement`, the deployment mode the broker is built with (one
broker, or a cluster). Imports `catalog`, `topics`, `subscriptions` and `schemas`."""
