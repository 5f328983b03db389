"""Delivery semantics, independent of I/O: no asyncio, no clock, no files. `cursor` holds a
reliable subscription's acknowledgement state per partition and its encoding; `delivery` is the
at-least-once state machine of one reliable subscription (in flight, ack timeouts, backoff,
redelivery, dead-letter decisions), driven with `now` as an argument; `group` picks who receives
next (Exclusive, Shared, Failover) and `keyshared` who owns a key under Key_Shared; `producers`
deduplicates idempotent produces; `partition_transactions` follows a partition's open and
aborted transactions and its last stable offset; `transaction_state` is a transactional id's
state machine at its coordinator; `lastvalue` plans what a batch does to a topic's last values;
`consumer_protocol` is a Kafka 4 (KIP-848) consumer group at its coordinator: epochs, assignors,
revoke-then-assign reconciliation.
Imports `wire` only."""
