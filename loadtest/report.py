"""Markdown tables of benchmark results, for docs/BENCHMARKS.md (`--format markdown`).

`matrix_markdown` gives one table for the stream/map/fan-out rows and one for the latency rows of
loadtest/bench.py; `ratios_markdown` the Headwater/peer table of loadtest/peers.py. Figures are
the median run's; "runs" lists every run's main figure, so the spread is visible.
"""

from __future__ import annotations

from typing import Any


def _cpu(row: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {value:.2f}"
        for name, value in row["cpu_s_per_million"].items()
        if value is not None
    )


def _runs(row: dict[str, Any], digits: int = 0) -> str:
    return " / ".join(f"{v:,.{digits}f}" for v in row.get("runs", []) if v is not None)


def matrix_markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | msgs/s (ops/s) | runs | lost | CPU-s per million: server, clients |",
        "|---|---|---|---|---|",
    ]
    for row in results:
        if row["kind"] == "latency":
            continue
        if "error" in row:
            lines.append(f"| {row['workload']} | failed: {row['error']} | | | |")
            continue
        figure = row.get("msgs_per_s") or row.get("ops_per_s") or row.get("deliveries_per_s") or 0
        note = ""
        if row["kind"] == "stream" and row.get("fsync", "").startswith(
            ("never", "every", "before")
        ):
            note = f" acked ({row['delivered_msgs_per_s']:,} delivered)"
        elif row["kind"] == "fanout":
            note = f" deliveries ({row['seconds_to_converge']} s to converge)"
        lost = f"{row['lost_pct']}%" if "lost_pct" in row else ""
        lines.append(
            f"| {row['workload']} | {figure:,}{note} | {_runs(row)} | {lost} | {_cpu(row)} |"
        )
    lines += [
        "",
        "| latency | p50 ms | p99 ms | p999 ms | max ms | sent at | lost | p99 runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        if row["kind"] != "latency":
            continue
        if "error" in row:
            lines.append(f"| {row['workload']} | failed: {row['error']} | | | | | | |")
            continue
        lines.append(
            f"| {row['workload']} | {row['p50_ms']} | {row['p99_ms']} | {row['p999_ms']} | "
            f"{row['max_ms']} | {row['producer_msgs_per_s']:,}/s | {row['lost_pct']}% | "
            f"{_runs(row, 1)} |"
        )
    return "\n".join(lines)


def ratios_markdown(pairs: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | peer | Headwater | peer | Headwater/peer | server CPU-s/M Headwater / peer |",
        "|---|---|---|---|---|---|",
    ]
    for pair in pairs:
        latency = pair["figure"] == "p99_ms"
        fmt = "{:,.2f} ms p99" if latency else "{:,.0f}/s"
        cpu = pair["server_cpu_s_per_million"]
        lines.append(
            f"| {pair['workload']} | {pair['peer']} | {fmt.format(pair['headwater'] or 0)} | "
            f"{fmt.format(pair['peer_value'])} | {pair['ratio']} | "
            f"{cpu['headwater']} / {cpu['peer']} |"
        )
    return "\n".join(lines)
