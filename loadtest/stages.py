"""Where a latency row's milliseconds go: the server's stage trace joined to the consumer's times.

A server started with `--trace-every N` notes, for the message at every offset that is a multiple of
N, when the read completing its produce frame arrived, when it was appended and answered, and when
it was written to each consumer (server/net/stage_trace.py; GET /debug/stages returns the events
and empties the buffer, and the event loop's longest holds with the garbage collection inside
them). The latency rows' consumer notes, for the same offsets, the producer's send time (stamped
in the value), when the batch's frame was read (`MessageBatch.received_ns`) and when the
application took it. Every time is CLOCK_MONOTONIC, one clock for all processes on the machine,
so they subtract across processes.

Joined on (partition, offset), each sampled message's end-to-end time splits into the chain

    enqueue -> read -> appended -> dispatched -> received -> taken

(client and network; the server's queue and handling; until written to the consumer, which under
a reliable topic includes its pump and, under fsync `always`, the fsync; network and the client's
read loop; the client's queue until the application asked). Each stage goes into an HDR
histogram (`hdrhistogram`, microseconds), and the messages at or past the sample's p99 and p999
end-to-end are averaged stage by stage: where the tail is spent, not only how long it is. A
message whose appended time is unknown (its produce waited for a turn of the topic first) counts
its read -> dispatched time as one stage, "read->dispatched"; so does a non-reliable one, whose
topic hands it to the consumers inside the append. Beside the chain, "read->answered (ack)" is the
producer's side: from its frame's read to its acknowledgement's write.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable, Sequence
from typing import Any

from hdrh.histogram import HdrHistogram

CHAIN = ("enqueue", "read", "appended", "dispatched", "received", "taken")
ACK = "read->answered (ack)"
LOWEST_US = 1
HIGHEST_US = 600_000_000  # ten minutes: nothing a benchmark waits for is longer
DIGITS = 3

# one sampled message as the consumer saw it: partition, offset, enqueue, received and taken ns
Sample = tuple[int, int, int, int, int]


def histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)


def record_ns(into: HdrHistogram, nanoseconds: int) -> None:
    into.record_value(min(HIGHEST_US, max(LOWEST_US, nanoseconds // 1000)))


def summary(of: HdrHistogram) -> dict[str, float]:
    """p50/p99/p999/max in milliseconds, and the count."""
    if of.get_total_count() == 0:
        return {"count": 0}
    return {
        "count": of.get_total_count(),
        **{
            f"{name}_ms": round(of.get_value_at_percentile(percentile) / 1000, 3)
            for name, percentile in (("p50", 50.0), ("p99", 99.0), ("p999", 99.9))
        },
        "max_ms": round(of.get_max_value() / 1000, 3),
    }


def merged(encoded: Iterable[bytes | str]) -> HdrHistogram:
    """One histogram from several runs' `encode()`d ones."""
    total = histogram()
    for one in encoded:
        total.decode_and_add(one)
    return total


