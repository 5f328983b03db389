"""An Exclusive subscription's holder, claimed in a real etcd by coordinators
(`server.cluster.exclusive_claims`): racing claims for two holders give one CONSUMER_BUSY, the same
holder may claim through several brokers, the last release frees the subscription, and a broker
that is gone (its registration revoked, or replaced by a new one under the same id) counts for
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from headwater.server.cluster import Coordinator
from headwater.wire.errors import ConsumerBusy
from tests.support.etcd_support import EtcdServer, etcd_server, make

TOPIC, NAME = "orders", "solo"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    yield from etcd_server(tmp_path / "etcd")


@pytest.fixture
async def pair(etcd: EtcdServer) -> AsyncIterator[list[Coordinator]]:
    coordinators = [make(etcd, broker)[0] for broker in ("b1", "b2")]
    for coordinator in coordinators:
        await coordinator.start()
    yield coordinators
    for coordinator in coordinators:
        await coordinator.stop(graceful=False)


async def test_racing_claims_for_two_holders_give_one_busy(pair: list[Coordinator]) -> None:
    for round_ in range(10):
        name = f"{NAME}-{round_}"
        results = await asyncio.gather(
            pair[0].claim(TOPIC, name, "A"), pair[1].claim(TOPIC, name, "B"), return_exceptions=True
        )
        busy = [r for r in results if isinstance(r, ConsumerBusy)]
        assert len(busy) == 1 and results.count(None) == 1, results
        assert "held by consumer" in busy[0].message


async def test_one_holder_through_two_brokers_until_its_last_release(
    pair: list[Coordinator],
) -> None:
    first, second = pair
    await first.claim(TOPIC, NAME, "A")
    await second.claim(TOPIC, NAME, "A")  # another leg of the same consumer
    await first.claim(TOPIC, NAME, "A")  # again: nothing changes
    with pytest.raises(ConsumerBusy):
        await first.claim(TOPIC, NAME, "B")
    await first.release(TOPIC, NAME, "A")
    with pytest.raises(ConsumerBusy):  # still held through the second broker
        await first.claim(TOPIC, NAME, "B")
    await second.release(TOPIC, NAME, "B")  # not the holder: nothing happens
    with pytest.raises(ConsumerBusy):
        await second.claim(TOPIC, NAME, "B")
    await second.release(TOPIC, NAME, "A")
    await first.claim(TOPIC, NAME, "B")  # free: the key went with the last release


async def test_a_gone_broker_holds_nothing(etcd: EtcdServer, pair: list[Coordinator]) -> None:
    first, second = pair
    await first.claim(TOPIC, NAME, "A")
    await first.claim(TOPIC, f"{NAME}-2", "A")
    with pytest.raises(ConsumerBusy):
        await second.claim(TOPIC, NAME, "B")
    await first.stop(graceful=True)  # its lease revoked: its registration (and legs) gone
    await second.claim(TOPIC, NAME, "B")
    # the same id back, registered anew: the entry it had for A is not a live one
    again = make(etcd, "b1")[0]
    await again.start()
    try:
        await second.claim(TOPIC, f"{NAME}-2", "B")
        with pytest.raises(ConsumerBusy):
            await again.claim(TOPIC, f"{NAME}-2", "A")
    finally:
        await again.stop(graceful=False)
