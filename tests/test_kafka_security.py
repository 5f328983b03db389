"""The Kafka listener on a server with authentication (docs/KAFKA.md, docs/SECURITY.md): SASL
PLAIN with a Headwater token as the password; the token's grants decide as on the native port
(TOPIC_AUTHORIZATION_FAILED without one); a wrong token is SASL_AUTHENTICATION_FAILED and the
connection closes; nothing but ApiVersions and SASL is taken before; kcat authenticates too."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import TopicAuthorizationFailedError

from headwater.client.blocking import BlockingClient
from headwater.server.security.tokens import create
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from tests.support.certs import Authority
from tests.support.kafka_support import RawKafka

SASL_AUTHENTICATION_FAILED = 58


@dataclass
class SecureKafka:
    process: ServerProcess
    tokens: Path
    admin: str
    kafka_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def token(self, principal: str, *grants: str) -> str:
        _, token = create(self.tokens, principal, grants, None, None)
        assert token is not None
        return token

    def sasl(self, token: str) -> dict[str, str]:
        return {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "ignored",
            "sasl_plain_password": token,
        }


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    root = tmp_path_factory.mktemp("kafka-secure")
    tokens = root / "tokens.json"
    _, admin = create(tokens, "admin", ("all:*",), None, None)
    assert admin is not None
    port_file = root / "kafka.port"
    process = ServerProcess(
        root / "data",
        extra_args=(
            "--auth-tokens",
            str(tokens),
            "--kafka-port",
            "0",
            "--kafka-port-file",
            str(port_file),
        ),
    ).start()
    try:
        server = SecureKafka(process, tokens, admin, int(port_file.read_text()))
        with BlockingClient(process.address) as client:
            assert isinstance(
                client.request(m.AuthenticateRequest("token", admin.encode())),
                m.AuthenticateResponse,
            )
            for topic in ("orders", "secret"):
                client.create_topic(topic, partitions=1)
        yield server
    finally:
        process.kill()


def _sasl(raw: RawKafka, token: str) -> int:
    raw.request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN")
    _, body = raw.response()
    assert struct.unpack_from(">h", body)[0] == 0
    credentials = b"\0user\0" + token.encode()
    raw.request(36, 0, 2, struct.pack(">i", len(credentials)) + credentials)
    _, body = raw.response()
    return int(struct.unpack_from(">h", body)[0])


def test_a_token_with_grants_produces_and_consumes(secure: SecureKafka) -> None:
    token = secure.token("shop", "produce:orders", "consume:orders")
    producer = KafkaProducer(acks="all", **secure.sasl(token))
    sent = producer.send("orders", b"paid", key=b"o1").get(20)
    producer.close()
    consumer = KafkaConsumer(
        "orders",
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        group_id="shop-readers",
        **secure.sasl(token),
    )
    try:
        got = [(m.offset, m.key, m.value) for m in consumer]
        consumer.commit()
    finally:
        consumer.close()
    assert (sent.offset, b"o1", b"paid") in got


def test_a_missing_grant_is_topic_authorization_failed(secure: SecureKafka) -> None:
    token = secure.token("reader", "consume:orders")
    producer = KafkaProducer(acks="all", retries=0, **secure.sasl(token))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("orders", b"x").get(20)
    finally:
        producer.close(timeout=2)
    consumer = KafkaConsumer(**secure.sasl(token))
    try:
        assert "secret" not in consumer.topics()  # Metadata shows only what it has a grant on
        assert "orders" in consumer.topics()
    finally:
        consumer.close()


def test_a_wrong_token_fails_and_closes_the_connection(secure: SecureKafka) -> None:
    raw = RawKafka(secure.kafka_port)
    try:
        assert _sasl(raw, "hw1.nosuch.secret") == SASL_AUTHENTICATION_FAILED
        assert raw.closed()
    finally:
        raw.close()
    raw = RawKafka(secure.kafka_port)
    try:
        assert _sasl(raw, secure.admin) == 0  # the right one on a new connection
        raw.request(3, 1, 3, struct.pack(">i", 0))  # Metadata of no topic
        assert raw.response()[0] == 3
    finally:
        raw.close()


def test_nothing_but_api_versions_and_sasl_before_authenticating(secure: SecureKafka) -> None:
    raw = RawKafka(secure.kafka_port)
    try:
        raw.request(18, 0, 1)  # ApiVersions: answered
        assert raw.response()[0] == 1
        raw.request(3, 1, 2, struct.pack(">i", -1))  # Metadata: the connection closes
        assert raw.closed()
    finally:
        raw.close()


def test_kcat_authenticates_with_a_token(secure: SecureKafka) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: `make install` installs Debian's kcat"
    token = secure.token("ops", "consume:*")
    done = subprocess.run(
        [
            kcat,
            "-b",
            secure.bootstrap,
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            "sasl.username=ops",
            "-X",
            f"sasl.password={token}",
            "-L",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert 'topic "orders" with 1 partitions' in done.stdout.decode()


def test_a_v0_handshake_takes_the_bare_sasl_frame(secure: SecureKafka) -> None:
    """SaslHandshake v0 (Kafka 0.10's flow): the PLAIN bytes follow as a bare size-prefixed
    frame, answered by an empty one; then requests are served."""
    raw = RawKafka(secure.kafka_port)
    try:
        raw.request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN")
        assert struct.unpack_from(">h", raw.response()[1])[0] == 0
        credentials = b"\0user\0" + secure.admin.encode()
        raw.send_raw(struct.pack(">i", len(credentials)) + credentials)
        assert raw.sock.recv(4) == struct.pack(">i", 0)
        raw.request(3, 1, 3, struct.pack(">i", 0))
        assert raw.response()[0] == 3
    finally:
        raw.close()


def test_kcat_over_tls_with_a_token(tmp_path: Path) -> None:
    """With tls_cert, the Kafka port takes TLS with the native port's certificate: kafka-python
    creates a topic, kcat produces and consumes, all over SASL_SSL."""
    ca = Authority.create(tmp_path, "ca")
    issued = ca.issue(tmp_path, "server", True)
    tokens = tmp_path / "tokens.json"
    _, token = create(tokens, "ops", ("all:*",), None, None)
    assert token is not None
    port_file = tmp_path / "kafka.port"
    process = ServerProcess(
        tmp_path / "data",
        extra_args=(
            "--auth-tokens",
            str(tokens),
            "--tls-cert",
            str(issued.cert),
            "--tls-key",
            str(issued.key),
            "--kafka-port",
            "0",
            "--kafka-port-file",
            str(port_file),
        ),
    ).start()
    try:
        bootstrap = f"127.0.0.1:{int(port_file.read_text())}"
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            security_protocol="SASL_SSL",
            ssl_cafile=str(ca.path),
            sasl_mechanism="PLAIN",
            sasl_plain_username="ops",
            sasl_plain_password=token,
        )
        try:
            admin.create_topics([NewTopic("tls-topic", 1, 1)])
        finally:
            admin.close()
        kcat = shutil.which("kcat")
        assert kcat is not None, "kcat is not installed: `make install` installs Debian's kcat"
        common = [
            kcat,
            "-b",
            bootstrap,
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            f"ssl.ca.location={ca.path}",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            "sasl.username=ops",
            "-X",
            f"sasl.password={token}",
            "-t",
            "tls-topic",
        ]
        subprocess.run([*common, "-P"], input=b"over tls\n", timeout=60, check=True)
        done = subprocess.run(
            [*common, "-C", "-e", "-q"], capture_output=True, timeout=60, check=True
        )
        assert done.stdout.decode().split("\n")[0] == "over tls"
    finally:
        process.kill()


def test_altering_configs_takes_the_admin_grant(secure: SecureKafka) -> None:
    """IncrementalAlterConfigs is the native ALTER_TOPIC_CONFIGS: a principal with produce and
    consume on the topic is refused TOPIC_AUTHORIZATION_FAILED, before a topic's existence is
    told (a topic that does not exist is refused the same); one with admin on it alters it."""

    def alter(token: str, topic: str) -> str:
        admin = KafkaAdminClient(**secure.sasl(token))
        configs = {"retention.ms": "90000"}
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)
        try:
            done = admin.alter_configs(
                [resource],
                raise_on_unknown=False,
                incremental=True,
            )
            return str(done["topic"][topic])
        finally:
            admin.close()

    user = secure.token("app", "produce:orders", "consume:orders")
    assert "TopicAuthorizationFailedError" in alter(user, "orders")
    assert "TopicAuthorizationFailedError" in alter(user, "no-such-topic")
    assert alter(secure.token("ops", "admin:orders"), "orders") == "OK"
    with BlockingClient(secure.process.address) as client:
        client.request(m.AuthenticateRequest("token", secure.admin.encode()))
        described = client.request(m.DescribeTopicRequest("orders"))
        assert isinstance(described, m.DescribeTopicResponse)
    assert ("retention.ms", "90000") in {(c.name, c.value) for c in described.topic.configs}
