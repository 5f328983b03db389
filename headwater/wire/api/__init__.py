"""The protocol's APIs by family, each family's construct schemas beside its struct fast paths.

`base` holds the building blocks (`Api`, `PushApi`, the construct primitives and the shared
struct formats). Each family module declares its APIs as `Api` entries: `produce` (PRODUCE and
the DELIVER push), `consume` (SUBSCRIBE, FLOW, ACK, NACK, SEEK, UNSUBSCRIBE, DELETE_SUBSCRIPTION
and the CONSUMER_CLOSED and MESSAGES_DROPPED pushes), `maps` (MAP_GET/SET/SCAN/SIZE), `admin`
(topics, producer ids, API_VERSIONS), `auth` (AUTHENTICATE and the THROTTLE push), `schemas`
(REGISTER/GET/LIST/CHECK_SCHEMA), `cluster` (LOOKUP) and `transactions` (INIT_TRANSACTIONS,
ADD_PARTITIONS_TO_TXN, ADD_ACKS_TO_TXN, END_TXN, WRITE_TXN_MARKER, WRITE_TXN_ACKS).
`wire.protocol` collects them into the tables keyed by api key that encode and decode frames.
This package imports nothing of the modules that use it."""
