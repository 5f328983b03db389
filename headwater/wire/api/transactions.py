"""Transactions: INIT_TRANSACTIONS, ADD_PARTITIONS_TO_TXN, ADD_ACKS_TO_TXN, END_TXN, and
WRITE_TXN_MARKER and WRITE_TXN_ACKS (between the brokers of a cluster).

A transactional producer makes a handful of these per transaction (one per partition it begins
to write, one per batch of acknowledgements, one end), so construct's schemas are their only
codec. Each names the transactional id, producer id and epoch it acts for; the arrays are
bounded as their neighbours': a topic's partitions (`MAX_PARTITIONS`) and an ACK_RANGES request's
ranges (`MAX_ACK_RANGES_PER_REQUEST`).
"""

from __future__ import annotations

from typing import Final

from construct import Flag, Int16sb, Int32sb, Int64sb

from headwater.wire import messages as m
from headwater.wire.api.base import EMPTY_RESPONSE, Api, BoundedArray, String, message
from headwater.wire.api.consume import ACK_ENTRY, ACK_RANGE
from headwater.wire.limits import MAX_ACK_RANGES_PER_REQUEST, MAX_PARTITIONS


def _producer(*fields: object) -> tuple[object, ...]:
    """The fields every transaction request begins with, then `fields`."""
    return (
        "transactional_id" / String,
        "producer_id" / Int64sb,
        "producer_epoch" / Int16sb,
        *fields,
    )


APIS: Final = (
    Api(
        m.ApiKey.INIT_TRANSACTIONS,
        message(
            m.InitTransactionsRequest,
            "transactional_id" / String,
            "timeout_ms" / Int32sb,
            "producer_id" / Int64sb,
            "producer_epoch" / Int16sb,
        ),
        message(m.InitProducerIdResponse, "producer_id" / Int64sb, "producer_epoch" / Int16sb),
    ),
    Api(
        m.ApiKey.ADD_PARTITIONS_TO_TXN,
        message(
            m.AddPartitionsToTxnRequest,
            *_producer(
                "topic" / String,
                "partitions"
                / BoundedArray(MAX_PARTITIONS, "ADD_PARTITIONS_TO_TXN partitions", Int32sb),
            ),
        ),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.ADD_ACKS_TO_TXN,
        message(
            m.AddAcksToTxnRequest,
            *_producer(
                "topic" / String,
                "subscription" / String,
                "ranges"
                / BoundedArray(MAX_ACK_RANGES_PER_REQUEST, "ADD_ACKS_TO_TXN ranges", ACK_RANGE),
                "positions" / BoundedArray(MAX_PARTITIONS, "ADD_ACKS_TO_TXN positions", ACK_ENTRY),
            ),
        ),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.END_TXN,
        message(m.EndTxnRequest, *_producer("commit" / Flag)),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.WRITE_TXN_MARKER,
        message(
            m.WriteTxnMarkerRequest,
            "topic" / String,
            "partition" / Int32sb,
            "producer_id" / Int64sb,
            "producer_epoch" / Int16sb,
            "commit" / Flag,
        ),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.WRITE_TXN_ACKS,
        message(m.WriteTxnAcksRequest, *_producer("topic" / String, "partition" / Int32sb)),
        EMPTY_RESPONSE,
    ),
)
