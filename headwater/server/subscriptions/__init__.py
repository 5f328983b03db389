"""Subscriptions and delivery: `contract` (what a topic delivers to), `subscription_registry`
(a topic's subscriptions by name and by feed), `live_subscription` (non-reliable topics),
`reliable_subscription` (the asyncio pump around `durables.delivery`) with `append_signal` and
`key_shared_round`, `reliable_store` (definitions and cursors in RocksDB), `snapshot_feed` (the
`snapshot` start position) and `deadletter`."""
