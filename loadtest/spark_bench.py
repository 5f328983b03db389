"""Issue 40's Spark figures, all from one run: compaction against a one-process FETCH + dict fold,
and the streaming source against a FETCH loop.

A server of its own (a temporary data directory, the local object store under it) holds one
reliable topic of 2 partitions: N keyed records, 100-byte values over K keys (each key in one
partition; 1% tombstones), produced first (not timed); a graceful stop uploads its segments and it
starts again on the same data. Then `--rounds` rounds, each running, one after the other (so a
load on the machine that comes and goes weighs on both sides of each ratio alike):

- `fold`: a new Python process FETCHes both partitions from offset 0 to the end, decodes every
  record and folds it into a dict (last offset wins, a tombstone deletes): wall, and its CPU-s.
- `compact`: `headwater compact --data-dir <a fresh copy of the store> --master local[2]` as a new
  process, exactly as an operator runs it (cold: the JVM, the Spark session, the job): wall, and the
  CPU-s of every process it started, the JVM and PySpark's Python workers included (this process
  is their subreaper, so each one's CPU time reaches it when it is reaped), split by kind from
  /proc, with the run's own phases (`spark_start` is the session's start).
- `spark start-up`: a process that starts the session `compact` starts (`compaction=True`) and
  stops it at once: Spark's start-up alone, wall and CPU-s, so `compact` minus it is the job's
  own cost.
- `fetch loop`: `Client.fetch` in a loop over both partitions in one process, records decoded
  (what one streaming task does, without Spark): records/s.
- `compact, warm session`: the same job (`spark_compaction.job.run`) in the session the source
  uses, already started and warmed up (as `compact --every` runs after its first run): wall, and
  the CPU-s of this process's tree (that session's JVM and Python workers), less the server's.
- `source`: `spark.readStream.format("headwater")`, AvailableNow into the `noop` sink, on local[2]
  in a session started once with a small query first (not timed): records/s from the query's
  start to its end, planning included; the micro-batch's own records/s (Spark's
  `processedRowsPerSecond`: what a running query reads, past its start); and the same query
  over a 1,000-record topic, its time being the fixed cost of a query, with the records/s past
  it.

CPU-s of a row that starts processes: the larger of the rusage of every process it started
(reaped by a subreaper) and the sum of each process's own CPU sampled from /proc every 0.2 s:
rusage misses PySpark's forked Python workers (the daemon ignores SIGCHLD, so the kernel reaps
them and drops their CPU time), the sample each process's last 0.2 s.

The report ends with each verdict figure's median over the rounds beside its value in each round
(`medians`): one round moved by a passing load does not make the verdict. `compact`'s
`cpu_python_workers` is its PySpark daemon's and forked workers' share.

    python -m loadtest.spark_bench --records 1000000 --keys 50000 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

PARTITIONS = 2
VALUE_SIZE = 100
CHUNK = 500


async def produce(address: str, topic: str, records: int, keys: int) -> None:
    import headwater

    chance = random.Random(40)
    async with await headwater.connect(address) as client:
        await client.create_topic(
            topic, partitions=PARTITIONS, dispatch="reliable", configs={"fsync": "never"}
        )
        producer = client.producer(topic)
        for start in range(0, records, CHUNK):
            partition = start // CHUNK % PARTITIONS  # each key in one partition, as by hash
            share = keys // PARTITIONS
            names = [
                b"key-%08d" % (chance.randrange(share) * PARTITIONS + partition)
                for _ in range(CHUNK)
            ]
            values = [
                None if chance.random() < 0.01 else (b"%d-" % (start + i)).ljust(VALUE_SIZE, b"x")
                for i in range(CHUNK)
            ]
            await producer.send_batch(values, keys=names, partition=partition)
        await producer.close()


# the one-process fold, run as its own process so its CPU time is its own
FOLD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import headwater
    from headwater.spark_compaction.wal_segments import row

    async def fold(address, topic):
        state = {}
        records = 0
        async with await headwater.connect(address) as client:
            ends = (await client.describe_topic(topic)).next_offsets
            for partition, end in enumerate(ends):
                offset = 0
                while offset < end:
                    fetched = await client.fetch(topic, partition, offset)
                    for _, _, key, value, _ in fetched.records(row):
                        records += 1
                        if value is None:
                            state.pop((partition, key), None)
                        else:
                            state[(partition, key)] = value
                    offset = fetched.next_offset
        return records, len(state)

    records, keys = asyncio.run(fold(sys.argv[1], sys.argv[2]))
    print(json.dumps({"records": records, "keys": keys}))
    """
)

