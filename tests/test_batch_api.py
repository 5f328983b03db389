"""The batch APIs through a real server: `Producer.send_batch`, `Consumer.batches()` /
`next_batch()` (lazily decoded `MessageBatch`), one map request per round (`get_many`,
`set_many`), and the non-reliable produce path that checks a batch by its header and CRC only."""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from typing import Any

import crc32c
import pytest

import headwater
from headwater import AtLeastOnce, AtMostOnce, Compression, MessageBatch, RetryPolicy
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import CorruptBatch, ErrorCode, HeadwaterError, RecordTooLarge
from headwater.wire.keys import partition_for_key
from headwater.wire.records import build_batch
from tests.support.proxy import FaultyProxy
from tests.support.rawwire import RawPeer

RETRY = AtLeastOnce(RetryPolicy(max_retries=50, initial_delay=0.01, max_delay=0.05, timeout=30))


async def take(
    consumer: headwater.Consumer, count: int, timeout: float = 10.0
) -> list[MessageBatch]:
    """Batches until `count` records arrived (bounded by `timeout`)."""
    batches: list[MessageBatch] = []
    got = 0
    async with asyncio.timeout(timeout):
        while got < count:
            batch = await consumer.next_batch()
            batches.append(batch)
            got += len(batch)
    return batches


async def nothing_more(consumer: headwater.Consumer, wait: float = 0.5) -> bool:
    try:
        await consumer.next_batch(timeout=wait)
    except TimeoutError:
        return True
    return False


# send_batch, per delivery semantic


@pytest.mark.parametrize(
    "delivery, idempotent, offsets",
    [
        (AtMostOnce(), False, False),
        (AtMostOnce(wait_for_offsets=True), False, True),
        (AtLeastOnce(), False, True),
        (AtLeastOnce(), True, True),
    ],
    ids=["at-most-once", "at-most-once-offsets", "at-least-once", "idempotent"],
)
@pytest.mark.parametrize("dispatch", ["non-reliable", "reliable"])
async def test_send_batch_delivers_every_value_in_order(
    client: headwater.Client,
    topic_name: str,
    dispatch: str,
    delivery: AtMostOnce | AtLeastOnce,
    idempotent: bool,
    offsets: bool,
) -> None:
    await client.create_topic(topic_name, dispatch=dispatch)  # type: ignore[arg-type]
    consumer = await client.subscribe(topic_name, "s", prefetch=5000)
    # batch_size small enough that one call spans several produce batches
    producer = client.producer(
        topic_name, delivery=delivery, idempotent=idempotent, batch_size=4096
    )
    values = [f"v{i:05d}".encode() for i in range(3000)]
    future = await producer.send_batch(values[:1000])
    second = await producer.send_batch(values[1000:])
    sent = await future
    await second
    await producer.flush()
    assert future.done() and future.exception() is None
    assert len(sent) == len(future) == 1000
    if offsets:
        assert sent.offsets == list(range(1000))
        assert (await second).offsets == list(range(1000, 3000))
        assert sent[999].offset == 999 and sent[-1] == sent[999]
    else:
        assert sent.offsets == [None] * 1000 and sent[0].offset is None
    assert [metadata.topic for metadata in sent[:3]] == [topic_name] * 3
    batches = await take(consumer, 3000)
    received = [v for batch in batches for v in batch.values()]
    assert received == values
    assert [o for batch in batches for o in batch.offsets()] == list(range(3000))
    assert len(batches) > 1  # the call was split into several produce batches
    assert await nothing_more(consumer)


async def test_send_batch_waits_for_queue_room(client: headwater.Client, topic: str) -> None:
    """One call of 20,000 values with room for 2 queued batches of about 1 KiB: the call fills
    a batch, waits for room, fills the next, and never holds more than the bound."""
    consumer = await client.subscribe(topic, "s", prefetch=20_000)
    producer = client.producer(topic, batch_size=1024, max_queued_batches=2, linger=0.001)
    accumulator = producer._accumulator
    most = [0]
    original = accumulator.update_room

    def watch() -> None:
        most[0] = max(most[0], len(accumulator.queue) + len(accumulator.in_flight))
        original()

    accumulator.update_room = watch  # type: ignore[method-assign]
    values = [f"{i:06d}".encode() * 10 for i in range(20_000)]
    sent = await asyncio.wait_for(await producer.send_batch(values), 60)
    assert sent.offsets == list(range(20_000))
    assert 1 <= most[0] <= 2  # queued or in flight: never past max_queued_batches
    received = [v for batch in await take(consumer, 20_000, 30) for v in batch.values()]
    assert received == values


