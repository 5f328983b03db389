"""AlterConfigs and IncrementalAlterConfigs through stock admin clients (docs/KAFKA.md): a
topic's Headwater configs change as `headwater topic alter` changes them (seen on the native
port), AlterConfigs resets what it does not name to the server's defaults, DELETE resets one,
`cleanup.policy=compact` makes a last-value topic, and every refusal carries Kafka's precise code
(INVALID_CONFIG, POLICY_VIOLATION, UNKNOWN_TOPIC_OR_PARTITION) with nothing changed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
)
from confluent_kafka.admin import (
    ConfigEntry as CkEntry,
)
from confluent_kafka.admin import (
    ConfigResource as CkResource,
)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

import headwater
from headwater.server.config import TopicSettings
from tests.support.kafka_support import KafkaServer

INVALID_CONFIG, POLICY_VIOLATION, UNKNOWN_TOPIC = 40, 44, 3
DEFAULTS = TopicSettings()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-alter") / "data").start()
    yield server
    server.stop()
    assert "Traceback" not in server.process.log()


def _create(server: KafkaServer, topic: str, dispatch: str = "reliable", **configs: str) -> None:
    async def create() -> None:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(topic, partitions=1, dispatch=dispatch, configs=configs)

    asyncio.run(create())


def _configs(server: KafkaServer, topic: str) -> dict[str, str]:
    """The topic's configs as the native port describes them."""

    async def describe() -> dict[str, str]:
        async with await headwater.connect(server.address) as client:
            info = (await client.describe_topic(topic)).topic
            return {c.name: c.value for c in info.configs}

    return asyncio.run(describe())


def _incremental(
    server: KafkaServer, topic: str, *entries: tuple[str, str | None, AlterConfigOpType]
) -> int:
    """confluent-kafka's incremental_alter_configs on one topic: 0 or the Kafka error code."""
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    resource = CkResource(
        "topic",
        topic,
        incremental_configs=[
            CkEntry(name, value, incremental_operation=op) for name, value, op in entries
        ],
    )
    future = admin.incremental_alter_configs([resource])[resource]
    try:
        future.result(timeout=20)
    except KafkaException as exc:
        error = exc.args[0]
        assert isinstance(error, KafkaError)
        return int(error.code())
    return 0


def test_incremental_set_and_delete_change_the_topic_as_topic_alter_does(
    kafka: KafkaServer, topic_name: str
) -> None:
    _create(kafka, topic_name, **{"retention.ms": "60000"})
    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    assert _incremental(kafka, topic_name, ("segment.bytes", "2097152", SET)) == 0
    configs = _configs(kafka, topic_name)
    # the one named changed; the others kept their values
    assert (configs["segment.bytes"], configs["retention.ms"]) == ("2097152", "60000")
    assert _incremental(kafka, topic_name, ("retention.ms", None, DELETE)) == 0
    assert _configs(kafka, topic_name)["retention.ms"] == str(DEFAULTS.retention_ms)
    assert _incremental(kafka, topic_name, ("cleanup.policy", "compact", SET)) == 0
    assert _configs(kafka, topic_name)["last.value"] == "true"


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ((("no.such.config", "1", AlterConfigOpType.SET),), INVALID_CONFIG),
        ((("retention.ms", "soon", AlterConfigOpType.SET),), INVALID_CONFIG),
        ((("segment.bytes", "10", AlterConfigOpType.SET),), INVALID_CONFIG),  # under 1024
        ((("fsync", "sometimes", AlterConfigOpType.SET),), INVALID_CONFIG),
        ((("retention.ms", "1", AlterConfigOpType.APPEND),), INVALID_CONFIG),
        ((("cleanup.policy", "forever", AlterConfigOpType.SET),), INVALID_CONFIG),
        ((("partitions", "4", AlterConfigOpType.SET),), POLICY_VIOLATION),
        ((("dispatch", "reliable", AlterConfigOpType.SET),), POLICY_VIOLATION),
        # one bad config refuses the resource: the good one is not applied either
        (
            (
                ("retention.ms", "1234", AlterConfigOpType.SET),
                ("no.such.config", "1", AlterConfigOpType.SET),
            ),
            INVALID_CONFIG,
        ),
    ],
)
def test_incremental_refusals_carry_precise_codes_and_change_nothing(
    kafka: KafkaServer,
    topic_name: str,
    entries: tuple[tuple[str, str | None, AlterConfigOpType], ...],
    code: int,
) -> None:
    _create(kafka, topic_name)
    before = _configs(kafka, topic_name)
    assert _incremental(kafka, topic_name, *entries) == code
    assert _configs(kafka, topic_name) == before


def test_policy_violations_on_last_value_and_non_reliable_topics(
    kafka: KafkaServer, topic_name: str
) -> None:
    compacted, fanout = f"{topic_name}-lv", f"{topic_name}-fanout"
    _create(kafka, compacted, **{"last.value": "true"})
    _create(kafka, fanout, dispatch="non-reliable")
    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    # last-value state cannot be turned off
    assert _incremental(kafka, compacted, ("cleanup.policy", "delete", SET)) == POLICY_VIOLATION
    assert _incremental(kafka, compacted, ("cleanup.policy", None, DELETE)) == POLICY_VIOLATION
    assert _configs(kafka, compacted)["last.value"] == "true"
    # a non-reliable topic keeps nothing: no retention to set
    assert _incremental(kafka, fanout, ("retention.ms", "1000", SET)) == POLICY_VIOLATION
    assert _incremental(kafka, f"{topic_name}-none", ("retention.ms", "1", SET)) == UNKNOWN_TOPIC


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_alter_configs_sets_what_it_names_and_resets_the_rest(
    kafka: KafkaServer, topic_name: str
) -> None:
    """Kafka's AlterConfigs replaces a topic's configs: through confluent-kafka's alter_configs
    the one named is set and a setting it leaves out goes back to the server's default."""
    _create(kafka, topic_name, **{"retention.ms": "60000", "segment.bytes": "2097152"})
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    resource = CkResource("topic", topic_name, set_config={"retention.ms": "120000"})
    admin.alter_configs([resource])[resource].result(timeout=20)
    configs = _configs(kafka, topic_name)
    assert configs["retention.ms"] == "120000"
    assert configs["segment.bytes"] == str(DEFAULTS.segment_bytes)


def test_kafka_python_admin_alters_both_ways_and_validate_only_changes_nothing(
    kafka: KafkaServer, topic_name: str
) -> None:
    _create(kafka, topic_name)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    topic = ConfigResourceType.TOPIC
    try:
        checked = admin.alter_configs(
            [ConfigResource(topic, topic_name, configs={"retention.ms": "77000"})],
            validate_only=True,
            incremental=True,
        )
        assert checked == {"topic": {topic_name: "OK"}}
        assert _configs(kafka, topic_name)["retention.ms"] == str(DEFAULTS.retention_ms)
        for incremental, value in ((True, "78000"), (False, "79000")):
            done = admin.alter_configs(
                [ConfigResource(topic, topic_name, configs={"retention.ms": value})],
                incremental=incremental,
            )
            assert done == {"topic": {topic_name: "OK"}}
            assert _configs(kafka, topic_name)["retention.ms"] == value
        refused = admin.alter_configs(
            [ConfigResource(topic, topic_name, configs={"retention.ms": "-5"})],
            raise_on_unknown=False,
            incremental=False,
        )
        assert "InvalidConfigurationError" in refused["topic"][topic_name]
    finally:
        admin.close()
