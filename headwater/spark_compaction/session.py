"""The Spark session the compaction job runs in: the same settings on a laptop and on a cluster.

`local[N]` runs everything in this process's JVM, bound to 127.0.0.1. Any other master (a
standalone `spark://host:port`, or whatever `spark-submit` supports) gets the job unchanged; only
the driver's address must be reachable from the executors, which `--conf spark.driver.host=...`
sets when the default is wrong. Executors run Python with this interpreter (`sys.executable`), so
the cluster's machines need the same environment at the same path; the job's modules travel by
import, not by upload. Spark's UI is off and its log is quiet: the CLI prints what matters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

DEFAULTS = {
    "spark.app.name": "headwater-compact",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "1g",
    "spark.python.worker.reuse": "true",
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
}
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # A local run is one short-lived JVM that does little per record (the Python tasks decode and
    # fold; the JVM merges one row per key and task): the C2 compiler's work never pays back
    # there, and a concurrent collector's threads fight the job for the cores. The client
    # compiler alone and the serial collector halved the JVM's CPU of a 1M-record run (22.5 to
    # 12.2 s, docs/BENCHMARKS.md); `--conf spark.driver.extraJavaOptions=` overrides it.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def spark_session(master: str = "local[2]", conf: Mapping[str, str] | None = None) -> Any:
    """Start (or join, if this process already has one) a Spark session for compaction."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from headwater.spark_compaction.source import register

    settings = {**DEFAULTS, **(LOCAL_DEFAULTS if master.startswith("local") else {})}
    settings.update(conf or {})
    builder = SparkSession.builder.master(master)
    for name, value in settings.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def running_session() -> bool:
    """Whether this process has a Spark session already (which `spark_session` would join)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None
