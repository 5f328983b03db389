"""A transaction committed while the object store is gone (issue 38's hardening).

One broker whose reliable topics upload their sealed segments to S3 (moto), with segments of
1 KiB so the transaction's records and markers seal segments as they go. The transaction writes
both partitions, moto is stopped, and the commit is sent: one broker's durability is its local
WAL (the upload catches up later), so the commit completes, or is answered an error; never a
half. After the store returns, and again after a kill -9 and a restart, a read_committed reader
gets the transaction's records from every partition or from none.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.records import BatchBuilder
from tests.support.s3 import CREDENTIALS, MotoS3, create_bucket

PARTITIONS = 2
RECORDS = 20  # each a batch of its own: several segments of 1 KiB a partition


def _config(tmp_path: Path, s3: MotoS3, bucket: str) -> Path:
    config = tmp_path / "headwater.toml"
    config.write_text(
        "[object_store]\n"
        'backend = "s3"\n'
        f'bucket = "{bucket}"\n'
        'prefix = "wal"\n'
        f'endpoint_url = "{s3.endpoint_url}"\n'
        "retry_initial_ms = 100\n"
        "retry_max_ms = 500\n"
    )
    return config


async def _committed(client: headwater.Client, partition: int) -> list[bytes]:
    values: list[bytes] = []
    offset = 0
    for _ in range(1000):
        fetched = await client.fetch("t", partition, offset)
        values += [r.value for r in fetched.records() if r.value is not None]
        if fetched.next_offset >= fetched.end_offset:
            return values
        offset = fetched.next_offset
    raise AssertionError("the partition did not end")


def _expected(partition: int) -> list[bytes]:
    return [b"in-%d-%02d-%s" % (partition, i, b"x" * 100) for i in range(RECORDS)]


async def test_a_commit_while_the_object_store_is_gone_is_whole_or_refused(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    config = _config(tmp_path, s3, bucket)
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config)), env=CREDENTIALS)
    server.start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "t", partitions=PARTITIONS, dispatch="reliable", configs={"segment.bytes": 1024}
            )
            began = await client.request(m.InitTransactionsRequest("app", 60_000))
            assert isinstance(began, m.InitProducerIdResponse)
            pid, epoch = began.producer_id, began.producer_epoch
            partitions = tuple(range(PARTITIONS))
            await client.request(m.AddPartitionsToTxnRequest("app", pid, epoch, "t", partitions))
            for partition in partitions:
                for sequence, value in enumerate(_expected(partition)):
                    builder = BatchBuilder(
                        producer_id=pid,
                        producer_epoch=epoch,
                        base_sequence=sequence,
                        transactional=True,
                    )
                    builder.append(None, value)
                    await client.request(m.ProduceRequest("t", partition, builder.build()))
            s3.stop()
            try:
                try:
                    answer: HeadwaterError | m.Response = await client.request(
                        m.EndTxnRequest("app", pid, epoch, True), timeout=60
                    )
                except HeadwaterError as exc:
                    answer = exc
                seen = [await _committed(client, p) for p in partitions]
            finally:
                s3.start()
                await create_bucket(s3, bucket)  # moto starts empty
            whole = [_expected(p) for p in partitions]
            if not isinstance(answer, HeadwaterError):
                assert seen == whole, "answered committed, and not all of it is"
            assert seen in (whole, [[]] * PARTITIONS), (answer, seen)
        server.kill()
        server.start()
        async with await headwater.connect(server.address) as client:
            for _ in range(600):  # a new instance: an undecided end is aborted first
                try:
                    await client.request(m.InitTransactionsRequest("app", 60_000))
                    break
                except HeadwaterError as exc:
                    assert exc.retriable, exc
                    await asyncio.sleep(0.1)
            after = [await _committed(client, p) for p in partitions]
        assert after in (whole, [[]] * PARTITIONS), (answer, after)
        if not isinstance(answer, HeadwaterError):
            assert after == whole
        print(f"\ncommit with the store gone: {answer!r}; whole after: {after == whole}")
    finally:
        server.kill()
