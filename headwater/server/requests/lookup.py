"""LOOKUP: which broker owns each partition of the topics a client names.

Any broker answers for every topic, from its `server.requests.partition_ownership.Ownership` (the
live brokers and each partition's owner as last seen) and the catalog (how many partitions a topic
has). An unknown topic is reported in that topic's entry (UNKNOWN_TOPIC), not as a failed request,
so one stale name does not hide the others. A partition nobody owns now (a failover under way) has
broker id "": the client asks again after a short backoff. The partition's epoch comes from the
ownership's optional `owner_epoch(topic, partition)` (the coordinator's; 0 on a single broker),
and the answer's `lease_ms` from its optional `lease_ms` (the lease etcd granted this broker), which
clients tie their check of a silent owner to (docs/CLUSTER.md, "Failover as a producer sees it").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from headwater.server.reply import Reply
from headwater.server.request_table import handles
from headwater.server.requests.partition_ownership import Ownership
from headwater.server.topics.topic import Topic
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest
from headwater.wire.limits import MAX_LOOKUP_TOPICS


class LookupHandler:
    def __init__(self, ownership: Ownership, topics: Mapping[str, Topic]) -> None:
        self._ownership = ownership
        self._topics = topics

    @handles(m.LookupRequest)  # answered only for topics with a grant (security.access)
    def lookup(self, session: object, request: m.LookupRequest) -> Reply:
        if len(request.topics) > MAX_LOOKUP_TOPICS:
            raise InvalidRequest(
                f"LOOKUP names {len(request.topics)} topics; at most {MAX_LOOKUP_TOPICS} at once"
            )
        ownership = self._ownership
        brokers = tuple(
            m.LookupBroker(b.broker_id, b.host, b.port)
            for b in sorted(ownership.brokers(), key=lambda b: b.broker_id)
        )
        # the owner's epoch as this broker last saw it (the coordinator's; 0 on a single broker)
        epoch: Callable[[str, int], int] = getattr(ownership, "owner_epoch", _no_epoch)
        answers = []
        for name in request.topics:
            topic = self._topics.get(name)
            if topic is None:
                answers.append(m.LookupTopic.unknown(name))
                continue
            partitions = []
            for index in range(topic.info.partitions):
                owner = ownership.owner(name, index)
                partitions.append(
                    m.LookupPartition(
                        index, owner.broker_id if owner is not None else "", epoch(name, index)
                    )
                )
            answers.append(m.LookupTopic(name, 0, "", tuple(partitions)))
        return m.LookupResponse(brokers, tuple(answers), getattr(ownership, "lease_ms", 0))


def _no_epoch(topic: str, partition: int) -> int:
    return 0