START_UP = textwrap.dedent(
    """
    from headwater.spark_compaction.session import spark_session
    spark_session("local[2]", compaction=True).stop()
    """
)


# Runs a command as a child of a subreaper and reaps every process it leaves (the JVM, PySpark's
# workers), so each one's CPU time reaches this process's rusage; prints the command's exit status,
# output and that CPU time as JSON.
REAPER = textwrap.dedent(
    """
    import ctypes, json, os, resource, subprocess, sys
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=1800)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                      "cpu": used.ru_utime + used.ru_stime}))
    """
)


class Tree:
    """Runs a command as a new process and measures it with every process it starts: wall time,
    CPU-s from rusage (exact: the command runs under a subreaper that reaps its orphans too), and
    CPU-s by kind sampled from /proc while it runs (the JVM, the command's own process, and the
    other Python processes, by their module)."""

    def __init__(self) -> None:
        self.ticks = os.sysconf("SC_CLK_TCK")

    def run(self, command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        seen: dict[int, tuple[str, float]] = {}
        done = threading.Event()
        started = time.monotonic()
        reaper = subprocess.Popen(
            [sys.executable, "-c", REAPER, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        sampler = threading.Thread(target=self._sample, args=(reaper.pid, seen, done), daemon=True)
        sampler.start()
        out, err = reaper.communicate(timeout=1900)
        wall = time.monotonic() - started
        done.set()
        sampler.join()
        if reaper.returncode != 0:
            raise RuntimeError(f"the reaper exited {reaper.returncode}: {err}")
        report = json.loads(out)
        if report["status"] != 0:
            raise RuntimeError(f"{command[:4]} exited {report['status']}: {report['stderr']}")
        kinds: dict[str, float] = {}
        for kind, cpu in seen.values():
            kinds[kind or "exited"] = round(kinds.get(kind or "exited", 0.0) + cpu, 2)
        sampled = sum(kinds.values())
        return {
            "wall": round(wall, 2),
            # rusage misses PySpark's forked workers (its daemon ignores SIGCHLD, so the kernel
            # reaps them and drops their CPU time); the sample misses each process's last 0.2 s:
            # the larger of the two
            "cpu": round(max(report["cpu"], sampled), 2),
            "cpu_rusage": round(report["cpu"], 2),
            "cpu_sampled": round(sampled, 2),
            "cpu_by_kind": kinds,
            "stdout": report["stdout"],
        }

    def _sample(self, root: int, seen: dict[int, tuple[str, float]], done: threading.Event) -> None:
        while not done.wait(0.2):
            table: dict[int, tuple[int, str, float, str]] = {}
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    text = stat.read_text()
                    command = (stat.parent / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                head, _, rest = text.rpartition(")")
                fields = rest.split()
                cpu = (int(fields[11]) + int(fields[12])) / self.ticks
                name = head.split("(", 1)[1]
                words = [w.decode(errors="replace") for w in command if w]
                kind = _kind(name, words) if words else ""
                table[int(stat.parent.name)] = (int(fields[1]), name, cpu, kind)
            family = {root}
            grew = True
            while grew:
                grew = False
                for pid, (parent, *_) in table.items():
                    if parent in family and pid not in family:
                        family.add(pid)
                        grew = True
            for pid in family & table.keys():
                _, _, cpu, kind = table[pid]
                # a process that has exited and waits to be reaped has no command line left:
                # it keeps the kind it had
                seen[pid] = (seen[pid][0] if pid in seen and not kind else kind, cpu)


def _same(value: Any) -> Any:
    return value


def family_cpu(leave_out: int) -> float:
    """CPU-s of this process and its descendants (the bench's own Spark session: its JVM and
    Python workers; exited ones through their parents' cutime), less the `leave_out` process
    and its descendants (the server)."""
    ticks = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        cpu = sum(int(f) for f in fields[11:15]) / ticks  # utime, stime, cutime, cstime
        table[int(stat.parent.name)] = (int(fields[1]), cpu)
    family, total = {os.getpid()}, 0.0
    grew = True
    while grew:
        grew = False
        for pid, (parent, _) in table.items():
            if parent in family and pid not in family and pid != leave_out:
                family.add(pid)
                grew = True
    for pid in family:
        total += table[pid][1] if pid in table else 0.0
    return total


def _kind(name: str, words: list[str]) -> str:
    if name == "java":
        return "jvm"
    if "-c" in words and words[words.index("-c") + 1 :][:1] == [REAPER]:
        return "reaper"
    if "-m" in words and words.index("-m") + 1 < len(words):
        module = words[words.index("-m") + 1]
        return "command" if module == "headwater" else f"python {module}"
    return "command" if "-c" in words else "python other"


def fetch_loop(address: str, topic: str) -> tuple[int, float]:
    import headwater
    from headwater.spark_compaction.wal_segments import row

    async def read() -> tuple[int, float]:
        async with await headwater.connect(address) as client:
            ends = (await client.describe_topic(topic)).next_offsets
            started = time.perf_counter()
            seen = 0
            for partition, end in enumerate(ends):
                offset = 0
                while offset < end:
                    fetched = await client.fetch(topic, partition, offset)
                    seen += len(fetched.records(row))
                    offset = fetched.next_offset
            return seen, time.perf_counter() - started

    return asyncio.run(read())


def source_read(spark: Any, address: str, topic: str, checkpoint: Path) -> float:
    return source_query(spark, address, topic, checkpoint)[0]


def source_query(
    spark: Any, address: str, topic: str, checkpoint: Path
) -> tuple[float, dict[str, Any]]:
    """Seconds from the query's start to its end, and its last micro-batch's progress."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("headwater")
        .option("server", address)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started, query.lastProgress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", type=Path, help="directory for the server (default: /tmp)")
    parser.add_argument("--skip", nargs="*", default=[], help="rows to leave out")
    args = parser.parse_args(argv)
    records = args.records // CHUNK * CHUNK

    from headwater.spark_compaction.job import CompactionSettings, run
    from headwater.spark_compaction.session import spark_session
    from headwater.spark_compaction.store import StoreSpec
    from headwater.testing import ServerProcess

    tree = Tree()
    python = sys.executable
    env = dict(os.environ)
    rounds: list[dict[str, Any]] = []
    if args.scratch is not None:  # a scratch directory named but not there yet: made
        Path(args.scratch).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spark-bench-", dir=args.scratch) as tmp:
        root = Path(tmp)
        server = ServerProcess(root / "data").start()
        try:
            asyncio.run(produce(server.address, "bench", records, args.keys))
            asyncio.run(produce(server.address, "warm", CHUNK * PARTITIONS, 100))
        finally:
            if server.stop() != 0:
                raise RuntimeError("the server's graceful stop failed")
        objects = root / "data" / "objects"
        log(f"{records:,} records, {sum(p.stat().st_size for p in objects.rglob('*.log')):,} B")
        server = ServerProcess(root / "data").start()
        spark = None
        try:
            for number in range(args.rounds):
                found: dict[str, Any] = {"load_average": [round(os.getloadavg()[0], 1)]}
                if "fold" not in args.skip or "compact" not in args.skip:
                    fold = tree.run([python, "-c", FOLD, server.address, "bench"], env)
                    fold |= json.loads(fold.pop("stdout"))
                    found["fold"] = fold
                    log(f"round {number}: fold {fold}")
                if "compact" not in args.skip:
                    copy = root / "compact"
                    shutil.rmtree(copy, ignore_errors=True)
                    shutil.copytree(objects, copy / "objects")
                    command = [python, "-m", "headwater", "compact", "--data-dir", str(copy)]
                    command += ["--topic", "bench", "--master", "local[2]", "--format", "json"]
                    compact = tree.run(command, env)
                    summary = json.loads(compact.pop("stdout"))
                    if summary["keys_out"] != found["fold"]["keys"]:
                        raise RuntimeError(f"compact kept {summary['keys_out']} keys: {summary}")
                    compact |= {"keys": summary["keys_out"], "phases": summary["phases"]}
                    compact["cpu_python_workers"] = python_workers(compact["cpu_by_kind"])
                    found["compact"] = compact
                    log(f"round {number}: compact {compact}")
                    start_up = tree.run([python, "-c", START_UP], env)
                    start_up.pop("stdout")
                    found["spark_start_up"] = start_up
                    log(f"round {number}: spark start-up {start_up}")
                if "source" not in args.skip:
                    seen, seconds = fetch_loop(server.address, "bench")
                    found["fetch_loop_records_per_s"] = round(seen / seconds)
                    if spark is None:
                        spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
                        source_read(spark, server.address, "warm", root / "warm-checkpoint")
                    seconds, progress = source_query(
                        spark, server.address, "bench", root / f"ckpt-{number}"
                    )
                    found["source_records_per_s"] = round(records / seconds)
                    # the micro-batch alone (Spark's processedRowsPerSecond): what a running
                    # query reads past its start
                    batch_ms = progress["durationMs"]["triggerExecution"]
                    found["source_batch_records_per_s"] = round(
                        progress["numInputRows"] / max(batch_ms / 1000, 1e-3)
                    )
                    found["source_batch_over_fetch"] = round(
                        found["source_batch_records_per_s"] / found["fetch_loop_records_per_s"], 2
                    )
                    # a query's fixed cost: the same query over the 1,000-record topic
                    fixed = source_read(spark, server.address, "warm", root / f"fixed-{number}")
                    found["source_query_fixed_s"] = round(fixed, 2)
                    found["source_past_fixed_records_per_s"] = round(
                        records / max(seconds - fixed, 1e-3)
                    )
                    found["source_over_fetch"] = round(
                        found["source_records_per_s"] / found["fetch_loop_records_per_s"], 2
                    )
                    log(f"round {number}: fetch loop and source {found}")
                if "warm" not in args.skip and spark is not None:
                    assert server.process is not None
                    server_pid = server.process.pid
                    copy = root / "warm-compact"
                    shutil.rmtree(copy, ignore_errors=True)
                    shutil.copytree(objects, copy)
                    before, started = family_cpu(server_pid), time.monotonic()
                    settings = CompactionSettings(StoreSpec.local(copy), ("bench",))
                    summary = run(functools.partial(_same, spark), settings)
                    found["compact_warm"] = {
                        "wall": round(time.monotonic() - started, 2),
                        "cpu": round(family_cpu(server_pid) - before, 2),
                        "phases": summary.phases,
                    }
                    log(f"round {number}: compact in a warm session {found['compact_warm']}")
                if "compact" in found:
                    fold, compact, start = found["fold"], found["compact"], found["spark_start_up"]
                    found["compact_cpu_over_fold"] = round(compact["cpu"] / fold["cpu"], 2)
                    found["compact_minus_start_up_cpu_over_fold"] = round(
                        (compact["cpu"] - start["cpu"]) / fold["cpu"], 2
                    )
                found["load_average"].append(round(os.getloadavg()[0], 1))
                rounds.append(found)
            log(f"medians over {len(rounds)} rounds: {json.dumps(medians(rounds))}")
        finally:
            if spark is not None:
                spark.stop()
            server.stop()
    print(
        json.dumps(
            {
                "benchmark": "issue 40: compaction and the streaming source",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "records": records,
                "keys": args.keys,
                "partitions": PARTITIONS,
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "medians": medians(rounds),
                "rounds": rounds,
            },
            indent=2,
        )
    )
    return 0


# the figures each round's verdict rests on, by their path in a round's report
VERDICT = (
    "compact_minus_start_up_cpu_over_fold",
    "compact_cpu_over_fold",
    "compact.cpu",
    "compact.cpu_python_workers",
    "spark_start_up.cpu",
    "fold.cpu",
    "compact_warm.cpu",
    "source_batch_over_fetch",
    "source_over_fetch",
    "fetch_loop_records_per_s",
    "source_batch_records_per_s",
)


def medians(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each verdict figure's median over the rounds, beside its value in each round: a load
    that comes and goes moves one round, not the median."""
    found: dict[str, dict[str, Any]] = {}
    for path in VERDICT:
        values = []
        for one in rounds:
            value: Any = one
            for step in path.split("."):
                value = value.get(step) if isinstance(value, dict) else None
            if isinstance(value, int | float):
                values.append(value)
        if values:
            found[path] = {"median": round(statistics.median(values), 2), "rounds": values}
    return found


def python_workers(by_kind: dict[str, float]) -> float:
    """CPU-s of PySpark's worker daemon and its forked workers (pyspark.daemon or ours)."""
    return round(sum(cpu for kind, cpu in by_kind.items() if kind.endswith("daemon")), 2)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
