"""Producer throughput by delivery semantic, compression codec and value size.

A server in its own process; one producer (this process, uvloop) sends `--messages` records to a
fresh reliable topic (fsync `never`, so the disk is not what is measured) and the clock stops
when `flush()` returns, i.e. when every record is acknowledged (at-least-once) or written to the
socket (at-most-once). Results go to stdout as JSON and, with `--chart FILE`, as an SVG bar chart.

    python -m loadtest.producer_bench --messages 200000 --chart docs/producer-throughput.svg
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import headwater
from headwater import AtLeastOnce, AtMostOnce, Compression, ProducerConfig
from headwater.testing import ServerProcess

SEMANTICS: dict[str, dict[str, Any]] = {
    "at-most-once": {"delivery": AtMostOnce()},
    "at-least-once": {"delivery": AtLeastOnce()},
    "at-least-once idempotent": {"delivery": AtLeastOnce(), "idempotent": True},
}
CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


async def measure(address: str, semantic: str, codec: Compression, size: int, count: int) -> float:
    topic = f"producer-{time.time_ns()}"
    async with await headwater.connect(address) as client:
        await client.create_topic(topic, dispatch="reliable", configs={"fsync": "never"})
        config = ProducerConfig(compression=codec, batch_size=256 * 1024, **SEMANTICS[semantic])
        producer = client.producer(topic, config)
        # compressible but not trivial: a counter in repeated text
        values = [
            (f"{i:08d} sensor reading ok " * (size // 28 + 1))[:size].encode() for i in range(1000)
        ]
        started = time.monotonic()
        for i in range(count):
            await producer.send(values[i % 1000])
        await producer.flush()
        # at-most-once flush returns once written to the socket: stop the clock when the
        # server has stored everything, for every semantic alike (bounded wait)
        deadline = time.monotonic() + 60
        while (await client.describe_topic(topic)).next_offsets[0] < count:
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not store every message within 60 s")
            await asyncio.sleep(0.001)
        elapsed = time.monotonic() - started
        await client.delete_topic(topic)
    return count / elapsed


def svg_chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Grouped horizontal bars: one group per (size, codec), one bar per semantic."""
    colors = {
        "at-most-once": "#4c78a8",
        "at-least-once": "#f58518",
        "at-least-once idempotent": "#54a24b",
    }
    groups: dict[str, dict[str, float]] = {}
    for row in rows:
        groups.setdefault(f"{row['value_size']} B {row['codec']}", {})[row["semantic"]] = row[
            "msgs_per_s"
        ]
    peak = max(r["msgs_per_s"] for r in rows)
    bar, gap, left, width = 12, 10, 130, 520
    height = len(groups) * (3 * bar + gap) + 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 120}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">'
        "Producer throughput, msgs/s (2 cores, loopback)</text>",
    ]
    y = 30
    for label, values in groups.items():
        parts.append(f'<text x="{left - 6}" y="{y + 1.8 * bar}" text-anchor="end">{label}</text>')
        for semantic, color in colors.items():
            rate = values.get(semantic, 0.0)
            length = width * rate / peak
            parts.append(
                f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar - 2}" fill="{color}"/>'
            )
            parts.append(f'<text x="{left + length + 4:.1f}" y="{y + bar - 3}">{rate:,.0f}</text>')
            y += bar
        y += gap
    for i, (semantic, color) in enumerate(colors.items()):
        parts.append(
            f'<rect x="{left + 180 * i}" y="{y + 4}" width="10" height="10" fill="{color}"/>'
        )
        parts.append(f'<text x="{left + 180 * i + 14}" y="{y + 13}">{semantic}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200_000, help="per run, 100-byte values")
    parser.add_argument("--chart", type=Path, help="write an SVG bar chart here")
    args = parser.parse_args(argv)
    import uvloop

    rows = []
    with tempfile.TemporaryDirectory(prefix="headwater-producer-bench-") as scratch:
        server = ServerProcess(Path(scratch) / "data").start()
        try:
            for size in (100, 1024):
                count = args.messages if size == 100 else args.messages // 4
                for codec in CODECS:
                    for semantic in SEMANTICS:
                        rate = uvloop.run(measure(server.address, semantic, codec, size, count))
                        row = {
                            "value_size": size,
                            "codec": codec.name.lower(),
                            "semantic": semantic,
                            "messages": count,
                            "msgs_per_s": round(rate),
                            "mb_per_s": round(rate * size / 1e6, 1),
                        }
                        rows.append(row)
                        print(
                            f"  {size:>5} B {row['codec']:<6} {semantic:<25} {rate:>12,.0f} msg/s",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            server.stop()
    if args.chart:
        svg_chart(rows, args.chart)
    report = {
        "benchmark": "producer throughput",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "results": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
