"""What the largest legal request of each type costs to decode, on the loop (issue 22).

For each request with an array, the body at its maximum count (`wire.limits`), decoded by the
server's decoder (`wire.protocol.decode_request`: the struct fast path where there is one) and,
for comparison, by the construct schema alone; and the check of a PRODUCE batch of small records
(`validate_records`), which the server runs on the loop up to `INLINE_RECORDS` records and on its
helper thread above. Each figure is the median of `--repeats` runs, in milliseconds of the
thread's CPU time (not wall time: on a shared machine, time waiting for a core is not the
request's cost).

    python -m loadtest.request_cost_bench --repeats 21
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from headwater.wire import limits
from headwater.wire import messages as m
from headwater.wire.frames import FrameDecoder
from headwater.wire.protocol import APIS, decode_request, encode_request
from headwater.wire.records import build_batch, validate_records

INLINE_RECORDS = 2048  # headwater.server.net.client_connection.INLINE_RECORDS


def requests() -> list[tuple[str, m.Request]]:
    keys = tuple(b"k%05d" % i for i in range(limits.MAX_MAP_KEYS))
    acks = tuple(m.AckEntry(0, i) for i in range(limits.MAX_ACKS_PER_REQUEST))
    configs = tuple(m.ConfigEntry(f"c{i}", "v") for i in range(limits.MAX_TOPIC_CONFIGS))
    settings = m.SubscriptionSettings(keys=keys[: limits.MAX_SUBSCRIPTION_KEYS])
    partitions = tuple(range(limits.MAX_SUBSCRIBE_PARTITIONS))
    return [
        ("ACK, 10,000 acks", m.AckRequest(1, acks)),
        ("NACK, 10,000 acks", m.NackRequest(1, acks)),
        (
            "SUBSCRIBE, 1,000 keys + 1,024 partitions",
            m.SubscribeRequest("t", "s", 0, "c", 0, 0, settings, partitions),
        ),
        ("MAP_GET, 1,000 keys", m.MapGetRequest("t", keys)),
        (
            "MAP_SET, 1,000 writes",
            m.MapSetRequest("t", tuple(m.MapWrite(k, b"v", -1) for k in keys)),
        ),
        ("CREATE_TOPIC, 32 configs", m.CreateTopicRequest("t", 1, 0, configs)),
        ("LOOKUP, 100 topics", m.LookupRequest(tuple(f"topic-{i}" for i in range(100)))),
    ]


def median_ms(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        begin = time.thread_time()  # CPU, not wall time: the machine may be shared
        run()
        times.append(time.thread_time() - begin)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    print("| request | server decoder (ms) | construct schema (ms) |")
    print("|---|---|---|")
    for name, request in requests():
        (frame,) = FrameDecoder().feed(encode_request(request, 1))
        header, body = frame.header, frame.body  # type: ignore[union-attr]
        api = APIS[header.api_key]
        fast = median_ms(lambda h=header, b=body: decode_request(h, b), args.repeats)
        schema = median_ms(lambda s=api.request, b=body: s.parse(b), max(3, args.repeats // 5))
        print(f"| {name} | {fast:.2f} | {schema:.2f} |")
    print()
    print("| PRODUCE batch of empty records | validate_records (ms) | where the server checks it |")
    print("|---|---|---|")
    for count in (INLINE_RECORDS, 100_000, 900_000):
        batch = build_batch([(None, b"", ())] * count)
        repeats = 3 if count > 10_000 else args.repeats
        took = median_ms(lambda b=batch: validate_records(b), repeats)
        where = "on the loop" if count <= INLINE_RECORDS else "helper thread"
        print(f"| {count:,} records, {len(batch):,} bytes | {took:.1f} | {where} |")
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    used = (cpu.ru_utime - cpu_before.ru_utime) + (cpu.ru_stime - cpu_before.ru_stime)
    print(f"\nCPU (user+system) of the run: {used:.1f} s")


if __name__ == "__main__":
    main()
