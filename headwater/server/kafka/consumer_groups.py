"""The consumer groups of Kafka 4's protocol (KIP-848) this broker coordinates, in memory: each a
`durables.consumer_protocol.ConsumerGroupState` (epochs, assignment, reconciliation), driven here
with the loop's clock and swept by the Kafka listener for session and rebalance timeouts.

A group appears with its first heartbeat and is forgotten once it has no members (its committed
offsets are the subscriptions of its name: durable). A group first seen through a heartbeat with
an epoch (a member of a group whose coordinator moved, or was restarted) is rebuilt from the
members' heartbeats for three heartbeat intervals (`ConsumerGroupState.adopting_until`). The session
timeout and the heartbeat interval are the server's (`[kafka]` `consumer_session_timeout_ms` and
`consumer_heartbeat_interval_ms`, Kafka's `group.consumer.session.timeout.ms` and
`group.consumer.heartbeat.interval.ms`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import structlog

from headwater.durables.consumer_protocol import Answer, Beat, ConsumerGroupState, Refusal, Refused

log = structlog.get_logger(__name__)

MAX_GROUPS: Final = 10_000


class ConsumerGroups:
    def __init__(self, session_timeout: float, heartbeat_interval: float) -> None:
        self.session_timeout = session_timeout
        self.heartbeat_interval = heartbeat_interval
        self.groups: dict[str, ConsumerGroupState] = {}
        self._loop = asyncio.get_running_loop()

    def heartbeat(self, name: str, beat: Beat, partitions: Callable[[str], int | None]) -> Answer:
        """`Refused` for a heartbeat the group does not take."""
        now = self._loop.time()
        group = self.groups.get(name)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                raise Refused(Refusal.GROUP_FULL, f"this broker coordinates {MAX_GROUPS} groups")
            # a member with an epoch that we do not know: the group's state was elsewhere
            # (its members come back within a heartbeat or two of finding this coordinator)
            window = min(self.session_timeout, max(1.0, 3 * self.heartbeat_interval))
            adopting = now + window if beat.epoch > 0 else None
            group = ConsumerGroupState(name, self.session_timeout, adopting)
            self.groups[name] = group
        epoch = group.group_epoch
        known = beat.member_id in group.members
        try:
            answer = group.heartbeat(beat, partitions, now)
        finally:
            if not group.members:
                del self.groups[name]
        if group.group_epoch != epoch or not known:
            log.info(
                "kafka.consumer_group_changed",
                group=name,
                member=beat.member_id,
                member_epoch=answer.epoch,
                group_epoch=group.group_epoch,
                members=len(group.members),
            )
        return answer

    def sweep(self) -> None:
        """Fence the members past their session or rebalance timeout (the listener calls this)."""
        now = self._loop.time()
        for name, group in list(self.groups.items()):
            for member in group.expire(now):
                log.info(
                    "kafka.consumer_group_member_fenced",
                    group=name,
                    member=member,
                    group_epoch=group.group_epoch,
                )
            if not group.members:
                del self.groups[name]
