"""Topics and partitions: `topic` (the non-reliable publish path and the reliable append path),
`topic_settings` (per-topic settings from CREATE_TOPIC's configs), `lastvalue_index` (a topic's
last value per key), `idempotent_producers` (producer ids and their recent batches),
`transaction_index` (each partition's open and aborted transactions, kept across restarts),
`committed_feed` (a committed transaction's batches, for the subscriptions fed batches as they
pass),
`subscription_contract` (what a topic delivers to: the interface every subscription kind and
consumer implements), `subscription_registry` (a topic's subscriptions by name and by feed) and
`placement` (the deployment mode as the catalog sees it: durability, the partitions served here,
how a topic is defined and how the server's own records are written).
Imports only the server's foundation modules (`server.config`)."""
