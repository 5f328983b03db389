"""The Spark session the compaction job runs in: the same settings on a laptop and on a cluster.

`local[N]` runs everything in this process's JVM, bound to 127.0.0.1. Any other master (a
standalone `spark://host:port`, or whatever `spark-submit` supports) gets the job unchanged; only
the driver's address must be reachable from the executors, which `--conf spark.driver.host=...`
sets when the default is wrong. Executors run Python with this interpreter (`sys.executable`), so
the cluster's machines need the same environment at the same path; the job's modules travel by
import, not by upload (the executors' Python daemon too: `worker_daemon`, which imports the
workers' modules once). Spark's UI is off and its log is quiet: the CLI prints what matters.

A local run is one short-lived JVM whose cost is mostly fixed (docs/COMPACTION.md, "What a run
costs"), so `local` masters get settings that cut it: the serial collector, no adaptive
execution, one shuffle partition per core, and the JVM's classes shared between runs (AppCDS,
`class_archive`); a session for the compaction job alone (the CLI's) also runs with the client
compiler only and without code generation, expressions interpreted (C2's and Janino's compiling
cost more than the few rows per key they would speed up: the Python tasks fold). A streaming
query's session keeps both: it moves every record through the JVM.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headwater.spark_compaction import worker_daemon

DEFAULTS = {
    "spark.app.name": "headwater-compact",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "1g",
    "spark.python.worker.reuse": "true",
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    # the workers forked with their imports done, PySpark's compiled (worker_daemon.py)
    "spark.python.daemon.module": "headwater.spark_compaction.worker_daemon",
}
# the compaction job's workers import its tasks' modules only, not the sources' and the sink's
COMPACTION_DEFAULTS = {
    f"spark.executorEnv.{worker_daemon.PRELOAD_ENV}": ",".join(worker_daemon.COMPACTION_MODULES),
}
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # a concurrent collector's threads fight the job for the cores of one machine;
    # `--conf spark.driver.extraJavaOptions=` overrides it
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
    "spark.sql.adaptive.enabled": "false",
}
# The compaction job's JVM is short-lived and does little per record (the Python tasks decode and
# fold): the C2 compiler's work never pays back there. The client compiler alone and the serial
# collector halved the JVM's CPU of a 1M-record run (22.5 to 12.2 s, docs/BENCHMARKS.md). A
# streaming query moves every record through the JVM: there the client compiler's code doubled
# the JVM's CPU per record (2.4-2.7 against 1.1-1.5 CPU-s a million), so other sessions keep C2.
COMPACTION_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
# The compaction job's JVM sees one row per key and task (the Python tasks fold): Janino compiling
# the plan's code cost more CPU than it saved, from 20,000 to 10,000,000 records. A session for
# anything else (a streaming query moves every record through the JVM) keeps code generation.
COMPACTION_LOCAL_DEFAULTS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# the magic number a JDK 17 dynamic class archive begins with (little-endian), checked before an
# archive a run left is taken into use: a JVM killed while writing it leaves no valid header
DYNAMIC_ARCHIVE_MAGIC = (0xF00BABA8).to_bytes(4, "little")
ARCHIVE_SETTLE_SECONDS = 60.0  # a run's archive is taken into use once it is this old


def class_archive(cache: Path | None = None) -> str:
    """JVM options that map the classes an earlier local run loaded from an archive (AppCDS)
    instead of loading, verifying and linking them again: about 5 CPU-s of a cold run's 14 in the
    JVM. The first run writes the archive as its JVM exits (`-XX:ArchiveClassesAtExit`, under a
    name of its own, as the JVM cannot be told to rename it); a later run takes a finished one
    (old enough, with an archive's header) into use under the shared name. The archive is keyed
    by the JVM and the pyspark installation; if it does not fit, the JVM ignores it
    (`-Xshare:auto`). HEADWATER_SPARK_CLASS_ARCHIVE=0 turns this off."""
    if os.environ.get("HEADWATER_SPARK_CLASS_ARCHIVE", "1") == "0":
        return ""
    import pyspark

    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java") or "java"
    identity = f"{os.path.realpath(java)}|{pyspark.__version__}|{os.path.dirname(pyspark.__file__)}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    root = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = root / "headwater" / "spark-classes"
    shared = folder / f"{key}.jsa"
    quiet = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # two runs that start together may both write one; the first settled is used, the rest go
        for written in sorted(folder.glob(f"{key}.*.partial")):
            if time.time() - written.stat().st_mtime <= ARCHIVE_SETTLE_SECONDS:
                continue
            with written.open("rb") as f:
                valid = f.read(4) == DYNAMIC_ARCHIVE_MAGIC
            if valid and not shared.exists():
                written.replace(shared)
            else:
                written.unlink()
        if shared.exists():
            return f"{quiet} -XX:SharedArchiveFile={shared}"
        if any(folder.glob(f"{key}.*.partial")):
            return ""  # another run's archive is being written or settling
        return f"{quiet} -XX:ArchiveClassesAtExit={folder / f'{key}.{os.getpid()}.partial'}"
    except OSError:
        return ""  # no cache: every run loads its classes


def local_cores(master: str) -> int:
    """The cores of a `local`, `local[N]` or `local[*]` master."""
    inside = master.partition("[")[2].partition("]")[0].partition(",")[0]
    if inside in ("", "*"):
        return 1 if not inside else os.cpu_count() or 1
    return max(1, int(inside)) if inside.isdigit() else 1


def session_settings(
    master: str, conf: Mapping[str, str] | None = None, compaction: bool = False
) -> dict[str, str]:
    """The settings `spark_session` starts a session with: DEFAULTS, a local master's and the
    compaction job's own, then `conf`."""
    settings = dict(DEFAULTS)
    if compaction:
        settings.update(COMPACTION_DEFAULTS)
    if master.startswith("local"):
        settings.update(LOCAL_DEFAULTS)
        if compaction:
            settings.update(COMPACTION_LOCAL_DEFAULTS)
            settings["spark.driver.extraJavaOptions"] += f" {COMPACTION_JVM_OPTIONS}"
        settings["spark.sql.shuffle.partitions"] = str(local_cores(master))
        archive = class_archive()
        if archive:
            settings["spark.driver.extraJavaOptions"] += f" {archive}"
    settings.update(conf or {})
    return settings


def spark_session(
    master: str = "local[2]", conf: Mapping[str, str] | None = None, compaction: bool = False
) -> Any:
    """Start (or join, if this process already has one) a Spark session, with Headwater's data
    sources registered; or, with `compaction`, one for the compaction job alone: no data sources
    registered (registering starts a Python process to look them up; the job uses none) and, on
    a local master, no code generation (COMPACTION_LOCAL_DEFAULTS)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master)
    for name, value in session_settings(master, conf, compaction).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not compaction:
        from headwater.spark_compaction.source import register

        register(spark)
    return spark


def running_session() -> bool:
    """Whether this process has a Spark session already (which `spark_session` would join)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None
