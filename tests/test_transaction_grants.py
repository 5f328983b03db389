"""Transactional ids are a protected resource (`txn:<id>`, Kafka's TransactionalId ACL), on both
protocols, against one real server with authentication (docs/SECURITY.md, "Transactional ids").

- Stock Kafka clients over SASL PLAIN: confluent-kafka and kafka-python commit with `produce` on
  the topic and on `txn:<their prefix>*`; without the id's grant `init_transactions` fails with
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), and a principal may not fence another's id: the
  victim's transaction commits as if nothing happened. `produce:*` covers every id (the
  migration rule); a topic prefix (`produce:s*`) covers no id.
- Describe: DescribeTransactions answers 53 for an id without a grant, ListTransactions leaves
  it out, FindCoordinator for it answers 53; a `consume:txn:` grant describes without using.
- A raw Produce naming a transactional id the principal may not use: 53 for every partition.
- The native client: the same refusals as TRANSACTIONAL_ID_NOT_AUTHORIZED (50), INIT, ADD
  and END of another principal's id refused.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.client.blocking import BlockingClient
from headwater.server.kafka import codec
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.messages import groups as g
from headwater.server.kafka.messages import produce as pr
from headwater.server.kafka.messages import transactions as tx
from headwater.server.security.tokens import create
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import TransactionalIdNotAuthorized
from headwater.wire.records import BatchBuilder
from tests.support.kafka_support import RawKafka
from tests.support.txn_clients import producer

DENIED = 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@dataclass
class Secure:
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


def sasl(client: str, token: str) -> dict[str, Any]:
    if client == "confluent":
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "ignored",
            "sasl.password": token,
        }
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "ignored",
        "sasl_plain_password": token,
    }


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp("txn-grants")
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
        with BlockingClient(process.address) as client:
            assert isinstance(
                client.request(m.AuthenticateRequest("token", admin.encode())),
                m.AuthenticateResponse,
            )
            for topic in ("shop", "other"):
                client.create_topic(topic, partitions=2)
        yield Secure(process, tokens, admin, int(port_file.read_text()))
    finally:
        process.kill()


def committed(secure: Secure, topic: str, partition: int) -> list[bytes | None]:
    """What a transaction-aware reader (the admin, natively) reads of the partition."""

    async def fetch() -> list[bytes | None]:
        async with await headwater.connect(secure.process.address, token=secure.admin) as admin:
            fetched = await admin.fetch(topic, partition, 0)
            return [r.value for r in fetched.records()]

    return asyncio.run(fetch())


def _init_refused(client: str, bootstrap: str, transactional_id: str, token: str) -> str:
    """The error text of a producer whose init is refused."""
    with pytest.raises(Exception) as refused:
        producer(client, bootstrap, transactional_id, **sasl(client, token)).close()
    return str(refused.value)


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_transaction_takes_produce_on_its_id_and_another_principal_cannot_fence_it(
    secure: Secure, client: str
) -> None:
    owner = secure.token(f"shop-{client}", "produce:shop", "consume:shop", "produce:txn:shop-*")
    thief = secure.token(f"thief-{client}", "produce:shop", "consume:shop", "produce:s*")
    transactional_id = f"shop-{client}-app"
    victim = producer(client, secure.bootstrap, transactional_id, **sasl(client, owner))
    try:
        victim.begin()
        victim.send([("shop", 0, f"{client}-paid".encode())])
        victim.flush()
        text = _init_refused(client, secure.bootstrap, transactional_id, thief)
        assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in text.upper().replace(" ", "_") or (
            "TransactionalIdAuthorization" in text
        ), text
        victim.commit()  # not fenced: the thief's init never reached the coordinator
    finally:
        victim.close()
    assert f"{client}-paid".encode() in committed(secure, "shop", 0)


def test_produce_on_every_topic_covers_every_id_and_a_topic_prefix_none(secure: Secure) -> None:
    everything = secure.token("ops", "produce:*")
    txn = producer("confluent", secure.bootstrap, "any-id-at-all", **sasl("confluent", everything))
    try:
        txn.begin()
        txn.send([("other", 1, b"ops")])
        txn.commit()
    finally:
        txn.close()
    prefixed = secure.token("prefixed", "produce:a*", "produce:txn:b*")
    assert "AUTHORIZATION" in _init_refused(
        "confluent", secure.bootstrap, "any-id", prefixed
    ).upper().replace(" ", "_")


def _raw(secure: Secure, token: str) -> RawKafka:
    raw = RawKafka(secure.kafka_port)
    raw.request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN")
    raw.response()
    credentials = b"\0user\0" + token.encode()
    raw.request(36, 0, 2, struct.pack(">i", len(credentials)) + credentials)
    _, body = raw.response()
    assert struct.unpack_from(">h", body)[0] == 0
    return raw


def _call(raw: RawKafka, api: int, version: int, request: Any) -> Any:
    """One Kafka request's answer, decoded (header v2 and its tagged fields when flexible)."""
    served = SERVED[api]
    body = codec.encode(served.requests[version], request)
    flexible = served.requests[version].flexible
    header = struct.pack(">hhih", api, version, 7, 3) + b"raw" + (b"\x00" if flexible else b"")
    raw.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
    correlation, rest = raw.response()
    assert correlation == 7
    return codec.decode_body(
        codec.Reader(rest[1:] if flexible else rest), served.responses[version]
    )


