"""The Kafka protocol front end (docs/KAFKA.md): a second listener that lets stock Kafka clients
produce to and fetch from Headwater topics through the same `requests.broker.Broker`.

`kafka_listener` (the port, accepting, timeouts) → `kafka_connection` (frames, requests handled,
answers in request order) → `handlers` (each Kafka API as native requests to the broker;
`config_handlers`: AlterConfigs and IncrementalAlterConfigs; `txn_handlers`: the transaction
APIs, calls to `requests.transaction_coordinator`), with
`messages` (each API's request and response as typed classes, one module per family), `codec`
(frames and bodies decoded into them with bounded work, and encoded from them), `apis` (the APIs
and versions served), `kafka_errors` (Headwater's error codes as Kafka's),
`kafka_nodes` (node ids, partition leaders and group coordinators: one broker's or a cluster's)
and `kafka_metrics` (its Prometheus collector). Consumer
groups: `group_handlers` (their APIs) and `groups` (membership and rebalances, in memory); a
group's offsets are `requests.group_offsets`. Kafka 4's consumer groups (KIP-848):
`consumer_group_handlers` (ConsumerGroupHeartbeat, ConsumerGroupDescribe, and the classic APIs
as they see such groups) and `consumer_groups` (the groups, in memory). Share groups (KIP-932):
`share_handlers` (their APIs), `share_groups` (membership, in memory) and `share_sessions` (a
member's records, through the group's Shared subscription). Topics travel by id in both
(`topic_ids`).
Imports `requests`, `catalog`, `subscriptions` and `net.accepting`; only `serve` imports it.
"""
