from __future__ import annotations

import itertools
import os
import re
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import headwater
from headwater.testing import ServerProcess
from tests.support.s3 import CREDENTIALS, MotoS3, create_bucket, moto_s3

_names = itertools.count()

# Hypothesis's per-example deadline (200 ms) decides by the clock: on a loaded machine a correct
# example fails it. Examples are bounded by their count; a hang by pytest-timeout.
settings.register_profile("headwater", deadline=None)
settings.load_profile("headwater")

# Modules that share one expensive session fixture run on one xdist worker (`make test` runs
# `pytest -n auto --dist loadgroup`): one Spark JVM for all the Spark modules. Every other module
# is a group of its own, so its module-scoped fixtures start once.
SHARED_GROUPS = {
    "test_spark_cli": "spark",
    "test_spark_cluster": "spark",
    "test_spark_compaction": "spark",
    "test_spark_reader": "spark",
    "test_spark_stream": "spark",
    "test_spark_sink": "spark",
    "test_spark_transactions": "spark",
    "test_damaged_reads": "spark",  # its Spark source test takes the session fixture
}


# The unit tier (`make check`, `pytest -m unit`): modules that start no server, no S3, etcd or
# Spark process: the wire, the durables core, storage through its fault seam, the client session,
# CLI parsing, the layering. Everything else is the integration tier, which `make test` runs too.
UNIT_MODULES = {
    "test_checkpoint_round",
    "test_cli_parsing",
    "test_cloud_tail",
    "test_connection_core",
    "test_cursor_ranges",
    "test_cursor_sync",
    "test_cursor_write_retry",
    "test_background",
    "test_decompression",
    "test_doc_numbers",
    "test_doc_protocol",
    "test_durables_core",
    "test_fetch_partition_wake",
    "test_kafka_codec",
    "test_kafka_messages",
    "test_lastvalue_transactions",
    "test_layers",
    "test_pump_decode",
    "test_lease_off_loop",
    "test_owned_threads",
    "test_pump_wakeups",
    "test_records",
    "test_transaction_model",
    "test_request_table",
    "test_retry_policy",
    "test_session",
    "test_snapshot_layers",
    "test_soak_verdict",
    "test_wal",
    "test_wal_faults",
    "test_wire_frames",
    "test_wire_roundtrip",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        if module in UNIT_MODULES:
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(module, module)))


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the tests that only need topics of their own."""
    process = ServerProcess(tmp_path_factory.mktemp("shared-server") / "data").start()
    yield process
    if process.alive():
        process.stop()


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test's own, for restarts, kills and server-wide state."""
    process = ServerProcess(tmp_path / "data").start()
    yield process
    process.kill()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', request.node.name)[:60]}-{next(_names)}"


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[headwater.Client]:
    connection = await headwater.connect(server.address)
    yield connection
    await connection.close()


@pytest.fixture
async def topic(client: headwater.Client, topic_name: str) -> str:
    await client.create_topic(topic_name, dispatch="non-reliable")
    return topic_name


@pytest.fixture(scope="session")
def s3(monkeypatch_session: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    """One moto S3 server for every S3 test; AWS credentials point at it."""
    for name, value in CREDENTIALS.items():
        monkeypatch_session.setenv(name, value)
    yield from moto_s3()


@pytest.fixture(scope="session")
def monkeypatch_session() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture
async def bucket(s3: MotoS3, request: pytest.FixtureRequest) -> str:
    test = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:30]
    name = f"hw-{next(_names)}-{test}".strip("-")
    await create_bucket(s3, name)
    return name


@pytest.fixture(scope="session")
def spark(s3: MotoS3) -> Iterator[object]:
    """One local[2] Spark session for every Spark test. It asks for `s3` first so that the JVM, and
    the Python workers it starts, inherit the AWS variables pointing at moto."""
    from headwater.spark_compaction.session import spark_session

    # Spark gives each Python worker it starts 10 s to connect back, a constant in
    # PythonWorkerFactory that no setting changes. The worker's imports take 0.8 s of CPU; under
    # `make stress-test` (two busy processes beside the suite on 2 cores) one took longer and
    # failed a streaming query. The JVM, and every worker it forks, starts 5 nice levels ahead of
    # the busy processes; only root may do that, and elsewhere the suite runs as it always did.
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, before - 5)  # this thread: the one that forks the JVM
    except PermissionError:
        warnings.warn("not root: Spark's Python workers run at the suite's priority", stacklevel=1)
    try:
        session = spark_session(
            "local[2]",
            {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        )
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
    yield session
    session.stop()
