"""The `headwater` sink: `df.write` with tasks that fail once each (retried by Spark) writes every
row exactly once (and, as the control, with `commit=task` the same failures duplicate rows); a
streaming query in map mode leaves the last value per key; rows naming partitions, keys, headers
and null values land as given; bad options and columns fail on the driver with a clear error."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import headwater
from headwater import Tls
from headwater.spark_compaction.schema import HEADERS_TYPE
from headwater.spark_compaction.sink import (
    SinkSettings,
    Staged,
    check_schema,
    commit_staged,
    stage_task,
    write_task,
)
from headwater.spark_compaction.stream import Settings, read_range
from headwater.testing import ServerProcess
from headwater.wire.errors import (
    AuthenticationRequired,
    ConnectionClosed,
    InvalidRequest,
    NotAuthorized,
)
from tests.support.certs import Authority
from tests.support.secure import secure_server
from tests.support.sink_job import value

ROOT = Path(__file__).resolve().parent.parent


def created(address: str, topic: str, partitions: int, **options: Any) -> None:
    async def create() -> None:
        async with await headwater.connect(address) as client:
            await client.create_topic(topic, partitions=partitions, dispatch="reliable", **options)

    asyncio.run(create())


def topic_rows(address: str, topic: str) -> list[dict[str, Any]]:
    """Every record of `topic`, read back with FETCH (the streaming source's reader)."""

    async def ends() -> list[int]:
        async with await headwater.connect(address) as client:
            return list((await client.describe_topic(topic)).next_offsets)

    settings = Settings({"server": address, "topic": topic})
    rows: list[dict[str, Any]] = []
    for partition, end in enumerate(asyncio.run(ends())):
        for batch in read_range(settings, partition, 0, end):
            rows.extend(batch.to_pylist())
    return rows


@pytest.mark.timeout(900)  # a driver JVM of its own, two writes with four retried tasks each
def test_tasks_retried_after_a_failing_udf_write_every_row_exactly_once(
    server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    spooled, direct, rows = f"{topic_name}-driver", f"{topic_name}-task", 6000
    for topic in (spooled, direct):
        created(server.address, topic, 3)
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.sink_job",
            server.address,
            str(tmp_path / "marks"),
            str(rows),
            f"{direct}=task",
            f"{spooled}=driver",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=840,
    )
    assert job.returncode == 0, job.stderr.decode()[-3000:]
    for topic in (spooled, direct):  # every task failed once, and was retried
        assert sorted(p.name for p in (tmp_path / "marks" / topic).iterdir()) == list("0123")
    expected = {(f"k{i}".encode(), value(i)) for i in range(rows)}

    written = Counter((r["key"], r["value"]) for r in topic_rows(server.address, spooled))
    assert set(written) == expected
    assert max(written.values()) == 1, "a retried task wrote rows twice"

    # the control: tasks that produce themselves had produced rows before they failed
    control = Counter((r["key"], r["value"]) for r in topic_rows(server.address, direct))
    assert set(control) == expected
    assert sum(control.values()) > rows, "the failures came before any row reached the sink"


def test_a_streaming_query_in_map_mode_leaves_the_last_value_per_key(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    source, target = f"{topic_name}-in", f"{topic_name}-map"
    created(server.address, source, 3)
    created(server.address, target, 2)
    keys = [f"key-{k}".encode() for k in range(20)]
    last: dict[bytes, bytes | None] = {}

    async def produce() -> None:
        async with (
            await headwater.connect(server.address) as client,
            client.producer(source) as producer,
        ):
            for round_ in range(15):
                for k, key in enumerate(keys):
                    # keys 0-4 end deleted (a null value last), 5-9 deleted then set again
                    gone = (k < 5 and round_ == 14) or (5 <= k < 10 and round_ == 12)
                    value = None if gone else f"{key.decode()}@{round_}".encode()
                    await producer.send(value, key=key)
                    last[key] = value

    asyncio.run(produce())
    stream = (
        spark.readStream.format("headwater")
        .option("server", server.address)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "60")  # 300 records: five micro-batches
        .load()
        .select("key", "value")
    )
    query = (
        stream.writeStream.format("headwater")
        .option("server", server.address)
        .option("topic", target)
        .option("mode", "map")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None
    assert len(list((tmp_path / "checkpoint" / "commits").iterdir())) >= 5

    async def state() -> dict[bytes, bytes | None]:
        async with await headwater.connect(server.address) as client:
            found = await client.map(target).get_many(keys)
            return {key: None if v is None else v.value for key, v in zip(keys, found, strict=True)}

    assert asyncio.run(state()) == last
    assert sum(v is None for v in last.values()) == 5


def test_a_streaming_query_appends_each_micro_batch_through_the_driver(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    """writeStream in the default mode (commit=driver): every record of the source once, with its
    key and headers, and each micro-batch's staging directory gone once it committed."""
    source, target, staging = f"{topic_name}-in", f"{topic_name}-out", tmp_path / "staging"
    created(server.address, source, 3)
    created(server.address, target, 3)
    staging.mkdir()

    async def produce() -> None:
        async with (
            await headwater.connect(server.address) as client,
            client.producer(source) as producer,
        ):
            for i in range(200):
                await producer.send(f"v{i}".encode(), key=f"k{i}".encode(), headers={"i": b"x"})

    asyncio.run(produce())
    query = (
        spark.readStream.format("headwater")
        .option("server", server.address)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "50")
        .load()
        .select("key", "value", "headers")
        .writeStream.format("headwater")
        .option("server", server.address)
        .option("topic", target)
        .option("stagingDir", str(staging))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None
    assert len(list((tmp_path / "checkpoint" / "commits").iterdir())) >= 4
    written = Counter(
        (r["key"], r["value"], str(r["headers"])) for r in topic_rows(server.address, target)
    )
    header = str([{"key": "i", "value": b"x"}])
    assert written == Counter((f"k{i}".encode(), f"v{i}".encode(), header) for i in range(200))
    assert list(staging.iterdir()) == []  # each micro-batch's files removed once committed


def test_rows_land_with_their_partition_key_headers_and_null_values(
    server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    """A task's write, both ways, run here as Spark's workers run it (no Spark needed)."""
    created(server.address, topic_name, 3)
    headers = [[{"key": "h", "value": b"1"}], None, [], None]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([b"a", None, b"c", b"d"], pa.binary()),
            pa.array(["k1", "k2", None, "k4"], pa.string()),
            pa.array(headers, HEADERS_TYPE),
            pa.array([2, 0, None, 1], pa.int32()),
        ],
        names=["value", "key", "headers", "partition"],
    )
    settings = SinkSettings({"server": server.address, "topic": topic_name})
    assert write_task(settings, iter([batch])).rows == 4  # commit=task: the task produces
    staged = stage_task(str(tmp_path), iter([batch]))  # commit=driver: staged, then committed
    assert staged.rows == 4
    assert len(topic_rows(server.address, topic_name)) == 4  # nothing produced by staging
    assert commit_staged(settings, [staged, None, stage_task(str(tmp_path), iter([]))]) == 4
    found = Counter(
        (r["value"], r["partition"], r["key"], str(r["headers"]))
        for r in topic_rows(server.address, topic_name)
    )
    header = str([{"key": "h", "value": b"1"}])
    assert found[(b"a", 2, b"k1", header)] == 2
    assert found[(None, 0, b"k2", "[]")] == 2  # a tombstone, on the partition it named
    assert found[(b"d", 1, b"k4", "[]")] == 2
    keyless = [f for f in found.elements() if f[0] == b"c"]  # no partition named: in turn
    assert [(k, h) for _, _, k, h in keyless] == [(None, "[]")] * 2
    assert write_task(settings, iter([])).rows == 0  # an empty task produces nothing
    # map mode: a row without a key is refused, before anything of the task's batch is written
    keyless = pa.RecordBatch.from_arrays(
        [pa.array([b"k", None], pa.binary()), pa.array([b"v", b"w"], pa.binary())],
        names=["key", "value"],
    )
    mapping = SinkSettings({"server": server.address, "topic": topic_name, "mode": "map"})
    with pytest.raises(InvalidRequest, match="every row needs a key"):
        write_task(mapping, iter([keyless]))
    # a file staged where the driver cannot see it (an executor's own disk on a cluster)
    with pytest.raises(InvalidRequest, match="stagingDir must be a directory the executors"):
        commit_staged(settings, [Staged(str(tmp_path / "elsewhere.arrow"), 4)])


def test_bad_options_and_columns_fail_on_the_driver(spark: Any, server: ServerProcess) -> None:
    options = {"server": server.address, "topic": "t"}
    for given, says in [
        ({"server": server.address}, "the headwater sink needs the option 'topic'"),
        ({**options, "mode": "upsert"}, "mode must be append or map, not 'upsert'"),
        ({**options, "compression": "brotli"}, "compression must be one of"),
        ({**options, "commit": "yes"}, "commit must be driver or task"),
        ({**options, "stagingDir": "/nonexistent"}, "is not a directory"),
        ({**options, "deliveryTimeoutMs": "soon"}, "deliveryTimeoutMs must be an integer"),
    ]:
        with pytest.raises(InvalidRequest, match=says):
            SinkSettings(given)
    binary, text = BinaryType(), StringType()
    for fields, mode, says in [
        ([("value", binary), ("topic", text)], "append", "not topic"),
        ([("key", binary)], "append", "needs a value column"),
        ([("value", LongType())], "append", "column value must be binary or string"),
        ([("value", binary), ("partition", LongType())], "append", "partition must be int"),
        ([("value", binary), ("headers", ArrayType(text))], "append", "column headers must be"),
        ([("value", binary)], "map", "mode map needs a key column"),
        ([("key", text), ("value", binary), ("partition", IntegerType())], "map", "no headers"),
    ]:
        schema = StructType([StructField(name, kind) for name, kind in fields])
        with pytest.raises(InvalidRequest, match=says):
            check_schema(schema, mode)

    # through Spark: the write fails before any task runs, with the sink's message
    frame = spark.range(3).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="the headwater sink needs the option 'topic'"):
        frame.write.format("headwater").mode("append").option("server", server.address).save()
    with pytest.raises(Exception, match="a topic cannot be overwritten"):
        frame.write.format("headwater").mode("overwrite").options(**options).save()


def test_the_token_option_authenticates_the_sink(tmp_path: Path) -> None:
    """On a server with tokens: a token granting produce (and consume) writes through both commit
    paths; one granting only consume is refused, and nothing is written."""
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"], pa.binary())], names=["value"])
    with secure_server(tmp_path) as secure:

        async def create() -> None:
            async with await headwater.connect(secure.address, token=secure.admin) as client:
                await client.create_topic("orders", partitions=2, dispatch="reliable")

        asyncio.run(create())
        options = {"server": secure.address, "topic": "orders"}
        # produce, and consume for DESCRIBE_TOPIC: an idempotent (or keyed) producer learns the
        # partition count there
        token = secure.token("writer", "produce:orders", "consume:orders")
        writer = SinkSettings({**options, "token": token})
        assert write_task(writer, iter([batch])).rows == 2
        staged = stage_task(str(tmp_path / "staging"), iter([batch]))
        assert commit_staged(writer, [staged]) == 2
        reader = SinkSettings({**options, "token": secure.token("reader", "consume:orders")})
        with pytest.raises(NotAuthorized):
            write_task(reader, iter([batch]))
        with pytest.raises(AuthenticationRequired):
            write_task(SinkSettings(options), iter([batch]))

        async def count() -> int:
            async with await headwater.connect(secure.address, token=secure.admin) as client:
                return sum((await client.describe_topic("orders")).next_offsets)

        assert asyncio.run(count()) == 4


def test_the_tls_options_connect_the_sink_over_tls(tmp_path: Path) -> None:
    """`tls=true` with `tls.ca`: the sink writes over TLS, verifying the server by that CA; the
    same write without `tls` never reaches the server."""
    folder = tmp_path / "pki"
    folder.mkdir()
    ca = Authority.create(folder, "ca")
    issued = ca.issue(folder, "server", True)
    args = ("--tls-cert", str(issued.cert), "--tls-key", str(issued.key))
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"], pa.binary())], names=["value"])
    with secure_server(tmp_path, *args) as secure:
        options = {"server": secure.address, "topic": "orders", "token": secure.admin}
        tls = {**options, "tls": "true", "tls.ca": str(ca.path)}

        async def create() -> None:
            async with await headwater.connect(
                secure.address, token=secure.admin, tls=Tls(ca=ca.path)
            ) as client:
                await client.create_topic("orders", partitions=2, dispatch="reliable")

        asyncio.run(create())
        assert write_task(SinkSettings(tls), iter([batch])).rows == 2
        mapped = write_task(SinkSettings({**tls, "mode": "map"}), iter([_keyed(b"k", b"v")]))
        assert mapped.rows == 1
        with pytest.raises(ConnectionClosed):
            write_task(SinkSettings(options), iter([batch]))


def _keyed(key: bytes, value: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([key], pa.binary()), pa.array([value], pa.binary())], names=["key", "value"]
    )
