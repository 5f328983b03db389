"""Transactions' state damaged (in the state store, or a marker in the WAL), and a server that
starts over it (issue 38's hardening).

A server killed with a committed, an aborted and an open transaction in a partition; then
bytes of the state store's transaction keys are changed, as a flipped bit or a torn write
would: a coordinator state (`txn/<id>`) that is no JSON, a chunk of partitions whose key's
number is not one, an open transaction (`txnopen/`) and an aborted range (`txnaborted/`) whose
key or value cannot be parsed, a key that is no UTF-8. The server starts, says which key it
could not read (`transactions.state_unreadable`), and a transaction-aware reader still never
gets the aborted or the undecided records: the partition's transactions are followed again from
the WAL's recovered batches, and an open transaction whose coordinator state is unreadable is
aborted as hanging. A marker whose batch is damaged (quarantined, or cut at the log's end) leaves
its transaction open in that partition: it is ended as its id decided (a commit's again as a
commit, never aborted while its other partitions are committed). What cannot be decided (a
changed byte that still parses) is in docs/TRANSACTIONS.md, "Damaged state".
"""

from __future__ import annotations

from pathlib import Path

import headwater
from headwater.storage.state import (
    TRANSACTION,
    TRANSACTION_PARTS,
    TXN_ABORTED,
    TXN_OPEN,
    StateStore,
    key,
)
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.records import BatchBuilder
from tests.support.faults import batches, flip, partition_dir


def _batch(producer_id: int, epoch: int, value: bytes) -> bytes:
    builder = BatchBuilder(
        producer_id=producer_id, producer_epoch=epoch, base_sequence=0, transactional=True
    )
    builder.append(None, value)
    return builder.build()


async def _transaction(client: headwater.Client, name: str, value: bytes, end: bool | None) -> None:
    began = await client.request(m.InitTransactionsRequest(name, 60_000))
    assert isinstance(began, m.InitProducerIdResponse)
    pid, epoch = began.producer_id, began.producer_epoch
    await client.request(m.AddPartitionsToTxnRequest(name, pid, epoch, "t", (0,)))
    await client.request(m.ProduceRequest("t", 0, _batch(pid, epoch, value)))
    if end is not None:
        await client.request(m.EndTxnRequest(name, pid, epoch, end))


async def _committed_values(
    client: headwater.Client, topic: str = "t", partition: int = 0
) -> list[bytes]:
    values: list[bytes] = []
    offset = 0
    for _ in range(100):
        fetched = await client.fetch(topic, partition, offset)
        values += [r.value for r in fetched.records() if r.value is not None]
        if fetched.next_offset >= fetched.end_offset:
            return values
        offset = fetched.next_offset
    raise AssertionError("the partition did not end")


