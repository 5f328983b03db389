"""PNG charts of benchmark results, for people (matplotlib, the `bench` extra; headless Agg).

- `throughput_chart`: one horizontal bar per stream/map/fan-out workload (the median run's main
  figure), with CPU seconds per million messages of the server written beside each bar.
- `latency_chart`: p50/p99/p999 by rate, one line style per percentile and one colour per workload
  family (non-reliable, reliable fsync=always, peers), log scale.
- `soak_chart`: p99 per window, where the reliable topic's p99 messages spent it (stacked by stage),
  server RSS and open fds over the soak's time (loadtest/soak.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = _pyplot()
    bars = [r for r in rows if r["kind"] != "latency" and "error" not in r]
    labels = [
        f"{r['workload']} ({r['system']})" if r["system"] != "headwater" else r["workload"]
        for r in bars
    ]
    values = [
        r.get("msgs_per_s") or r.get("ops_per_s") or r.get("deliveries_per_s") or 0 for r in bars
    ]
    colours = [
        "#4c78a8"
        if r["system"] == "headwater"
        else "#f58518"
        if "redis" in r["system"]
        else "#54a24b"
        for r in bars
    ]
    figure, axes = plt.subplots(figsize=(11, 0.34 * len(bars) + 1.6))
    positions = range(len(bars))
    axes.barh(positions, values, color=colours)
    axes.set_yticks(list(positions), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("messages (or operations, deliveries) per second, median of runs")
    axes.set_title(title, fontsize=10)
    peak = max(values or [1])
    for position, (value, row) in enumerate(zip(values, bars, strict=True)):
        cpu = row["cpu_s_per_million"].get("server")
        note = f"{value:,.0f}" + (f"  (server {cpu:.1f} CPU-s/M)" if cpu is not None else "")
        axes.text(value + peak * 0.01, position, note, va="center", fontsize=7)
    axes.set_xlim(0, peak * 1.45)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def latency_chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = _pyplot()
    families: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] == "latency" and "error" not in row:
            family = row["workload"].rsplit(" ", 1)[0]
            if row["system"] != "headwater":
                family = f"{family} ({row['system']})"
            families.setdefault(family, []).append(row)
    figure, axes = plt.subplots(figsize=(9, 5.5))
    styles = {"p50_ms": ":", "p99_ms": "-", "p999_ms": "--"}
    colours = ["#4c78a8", "#e45756", "#54a24b", "#f58518", "#b279a2", "#9d755d"]
    for index, (family, members) in enumerate(sorted(families.items())):
        members.sort(key=lambda r: r["rate"])
        rates = [r["rate"] for r in members]
        for key, style in styles.items():
            axes.plot(
                rates,
                [max(1e-3, r[key]) for r in members],
                style,
                marker="o",
                color=colours[index % len(colours)],
                label=f"{family} {key[:-3]}",
            )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("offered rate, msgs/s")
    axes.set_ylabel("end-to-end latency, ms")
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def soak_chart(
    windows: list[dict[str, Any]], resources: list[dict[str, Any]], path: Path, title: str
) -> None:
    plt = _pyplot()
    figure, (latency, spent, rss, fds) = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    for key, label in (("p99_reliable_ms", "reliable"), ("p99_non_reliable_ms", "non-reliable")):
        points = [(w["t"], w[key]) for w in windows if w.get(key) is not None]
        if points:
            latency.plot(*zip(*points, strict=True), marker=".", label=f"p99 {label}")
    latency.set_ylabel("p99 per window, ms")
    latency.set_yscale("log")
    latency.legend(fontsize=8)
    latency.set_title(title, fontsize=10)
    _stacked_stages(spent, [w for w in windows if "tail_reliable" in w], "tail_reliable")
    spent.set_ylabel("reliable p99 messages:\nms per stage")
    times = [s["t"] for s in resources]
    rss.plot(times, [s["rss_mb"] for s in resources], color="#e45756")
    rss.set_ylabel("server RSS, MB")
    rss.set_ylim(bottom=0)
    fds.plot(times, [s["fds"] for s in resources], color="#54a24b")
    fds.set_ylabel("server open fds")
    fds.set_ylim(bottom=0)
    fds.set_xlabel("seconds since start")
    for axes in (latency, spent, rss, fds):
        axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _stacked_stages(axes: Any, windows: list[dict[str, Any]], key: str) -> None:
    """One bar per window: the mean milliseconds its tail messages spent in each stage of the
    chain (loadtest/stages.py), the producer's ack stage left out (it is not on their path)."""
    names: list[str] = []
    for window in windows:
        names += [n for n in window[key] if n not in names and "answered" not in n]
    bottoms = [0.0] * len(windows)
    width = (windows[1]["t"] - windows[0]["t"]) * 0.8 if len(windows) > 1 else 1.0
    for name in names:
        heights = [w[key].get(name, 0.0) for w in windows]
        axes.bar([w["t"] for w in windows], heights, width, bottom=bottoms, label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if names:
        axes.legend(fontsize=7, ncol=3)