async def test_send_batch_futures_name_every_record(client: headwater.Client, topic: str) -> None:
    producer = client.producer(topic, delivery=AtMostOnce(wait_for_offsets=True), batch_size=300)
    future = await producer.send_batch([b"a" * 50] * 20)
    records = future.futures()
    assert len(records) == 20
    assert [(await record).offset for record in records] == list(range(20))


async def test_send_batch_with_keys_partitions_as_send(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, partitions=4, dispatch="reliable")
    consumer = await client.subscribe(topic_name, "s", prefetch=5000)
    keys = [f"k{i % 37}".encode() for i in range(500)]
    values = [f"v{i}".encode() for i in range(500)]
    headers = [{"n": str(i).encode()} if i % 2 else None for i in range(500)]
    sent = await (await client.producer(topic_name).send_batch(values, keys, headers))
    assert len(sent) == 500
    by_value = {}
    for batch in await take(consumer, 500):
        for message in batch:
            by_value[message.value] = message
    for i, (key, value) in enumerate(zip(keys, values, strict=True)):
        message = by_value[value]
        assert message.key == key
        assert message.partition == partition_for_key(key, 4)
        assert message.headers == ((("n", str(i).encode()),) if i % 2 else ())
    per_partition: dict[int, list[bytes]] = {}
    for value in values:  # order holds within a partition
        per_partition.setdefault(by_value[value].partition, []).append(value)
    for partition, expected in per_partition.items():
        assert sorted(expected, key=lambda v: by_value[v].offset) == expected, partition
    # the metadata answers in the order given (it was partition by partition: 27 of 30 records
    # of a 3-partition batch named another record's partition and offset)
    delivered = [(by_value[v].partition, by_value[v].offset) for v in values]
    assert [(r.partition, r.offset) for r in sent] == delivered
    assert [(r.partition, r.offset) for r in sent[100:110]] == delivered[100:110]
    assert sent.offsets == [offset for _, offset in delivered]


async def test_send_batch_futures_with_keys_answer_in_the_order_given(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, partitions=3, dispatch="reliable")
    keys = [f"key-{i}".encode() for i in range(30)]
    future = await client.producer(topic_name).send_batch([b"v"] * 30, keys)
    records = [await record for record in future.futures()]
    assert [r.partition for r in records] == [partition_for_key(k, 3) for k in keys]
    offsets: dict[int, list[int]] = {}
    for record in records:  # each partition's records got its offsets in the order given
        offsets.setdefault(record.partition, []).append(record.offset)
    assert all(o == list(range(len(o))) for o in offsets.values()), offsets


async def test_send_batch_refuses_a_record_too_large_before_queuing_any(
    client: headwater.Client, topic: str
) -> None:
    consumer = await client.subscribe(topic, "s")
    producer = client.producer(topic, max_request_size=10_000)
    with pytest.raises(RecordTooLarge):
        await producer.send_batch([b"small", b"x" * 20_000])
    with pytest.raises(ValueError, match="one entry per value"):
        await producer.send_batch([b"a", b"b"], keys=[b"k"])
    await producer.flush()
    assert await nothing_more(consumer)


async def test_send_batch_idempotent_retries_write_each_value_once(
    server: ServerProcess, client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"fsync": "never"})
    proxy = await FaultyProxy(server.port, seed=20261122).start()
    try:
        proxy.drop_requests = 0.03
        proxy.drop_responses = 0.08
        values = [f"m{i:05d}".encode() for i in range(3000)]
        async with await headwater.connect(proxy.address) as faulty:
            producer = faulty.producer(
                topic_name, delivery=RETRY, idempotent=True, batch_size=400, max_in_flight=4
            )
            futures = []
            for start in range(0, 3000, 100):
                futures.append(await producer.send_batch(values[start : start + 100], partition=0))
                await asyncio.sleep(0.002)  # let batches go out while faults happen
            await producer.flush()
            offsets = [o for future in futures for o in (await future).offsets]
        assert proxy.cuts > 5
    finally:
        await proxy.close()
    assert offsets == list(range(3000))
    consumer = await client.subscribe(topic_name, "check", start="earliest", prefetch=5000)
    received = [v for batch in await take(consumer, 3000) for v in batch.values()]
    assert received == values  # all present, in order, none twice
    assert await nothing_more(consumer)