async def test_damaged_transaction_keys_are_told_and_nothing_aborted_is_served(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("t", dispatch="reliable", configs={"fsync": "always"})
        await _transaction(client, "a", b"committed", True)
        await _transaction(client, "b", b"aborted", False)
        await _transaction(client, "c", b"open", None)
    fresh_server.kill()
    state = StateStore(fresh_server.data_dir / "state")
    try:
        aborted = [k for k, _ in state.scan(TXN_ABORTED)]
        assert len(aborted) == 1
        state.write(
            {
                TXN_ABORTED + aborted[0]: b"\x00" * 15,  # a value of 15 bytes, not 16
                key(TXN_OPEN, "t", 0) + b"\0zz": b"\x01",  # no producer id, no offset
                TXN_OPEN + b"t\xff\0" + b"0" * 20 + b"\0" + b"7" * 20: b"\x00" * 8,
                key(TRANSACTION, "c"): b'{"v":1,"chunks":0,"id":"c","pid":2,"ep',  # torn
                key(TRANSACTION_PARTS, "c") + b"\0" + b"x" * 20: b"[]",
                TRANSACTION + b"\xfe\xff": b"{}",
            },
            sync=True,
        )
    finally:
        state.close()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        assert await _committed_values(client) == [b"committed"]
    log = fresh_server.log()
    assert "Traceback" not in log
    for damaged in ("txnaborted/t", "txnopen/t", "txn/c", "txnpart/c"):
        assert damaged in log, damaged


async def test_a_transaction_of_more_than_64_partitions_is_read_back_after_a_restart(
    fresh_server: ServerProcess,
) -> None:
    """Its partitions are stored in chunks beside its head (`txnpart/<id>\\0<n>`). The load cut
    the prefix's length off keys the scan had already taken it from, so no chunk was ever
    found: after a restart its state was unreadable, its open transaction aborted as hanging,
    and its commit refused (a decided commit would have stayed half written)."""
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("wide", partitions=100, dispatch="reliable")
        began = await client.request(m.InitTransactionsRequest("wide-app", 60_000))
        assert isinstance(began, m.InitProducerIdResponse)
        pid, epoch = began.producer_id, began.producer_epoch
        await client.request(
            m.AddPartitionsToTxnRequest("wide-app", pid, epoch, "wide", tuple(range(100)))
        )
        for partition in (0, 99):
            await client.request(m.ProduceRequest("wide", partition, _batch(pid, epoch, b"in")))
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        await client.request(m.EndTxnRequest("wide-app", pid, epoch, True))
        for partition in (0, 99):
            fetched = await client.fetch("wide", partition, 0)
            assert [r.value for r in fetched.records()] == [b"in"]
    assert "transactions.state_unreadable" not in fresh_server.log()


async def test_a_damaged_commit_marker_is_written_again_as_a_commit(tmp_path: Path) -> None:
    """A committed and an aborted transaction over two partitions; in partition 0 a byte of
    each marker is flipped (the commit's in the middle of the segment: quarantined at start;
    the abort's at its end: cut). Each transaction is open there again with no marker, and the
    start ends it as its id decided: the commit's gets a COMMIT (it was aborted as hanging, and
    partition 1 stayed committed: half), the abort's an ABORT."""
    config = tmp_path / "no-store.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config))).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("t", partitions=2, dispatch="reliable")
            for name, commit in (("c", True), ("a", False)):
                began = await client.request(m.InitTransactionsRequest(name, 60_000))
                assert isinstance(began, m.InitProducerIdResponse)
                pid, epoch = began.producer_id, began.producer_epoch
                await client.request(m.AddPartitionsToTxnRequest(name, pid, epoch, "t", (0, 1)))
                for partition in (0, 1):
                    batch = _batch(pid, epoch, name.encode())
                    await client.request(m.ProduceRequest("t", partition, batch))
                await client.request(m.EndTxnRequest(name, pid, epoch, commit))
        server.stop()
        (segment,) = sorted(partition_dir(server, "t", 0).glob("*.log"))
        found = batches(segment)
        assert [b.base_offset for b in found] == [0, 1, 2, 3]  # c, its COMMIT, a, its ABORT
        for marker in (found[1], found[3]):
            flip(segment, marker.position + marker.size - 4)  # inside the record: CRC wrong
        server.start()
        async with await headwater.connect(server.address) as client:
            assert [await _committed_values(client, "t", p) for p in (0, 1)] == [[b"c"], [b"c"]]
        log = server.log()
        assert "wal.quarantined" in log
        assert "transactions.hanging_committed" in log and "hanging_aborted" in log
    finally:
        server.kill()


async def test_an_abort_whose_marker_was_cut_stays_aborted_after_a_later_commit(
    tmp_path: Path,
) -> None:
    """The same producer aborts a transaction in partition 0, then commits one in partition 1
    only; the abort's marker, at the end of partition 0's log, is damaged and cut at start. Its
    transaction is open again there and its id's last end is a commit of the same epoch, yet
    it is aborted again: the abort's range is still in the state store."""
    config = tmp_path / "no-store.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config))).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("t", partitions=2, dispatch="reliable")
            began = await client.request(m.InitTransactionsRequest("c", 60_000))
            assert isinstance(began, m.InitProducerIdResponse)
            pid, epoch = began.producer_id, began.producer_epoch
            for partition, value, commit in ((0, b"aborted", False), (1, b"committed", True)):
                await client.request(
                    m.AddPartitionsToTxnRequest("c", pid, epoch, "t", (partition,))
                )
                builder = BatchBuilder(
                    producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True
                )
                builder.append(None, value)
                await client.request(m.ProduceRequest("t", partition, builder.build()))
                await client.request(m.EndTxnRequest("c", pid, epoch, commit))
        server.stop()
        (segment,) = sorted(partition_dir(server, "t", 0).glob("*.log"))
        found = batches(segment)
        assert [b.base_offset for b in found] == [0, 1]  # the record, its ABORT
        flip(segment, found[1].position + found[1].size - 4)
        server.start()
        async with await headwater.connect(server.address) as client:
            seen = [await _committed_values(client, "t", p) for p in (0, 1)]
        assert seen == [[], [b"committed"]]
        assert "wal.tail_cut" in server.log() and "transactions.hanging_aborted" in server.log()
    finally:
        server.kill()