def fetch(http_address: str, every: int | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """GET /debug/stages of a server's operator port ("127.0.0.1:PORT"): what was traced since
    the last call (its buffer emptied); with `every`, tracing every N-th offset from now on (0:
    none)."""
    url = f"http://{http_address}/debug/stages" + ("" if every is None else f"?every={every}")
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        report: dict[str, Any] = json.load(answer)
    return report


def server_times(
    report: dict[str, Any], topic: str, subscription: str
) -> dict[tuple[int, int], dict[str, int]]:
    """(partition, offset) -> {stage: monotonic ns} for one topic, deliveries to one subscription
    (the first, if a batch was delivered more than once)."""
    fields = report["fields"]
    index = {name: fields.index(name) for name in fields}
    times: dict[tuple[int, int], dict[str, int]] = {}
    for event in report["events"]:
        if event[index["topic"]] != topic:
            continue
        stage = event[index["stage"]]
        if stage == "dispatched" and event[index["subscription"]] != subscription:
            continue
        key = (event[index["partition"]], event[index["offset"]])
        times.setdefault(key, {}).setdefault(stage, event[index["ns"]])
    return times


def breakdown(
    report: dict[str, Any], topic: str, subscription: str, samples: Sequence[Sample]
) -> dict[str, Any]:
    """The stage chain of every sample the server traced too: per stage p50/p99/p999, and the
    mean milliseconds per stage of the messages at or past the p99 and the p999 end-to-end;
    the report's dropped events and its five longest loop holds beside them."""
    result = joined(server_times(report, topic, subscription), samples)
    result["dropped_events"] = report.get("dropped", 0)
    result["stalls"] = report.get("stalls", [])[:5]
    return result


def joined(
    server: dict[tuple[int, int], dict[str, int]], samples: Sequence[Sample]
) -> dict[str, Any]:
    """`breakdown` from the server's times already gathered (`server_times`)."""
    chains: list[tuple[int, dict[str, int]]] = []  # (end-to-end ns, stage -> ns)
    for partition, offset, enqueue, received, taken in samples:
        seen = server.get((partition, offset))
        if seen is None or "read" not in seen or "dispatched" not in seen:
            continue
        marks = {"enqueue": enqueue, **seen, "taken": taken}
        if received:  # 0: taken as messages (`receive_batch`), whose batch's read time is gone
            marks["received"] = received
        if marks.get("appended", 0) > marks["dispatched"]:
            # a non-reliable topic hands the batch to its consumers inside the append
            del marks["appended"]
        stages: dict[str, int] = {}
        previous = "enqueue"
        for stage in CHAIN[1:]:
            if stage not in marks:
                continue
            name = f"{previous}->{stage}"
            stages[name] = marks[stage] - marks[previous]
            previous = stage
        if "answered" in seen:  # the producer's side: from its frame's read to its ack
            stages[ACK] = seen["answered"] - seen["read"]
        chains.append((taken - enqueue, stages))
    if not chains:
        return {"samples": len(samples), "joined": 0}
    per_stage: dict[str, HdrHistogram] = {}
    for _, stages in chains:
        for name, nanoseconds in stages.items():
            record_ns(per_stage.setdefault(name, histogram()), nanoseconds)
    chains.sort(key=lambda chain: chain[0])
    tails = {}
    for label, fraction in (("p99", 0.99), ("p999", 0.999)):
        tail = chains[min(len(chains) - 1, int(fraction * len(chains))) :]
        names = {name for _, stages in tail for name in stages}
        tails[label] = {
            "messages": len(tail),
            "end_to_end_ms": round(sum(e for e, _ in tail) / len(tail) / 1e6, 3),
            "stages_ms": {
                name: round(sum(s.get(name, 0) for _, s in tail) / len(tail) / 1e6, 3)
                for name in sorted(names, key=_chain_order)
            },
        }
    return {
        "samples": len(samples),
        "joined": len(chains),
        "stages": {name: summary(per_stage[name]) for name in sorted(per_stage, key=_chain_order)},
        "tail": tails,
    }


def _chain_order(name: str) -> int:
    return len(CHAIN) if name == ACK else CHAIN.index(name.split("->")[0])


def lines(result: dict[str, Any]) -> list[str]:
    """A breakdown as text lines for the benchmark's table."""
    if not result.get("joined"):
        return [f"stages: no sample joined ({result.get('samples', 0)} sampled)"]
    out = [f"stages ({result['joined']} of {result['samples']} sampled messages joined):"]
    for name, figures in result["stages"].items():
        out.append(
            f"  {name:<22} p50 {figures['p50_ms']:>8} p99 {figures['p99_ms']:>8} "
            f"p999 {figures['p999_ms']:>8} ms"
        )
    for label, tail in result["tail"].items():
        spent = ", ".join(f"{name} {ms}" for name, ms in tail["stages_ms"].items())
        out.append(
            f"  at {label} and past ({tail['messages']} messages, {tail['end_to_end_ms']} ms): "
            f"{spent}"
        )
    for stall in result.get("stalls", [])[:3]:
        out.append(
            f"  loop held {stall['held_ms']} ms (late {stall['late_ms']}, "
            f"gc {stall['gc_ms']} ms gen {stall['gc_generation']})"
        )
    return out