# Lazily decoded batches


@pytest.mark.parametrize("codec", list(Compression))
async def test_lazy_batch_decodes_as_the_eager_path(
    client: headwater.Client, topic_name: str, codec: Compression
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    eager = await client.subscribe(topic_name, "eager", prefetch=1000)
    lazy = await client.subscribe(topic_name, "lazy", prefetch=1000)
    producer = client.producer(topic_name, compression=codec)
    for i in range(300):
        await producer.send(
            f"value {i}".encode() * (i % 5) if i % 7 else None,
            key=f"key {i}".encode() if i % 3 else None,
            headers={"h": f"{i}".encode(), "empty": b""} if i % 4 else None,
            partition=0,
        )
    await producer.flush()
    expected = [await eager.receive(timeout=30) for _ in range(300)]
    batches = await take(lazy, 300)
    assert all(isinstance(batch, MessageBatch) for batch in batches)
    assert sum(len(batch) for batch in batches) == 300
    fields: list[tuple[list[list[Any]], list[Any]]] = [
        ([b.offsets() for b in batches], [x.offset for x in expected]),
        ([b.timestamps() for b in batches], [x.timestamp for x in expected]),
        ([b.keys() for b in batches], [x.key for x in expected]),
        ([b.values() for b in batches], [x.value for x in expected]),
        ([b.headers() for b in batches], [x.headers for x in expected]),
    ]
    for per_batch, flat in fields:
        assert [item for part in per_batch for item in part] == flat
    messages = [message for batch in batches for message in batch]
    assert [(x.topic, x.partition, x.offset, x.key, x.value, x.headers) for x in messages] == [
        (x.topic, x.partition, x.offset, x.key, x.value, x.headers) for x in expected
    ]
    assert batches[0][0].offset == 0 and batches[0].partition == 0
    assert batches[0].delivery_count == 1 and batches[0].topic == topic_name


async def test_receive_and_next_batch_mix_in_order(client: headwater.Client, topic: str) -> None:
    consumer = await client.subscribe(topic, "s", prefetch=1000)
    producer = client.producer(topic)
    await producer.send_batch([f"{i}".encode() for i in range(10)])
    await producer.flush()
    await producer.send_batch([f"{i}".encode() for i in range(10, 20)])
    await producer.flush()
    first = await consumer.receive(timeout=30)
    rest = await consumer.next_batch(timeout=5)  # the first delivery's other 9, decoded already
    assert first.value == b"0" and rest.values() == [f"{i}".encode() for i in range(1, 10)]
    following = await consumer.next_batch(timeout=5)
    assert following.values() == [f"{i}".encode() for i in range(10, 20)]


async def test_batch_acks_are_kept(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    producer = client.producer(topic_name)
    await producer.send_batch([f"{i}".encode() for i in range(100)])
    await producer.flush()
    shared = await client.subscribe(topic_name, "shared", type="shared", start="earliest")
    for batch in await take(shared, 100):
        await batch.ack()
    await shared.close()
    exclusive = await client.subscribe(topic_name, "exclusive", start="earliest")
    for batch in await take(exclusive, 100):
        await batch.ack_cumulative()
    await exclusive.close()
    for name, kind in (("shared", "shared"), ("exclusive", "exclusive")):
        again = await client.subscribe(topic_name, name, type=kind)  # type: ignore[arg-type]
        assert await nothing_more(again), f"{name}: acknowledged messages came again"
        await again.close()


async def test_batches_iterator_ends_when_the_consumer_closes(
    client: headwater.Client, topic: str
) -> None:
    consumer = await client.subscribe(topic, "s")
    await (await client.producer(topic).send_batch([b"a", b"b"]))
    seen: list[bytes | None] = []
    async with asyncio.timeout(10):
        async for batch in consumer.batches():
            seen += batch.values()
            if len(seen) == 2:
                await consumer.close()
    assert seen == [b"a", b"b"]


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
async def test_batches_cut_to_a_small_credit_keep_every_field(
    client: headwater.Client, topic: str, codec: Compression
) -> None:
    """A 100-record batch to a consumer granting 7 at a time: the server cuts it (split_batch),
    and every record arrives whole: key, value, headers, timestamp, offset."""
    consumer = await client.subscribe(topic, "small", prefetch=7)
    producer = client.producer(topic, compression=codec)
    values = [f"value {i}".encode() for i in range(100)]
    keys = [f"key {i}".encode() if i % 2 else None for i in range(100)]
    headers = [{"i": str(i).encode()} if i % 3 else None for i in range(100)]
    sent = await (await producer.send_batch(values, keys, headers, partition=0))
    received: list[headwater.Message] = []
    async with asyncio.timeout(10):
        while len(received) < 100:
            received.append(await consumer.receive())
    assert [x.value for x in received] == values
    assert [x.key for x in received] == keys
    assert [x.headers for x in received] == [
        (("i", str(i).encode()),) if i % 3 else () for i in range(100)
    ]
    assert [x.offset for x in received] == list(range(100))
    assert [x.timestamp for x in received] == [metadata.timestamp for metadata in sent]


# One map request per round


async def test_map_round_in_one_request(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
    table = client.map(topic_name)
    keys = [f"key{i}" for i in range(50)]
    revisions = await table.set_many({k: f"value {k}".encode() for k in keys})
    assert revisions == list(range(50))
    entries = await table.get_many([*keys, "absent"])
    assert [e.value if e else None for e in entries] == [
        *(f"value {k}".encode() for k in keys),
        None,
    ]
    assert [e.revision for e in entries if e] == revisions
    second = await table.set_many({k: b"again" for k in keys})
    assert sorted(second) == list(range(50, 100))  # every write its own revision
    assert {e.value for e in await table.get_many(keys) if e} == {b"again"}


# The non-reliable fast path still refuses corrupt batches


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def _corrupt(kind: str) -> bytes:
    batch = bytearray(build_batch([(None, b"hello", []), (None, b"world", [])]))
    if kind == "bad crc":
        batch[-1] ^= 0x01
    elif kind == "wrong magic":
        batch[16] = 1
    elif kind == "truncated":
        batch = batch[:-3]
    elif kind == "short":
        batch = batch[:40]
    elif kind == "count":
        struct.pack_into(">i", batch, 57, 3)  # header says 3 records, last delta 1
        return _recrc(batch)
    return bytes(batch)


@pytest.mark.parametrize("kind", ["bad crc", "wrong magic", "truncated", "short", "count"])
@pytest.mark.parametrize("dispatch", ["non-reliable", "reliable"])
async def test_corrupt_batches_are_refused_on_both_paths(
    server: ServerProcess, client: headwater.Client, topic_name: str, dispatch: str, kind: str
) -> None:
    await client.create_topic(topic_name, dispatch=dispatch)  # type: ignore[arg-type]
    consumer = await client.subscribe(topic_name, "watch")
    peer = await RawPeer.open(server.address)
    try:
        error = await peer.call(m.ProduceRequest(topic_name, 0, _corrupt(kind)))
        assert isinstance(error, CorruptBatch), error
        assert error.code == ErrorCode.CORRUPT_BATCH
        good = build_batch([(None, b"good", [])])
        assert await peer.call(m.ProduceRequest(topic_name, 0, good)) == m.ProduceResponse(0, 0)
    finally:
        await peer.close()
    batch = await consumer.next_batch(timeout=5)
    assert batch.values() == [b"good"] and batch.offsets() == [0]


async def test_undecodable_records_refused_on_reliable_end_only_their_consumers(
    server: ServerProcess, client: headwater.Client, topic_name: str
) -> None:
    """Records that pass the CRC but do not decode: a reliable topic refuses them (it would
    store them); a non-reliable one passes them on unread, and a consumer that gets them ends
    with CORRUPT_BATCH when it reaches them, after what came before."""
    garbage = bytearray(build_batch([(None, b"x" * 10, [])]))
    garbage[61:] = b"\xff" * (len(garbage) - 61)
    undecodable = _recrc(garbage)
    await client.create_topic(f"{topic_name}-r", dispatch="reliable")
    await client.create_topic(topic_name, dispatch="non-reliable")
    consumer = await client.subscribe(topic_name, "watch")
    lazy = await client.subscribe(topic_name, "lazy")
    peer = await RawPeer.open(server.address)
    try:
        refused = await peer.call(m.ProduceRequest(f"{topic_name}-r", 0, undecodable))
        assert isinstance(refused, CorruptBatch) and "decode" in refused.message
        good = build_batch([(None, b"before", [])])
        after = build_batch([(None, b"after", [])])
        assert await peer.call(m.ProduceRequest(topic_name, 0, good)) == m.ProduceResponse(0, 0)
        assert await peer.call(m.ProduceRequest(topic_name, 0, undecodable)) == (
            m.ProduceResponse(0, 1)
        )
        assert await peer.call(m.ProduceRequest(topic_name, 0, after)) == m.ProduceResponse(0, 2)
    finally:
        await peer.close()
    assert (await consumer.receive(timeout=30)).value == b"before"
    with pytest.raises(CorruptBatch):
        await consumer.receive(timeout=30)
    with pytest.raises(CorruptBatch):  # ended: it says so again, never hangs
        await consumer.receive(timeout=30)
    # Lazily: the batch is handed out, its first access raises and ends the consumer.
    assert (await lazy.next_batch(timeout=5)).values() == [b"before"]
    bad = await lazy.next_batch(timeout=5)
    assert len(bad) == 1
    with pytest.raises(CorruptBatch):
        bad.values()
    with pytest.raises(CorruptBatch):  # what came after it is not handed out
        await lazy.next_batch(timeout=5)


# Offsets under concurrent producers


@pytest.mark.parametrize("dispatch", ["non-reliable", "reliable"])
async def test_offsets_are_never_given_twice_under_concurrent_producers(
    server: ServerProcess, topic_name: str, dispatch: str
) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, dispatch=dispatch)  # type: ignore[arg-type]
        consumer = await admin.subscribe(topic_name, "s", prefetch=20_000)

        async def produce(client: headwater.Client, name: str) -> list[int | None]:
            producer = client.producer(
                topic_name, delivery=AtMostOnce(wait_for_offsets=True), batch_size=2048
            )
            offsets: list[int | None] = []
            for round_ in range(10):
                if round_ % 2:
                    futures = [
                        await producer.send(f"{name}-{round_}-{i}".encode()) for i in range(50)
                    ]
                    offsets += [(await f).offset for f in futures]
                else:
                    values = [f"{name}-{round_}-{i}".encode() for i in range(200)]
                    offsets += (await (await producer.send_batch(values))).offsets
            await producer.flush()
            return offsets

        clients = [await headwater.connect(server.address) for _ in range(6)]
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(produce(c, f"p{n}") for n, c in enumerate(clients))), 60
            )
        finally:
            for c in clients:
                await c.close()
        given = [o for offsets in results for o in offsets]
        total = 6 * (5 * 200 + 5 * 50)
        assert len(given) == total
        assert sorted(o for o in given if o is not None) == list(range(total))
        received = [o for batch in await take(consumer, total, 30) for o in batch.offsets()]
        assert Counter(received) == Counter(range(total))


