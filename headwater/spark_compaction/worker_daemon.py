"""PySpark's worker daemon with the imports its workers need done once, before it forks them.

An executor starts one Python daemon (`python -m <spark.python.daemon.module> <worker module>`)
that forks a worker per Python task slot; `session.DEFAULTS` names this module, which does two
things and then runs pyspark.daemon's own manager, unchanged:

- Spark puts its zipped copy of PySpark first on the path (`$SPARK_HOME/python/lib/pyspark.zip`
  and py4j's zip). With PySpark installed as a package, that copy is inside the package itself
  (`pyspark/python/lib/`): the same code, but zipped without compiled files, so every Python
  process of the job compiled each PySpark module it imported from source, 0.35-0.45 CPU-s per
  process (docs/BENCHMARKS.md). When the zips belong to the package found on the rest of the
  path (the same files, the same version), they are taken off the path and PySpark is imported
  from the package, compiled once. A Spark distribution's own zip (no installed package beside
  it) stays. The Python processes Spark starts without the daemon (a streaming query's planning
  and its driver-side runner) still compile theirs: nothing of ours runs in them first.
- The daemon imports the worker's modules (pyspark.worker, pyarrow, the job's task modules)
  before it forks, so each worker inherits them instead of importing them after the fork.
  pyspark.daemon imports the worker module after the fork on purpose, because importing pyarrow
  starts a thread (jemalloc's background purging thread) and a fork copies only the forking
  thread. That is safe here: jemalloc takes its locks around a fork (pthread_atfork) and runs
  the child without the background thread, and Arrow's thread pools start on first use, never
  in the daemon, and are re-created in a forked child. The daemon runs no task itself.

An import that fails here (a module missing on an executor) is left to the worker, which reports
it as the task's error, as it would without this module.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# What the workers import: PySpark's worker and its Arrow serializers, pyarrow, and the modules of
# the tasks' functions. A session names its own in the executors' environment (PRELOAD_ENV): the
# compaction job's, or (unset) all of Headwater's (the compaction tasks, the sources, the sink);
# what no worker imports would cost the daemon for nothing.
PRELOAD_ENV = "HEADWATER_WORKER_PRELOAD"
WORKER_MODULES = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.parquet",
)
COMPACTION_MODULES = (*WORKER_MODULES, "headwater.spark_compaction.one_task")
ALL_MODULES = (
    *COMPACTION_MODULES,
    "pyspark.sql.worker.plan_data_source_read",
    "headwater.spark_compaction.source",
    "headwater.spark_compaction.sink",
)


def installed_pyspark_path(path: list[str]) -> list[str]:
    """`path` without the zips of PySpark and py4j that Spark put first on it, if they are the
    installed PySpark package's own (`<package>/python/lib/*.zip`) and both PySpark and py4j are
    importable from the rest of `path`; otherwise `path` unchanged."""
    zips = [entry for entry in path if entry.endswith(".zip") and _packaged_zip(Path(entry))]
    if not zips:
        return path
    rest = [entry for entry in path if entry not in zips]
    found = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    origin = Path(found.origin) if found is not None and found.origin else None
    owners = {Path(entry).parents[2] for entry in zips}
    if origin is None or owners != {origin.parent}:
        return path
    if importlib.machinery.PathFinder.find_spec("py4j", rest) is None:
        return path
    return rest


def _packaged_zip(zipped: Path) -> bool:
    lib = zipped.parent
    return (
        lib.name == "lib"
        and lib.parent.name == "python"
        and (lib.parent.parent / "__init__.py").is_file()
        and (zipped.name == "pyspark.zip" or zipped.name.startswith("py4j-"))
    )


def preload(names: Sequence[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the worker imports it again and reports the error as the task's
            continue


def main() -> None:
    sys.path[:] = installed_pyspark_path(sys.path)
    named = os.environ.get(PRELOAD_ENV)
    preload(named.split(",") if named else ALL_MODULES)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
