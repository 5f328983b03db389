"""A transaction committed while the disk is full (issue 38's hardening).

The server's whole data directory is a tmpfs of a few MiB (`small_tmpfs`, as the disk-full
tests of test_power_loss); a transaction writes both partitions of a topic, the disk is filled,
and the transaction is committed. The client is answered an error, or success only if the
commit is really whole; after space returns and a kill -9 and a restart, the transaction is
all-committed or all-aborted, never half: a read_committed reader gets its records from every
partition or from none (an undecided one is aborted by a new instance of the producer first).
The server's log is on the full disk too: a line it cannot write is dropped, and the commit is
still answered.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, RequestTimeout, StorageError
from headwater.wire.records import BatchBuilder, build_batch
from tests.support.faults import fill, small_tmpfs

PARTITIONS = 2
FILLER = b"f" * 65_536


def _batch(producer_id: int, epoch: int, value: bytes) -> bytes:
    builder = BatchBuilder(
        producer_id=producer_id, producer_epoch=epoch, base_sequence=0, transactional=True
    )
    builder.append(None, value)
    return builder.build()


async def _committed(client: headwater.Client, partition: int) -> list[bytes]:
    values: list[bytes] = []
    offset = 0
    for _ in range(10_000):
        fetched = await client.fetch("t", partition, offset)
        values += [
            r.value
            for r in fetched.records()
            if r.value is not None and not r.value.startswith(b"f")
        ]
        if fetched.next_offset >= fetched.end_offset:
            return values
        offset = fetched.next_offset
    raise AssertionError("the partition did not end")


async def test_a_commit_on_a_full_disk_is_all_or_nothing_once_space_returns(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    config = tmp_path / "server.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    with small_tmpfs(data, "48m"):
        # the server's log on the full disk too, as where it shares the data's disk
        server = ServerProcess(data / "hw", extra_args=("--config", str(config))).start()
        try:
            async with await headwater.connect(server.address) as client:
                await client.create_topic(
                    "t", partitions=PARTITIONS, dispatch="reliable", configs={"fsync": "always"}
                )
                began = await client.request(m.InitTransactionsRequest("app", 60_000))
                assert isinstance(began, m.InitProducerIdResponse)
                pid, epoch = began.producer_id, began.producer_epoch
                partitions = tuple(range(PARTITIONS))
                await client.request(
                    m.AddPartitionsToTxnRequest("app", pid, epoch, "t", partitions)
                )
                for partition in partitions:
                    batch = _batch(pid, epoch, b"in-%d" % partition)
                    await client.request(m.ProduceRequest("t", partition, batch))
                filler = await asyncio.to_thread(fill, data)
                # what the log had made room for ahead of the disk filling is used up too
                # (plain records to partition 0 until the append is refused), so the commit's
                # marker there needs space there is not
                refused = None
                for size in (65_536, 4_096, 256, 1):
                    for _ in range(10_000):
                        batch = build_batch([(None, FILLER[:size], [])])
                        try:
                            await client.request(m.ProduceRequest("t", 0, batch))
                        except HeadwaterError as exc:
                            refused = exc
                            break
                assert isinstance(refused, StorageError), refused
                try:
                    answer: HeadwaterError | m.Response = await client.request(
                        m.EndTxnRequest("app", pid, epoch, True), timeout=60
                    )
                except HeadwaterError as exc:
                    answer = exc
                # answered (a line the log could not take raised in the marker's retries, and
                # the answer was never sent)
                assert not isinstance(answer, RequestTimeout), answer
                if not isinstance(answer, HeadwaterError):  # whole, or it is a lie
                    os.unlink(filler)
                    for partition in partitions:
                        assert await _committed(client, partition) == [b"in-%d" % partition]
            if os.path.exists(filler):
                os.unlink(filler)
            server.kill()
            server.start()
            async with await headwater.connect(server.address) as client:
                # a new instance: an end still undecided is aborted first (retried while the
                # decided one is completed: CONCURRENT_TRANSACTIONS)
                for _ in range(600):
                    try:
                        await client.request(m.InitTransactionsRequest("app", 60_000))
                        break
                    except HeadwaterError as exc:
                        assert exc.retriable, exc
                        await asyncio.sleep(0.1)
                seen = [await _committed(client, p) for p in range(PARTITIONS)]
            assert seen in ([[b"in-%d" % p] for p in range(PARTITIONS)], [[]] * PARTITIONS), (
                answer,
                seen,
            )
            print(f"\ncommit on a full disk: {answer!r}; after: {seen}")
        finally:
            server.kill()