async def test_send_batch_on_a_closed_producer_fails(client: headwater.Client, topic: str) -> None:
    producer = client.producer(topic)
    await producer.close()
    with pytest.raises(HeadwaterError):
        await producer.send_batch([b"x"])


def test_encoded_map_get_answer_is_the_same_bytes_as_the_entries() -> None:
    """The server's hot path (`encode_map_entries`) and the `MapEntry` encoder agree."""
    from headwater.wire.api.maps import encode_map_entries, encode_map_get_response
    from headwater.wire.frames import Frame, FrameDecoder
    from headwater.wire.protocol import decode_response

    found = [(b"a", (0, 5, 1700000000000, b"value")), (b"missing", None), (b"e", (2, 9, 1, b""))]
    entries = (
        m.MapEntry(b"a", True, 5, 0, 1700000000000, b"value"),
        m.MapEntry(b"missing", False, -1, -1, -1, None),
        m.MapEntry(b"e", True, 9, 2, 1, b""),
    )
    fast = encode_map_get_response(7, encode_map_entries(found))
    assert fast == encode_map_get_response(7, m.MapGetResponse(entries))
    (frame,) = FrameDecoder().feed(fast)
    assert isinstance(frame, Frame)
    assert decode_response(frame.header, frame.body) == m.MapGetResponse(entries)
