"""Subscriptions and delivery, implementing `topics.subscription_contract`: `live_subscription`
(non-reliable topics), `reliable_subscription` (the asyncio pump around `durables.delivery`) with
`append_signal` and `key_shared_round`, `reliable_store` (definitions and cursors in RocksDB),
`snapshot_feed` (the `snapshot` start position) and `deadletter`. Imports `topics`."""