def test_describe_list_and_find_coordinator_take_a_grant_on_the_id(secure: Secure) -> None:
    user = secure.token("describer", "produce:shop", "produce:txn:mine-*", "consume:txn:seen-*")
    admin_producers = [
        producer("confluent", secure.bootstrap, name, **sasl("confluent", secure.admin))
        for name in ("mine-1", "seen-1", "hidden-1")
    ]
    raw = _raw(secure, user)
    try:
        described = _call(
            raw,
            65,
            0,
            tx.DescribeTransactionsRequest(transactional_ids=["mine-1", "seen-1", "hidden-1"]),
        )
        codes = {s.transactional_id: s.error_code for s in described.transaction_states}
        assert codes == {"mine-1": 0, "seen-1": 0, "hidden-1": DENIED}
        listed = _call(
            raw,
            66,
            0,
            tx.ListTransactionsRequest(),
        )
        names = {s.transactional_id for s in listed.transaction_states}
        assert {"mine-1", "seen-1"} <= names and "hidden-1" not in names
        for key, code in (("seen-1", 0), ("hidden-1", DENIED)):
            found = _call(
                raw,
                10,
                1,
                g.FindCoordinatorRequest(key=key, key_type=1),
            )
            assert found.error_code == code, key
        # describing is not using: consume:txn:seen-* may not init seen-1
        init = _call(
            raw,
            22,
            1,
            pr.InitProducerIdRequest(transactional_id="seen-1", transaction_timeout_ms=60_000),
        )
        assert init.error_code == DENIED
        for request, api in (
            (
                tx.EndTxnRequest(
                    transactional_id="hidden-1", producer_id=1, producer_epoch=0, committed=True
                ),
                26,
            ),
            (
                tx.AddOffsetsToTxnRequest(
                    transactional_id="hidden-1", producer_id=1, producer_epoch=0, group_id="g"
                ),
                25,
            ),
        ):
            assert _call(raw, api, 1, request).error_code == DENIED
    finally:
        raw.close()
        for txn in admin_producers:
            txn.close()


def test_a_produce_naming_an_id_it_may_not_use_is_refused_for_every_partition(
    secure: Secure,
) -> None:
    user = secure.token("raw-producer", "produce:shop")
    batch = BatchBuilder(producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    batch.append(None, b"sneaky")
    raw = _raw(secure, user)
    try:
        answer = _call(
            raw,
            0,
            3,
            pr.ProduceRequest(
                transactional_id="shop-confluent-app",
                acks=-1,
                timeout_ms=5000,
                topic_data=[
                    pr.TopicProduceData(
                        name="shop",
                        partition_data=[
                            pr.PartitionProduceData(index=i, records=batch.build()) for i in (0, 1)
                        ],
                    )
                ],
            ),
        )
    finally:
        raw.close()
    codes = [p.error_code for t in answer.responses for p in t.partition_responses]
    assert codes == [DENIED, DENIED]


async def test_the_native_client_is_refused_another_principals_id(secure: Secure) -> None:
    owner = secure.token("native-owner", "produce:shop", "produce:txn:native-*")
    thief = secure.token("native-thief", "produce:shop", "consume:shop")
    async with (
        await headwater.connect(secure.process.address, token=owner) as mine,
        await headwater.connect(secure.process.address, token=thief) as theirs,
    ):
        sender = mine.producer("shop", transactional_id="native-app")
        async with sender.transaction():
            await (await sender.send(b"native", partition=0))
            with pytest.raises(TransactionalIdNotAuthorized):
                stolen = theirs.producer("shop", transactional_id="native-app")
                async with stolen.transaction():
                    await stolen.send(b"stolen", partition=0)
            # END_TXN and ADD_PARTITIONS_TO_TXN of the id refused before the coordinator
            for request in (
                m.EndTxnRequest("native-app", 1, 0, False),
                m.AddPartitionsToTxnRequest("native-app", 1, 0, "shop", (1,)),
            ):
                with pytest.raises(TransactionalIdNotAuthorized):
                    await theirs.request(request)
        await sender.close()
    async with await headwater.connect(secure.process.address, token=secure.admin) as admin:
        fetched = await admin.fetch("shop", 0, 0)
        assert b"native" in [r.value for r in fetched.records()]
