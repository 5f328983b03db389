"""Minimal programs for the bugs tests/test_statemachine.py found on the code of issue 9.

`test_reproduction` replays each through the same machine and checks (each failed there); each
also ends with a graceful restart and a full read-back, so a fix must keep every promise.
"""

from __future__ import annotations

from tests.support.fuzzops import (
    TOPICS,
    Create,
    Delete,
    DeleteSub,
    MapSet,
    Op,
    Produce,
    Subscribe,
    Unsubscribe,
    WrongPartition,
)

Step = tuple[Op, ...] | str  # a round sent at once, or a restart ("graceful" or "kill -9")
REPRODUCTIONS: dict[str, list[Step]] = {
    # DELETE_TOPIC is never answered once a reliable subscription has delivered (unacked) records
    "delete_topic_with_unacked": [
        (Create(0, "t0", "rel", 1),),
        (Produce(0, "t0", 0, 2, None),),
        (Subscribe(1, "t0", "sh", 50),),
        (Delete(0, "t0"),),
    ],
    # the same for DELETE_SUBSCRIPTION
    "delete_subscription_with_unacked": [
        (Create(0, "t0", "rel", 1),),
        (Produce(0, "t0", 0, 2, None),),
        (Subscribe(1, "t0", "ex", 50),),
        (DeleteSub(0, "t0", "ex"),),
    ],
    # DELETE_TOPIC and SUBSCRIBE pipelined: UNKNOWN_SERVER_ERROR, "dictionary changed size"
    "delete_and_subscribe_pipelined": [
        (Create(0, "t0", "rel", 1),),
        (Subscribe(1, "t0", "ex", 50),),
        (Delete(0, "t0"), Subscribe(1, "t0", "sh", 50)),
    ],
    # DELETE_TOPIC then CREATE_TOPIC pipelined: both succeed, but the delete removes the new
    # topic's files; the graceful shutdown fails (FileNotFoundError) and the data is gone
    "delete_create_pipelined_graceful": [
        (Create(0, "t0", "rel", 1),),
        (Delete(0, "t0"), Create(0, "t0", "rel", 1)),
        (Produce(0, "t0", 0, 2, None),),
        "graceful",
    ],
    "delete_create_pipelined_kill": [
        (Create(0, "t0", "rel", 1),),
        (Delete(0, "t0"), Create(0, "t0", "rel", 1)),
        (Produce(0, "t0", 0, 2, None),),
        "kill -9",
    ],
    # the first map write builds the map partition by partition; produces to partition 0 that
    # arrive while a later partition is read from disk (cold cache: after a restart) are never
    # applied, and `map get` misses them. Timing-dependent: three topics give three chances.
    "catch_up_misses_appends": [
        tuple(Create(0, t, "rel", 3) for t in TOPICS),
        tuple(Produce(i % 3, t, 0, 3, k) for i, t in enumerate(TOPICS) for k in (1, 3)),
        tuple(Produce(i % 3, t, 0, 3, k) for i, t in enumerate(TOPICS) for k in (1, 3)),
        "kill -9",
        tuple(MapSet(0, t, (0,), False) for t in TOPICS)  # the first write builds the map
        + tuple(Produce(1 + i % 2, t, 0, 1, 2 * (i % 2)) for t in TOPICS for i in range(6)),
    ],
    # a keyed record sent to another partition than its key's is accepted on a last-value topic,
    # so two partitions hold the key at the same offset: compare-and-set cannot be sound
    "wrong_partition_on_map_topic": [
        (Create(0, "t0", "lv", 2),),
        (WrongPartition(0, "t0", 0),),
    ],
    # (the model's bug, seed 2967784746) an UNSUBSCRIBE answered OK in the same round as the
    # topic's delete: the model expected a CONSUMER_CLOSED for the consumer it had just detached
    "unsubscribe_then_delete_topic": [
        (Create(0, "t0", "nr", 3),),
        (Subscribe(0, "t0", "fo", 2),),
        (Unsubscribe(0, 0), Delete(0, "t0")),
    ],
}
