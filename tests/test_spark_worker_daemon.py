"""The Python worker daemon Headwater's sessions name (spark_compaction/worker_daemon.py): Spark's
zipped copy of PySpark is taken off the workers' path only when it is the installed package's own,
and a real session's workers run under that daemon, with PySpark imported from the package and
the preloaded modules already there when a task starts."""

from __future__ import annotations

import io
import os
import signal
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headwater.spark_compaction.worker_daemon import installed_pyspark_path


def _installed(site: Path, py4j: bool = True) -> tuple[str, str]:
    """A pip-installed pyspark under `site`, with the zips Spark puts first on the path."""
    package = site / "pyspark"
    lib = package / "python" / "lib"
    lib.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if py4j:
        (site / "py4j").mkdir()
        (site / "py4j" / "__init__.py").write_text("")
    zips = (lib / "pyspark.zip", lib / "py4j-0.10.9.9-src.zip")
    for name in zips:
        with zipfile.ZipFile(name, "w") as archive:
            archive.writestr("placeholder.py", "")
    return str(zips[0]), str(zips[1])


def test_the_installed_packages_own_zips_are_taken_off_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _installed(site)
    jar = str(site / "pyspark" / "jars" / "spark-core.jar")
    path = [pyspark_zip, py4j_zip, jar, "/work/code", str(site)]
    assert installed_pyspark_path(path) == [jar, "/work/code", str(site)]


def test_a_spark_distributions_zip_stays(tmp_path: Path) -> None:
    home = tmp_path / "spark-4.3.0"  # SPARK_HOME of a distribution: no package beside its zip
    (home / "python" / "lib").mkdir(parents=True)
    zipped = str(home / "python" / "lib" / "pyspark.zip")
    site = tmp_path / "site-packages"
    _installed(site)
    path = [zipped, str(site)]
    assert installed_pyspark_path(path) == path


def test_the_zips_stay_when_py4j_is_not_installed_beside_pyspark(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _installed(site, py4j=False)
    path = [pyspark_zip, py4j_zip, str(site)]
    assert installed_pyspark_path(path) == path


def test_the_zips_stay_when_another_pyspark_comes_first_on_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _installed(site)
    other = tmp_path / "other"
    (other / "pyspark").mkdir(parents=True)
    (other / "pyspark" / "__init__.py").write_text("")  # a different installation
    path = [pyspark_zip, py4j_zip, str(other), str(site)]
    assert installed_pyspark_path(path) == path


def _arrow_work() -> bool:
    """What a task does with Arrow: sort binary keys, write and read Parquet with threads."""
    rows = 100_000
    table = pa.table({"key": [os.urandom(12) for _ in range(rows)], "n": range(rows)})
    buffer = io.BytesIO()
    pq.write_table(table.sort_by("key"), buffer)
    back = pq.read_table(io.BytesIO(buffer.getvalue()), use_threads=True)
    return back.num_rows == rows and pc.sum(back["n"]).as_py() == rows * (rows - 1) // 2


def test_a_process_forked_after_pyarrows_import_uses_arrows_threads_and_allocator() -> None:
    """The daemon forks workers after importing pyarrow, whose import starts jemalloc's
    background thread (pyspark.daemon's reason to import after the fork): a forked child must
    neither hang on a lock that thread held nor lose Arrow's thread pools."""
    assert _arrow_work()  # this process's pools and allocator in use before the forks too
    for _ in range(5):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if _arrow_work() else 1)
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        if done == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0


def test_a_sessions_workers_start_with_pyspark_compiled_and_pyarrow_imported(spark: object) -> None:
    def probe(_: int) -> tuple[str, bool, str]:
        import os
        import sys

        import pyspark

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode()
        # a plain RDD task imports neither: they are there because the daemon imported them (a
        # session other than the compaction job's preloads the sources' and the sink's modules)
        preloaded = {"pyarrow", "headwater.spark_compaction.sink"} <= sys.modules.keys()
        return pyspark.__file__ or "", preloaded, parent

    found = spark.sparkContext.parallelize([0, 1], 2).map(probe).collect()  # type: ignore[attr-defined]
    assert len(found) == 2
    for origin, preloaded, parent in found:
        assert ".zip" not in origin and origin.endswith("pyspark/__init__.py")
        assert preloaded
        assert "-m headwater.spark_compaction.worker_daemon" in parent
