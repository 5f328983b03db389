"""The local Spark session's settings that cut a cold run's fixed cost: the class archive a run
leaves for the next (AppCDS) and one shuffle partition per core. No JVM starts here: these are
the options handed to it, read from the cache directory as a real run leaves it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from headwater.spark_compaction.session import (
    ARCHIVE_SETTLE_SECONDS,
    DYNAMIC_ARCHIVE_MAGIC,
    class_archive,
    local_cores,
    session_settings,
)
from headwater.spark_compaction.worker_daemon import COMPACTION_MODULES, PRELOAD_ENV


def _folder(cache: Path) -> Path:
    return cache / "headwater" / "spark-classes"


def _left(cache: Path, pid: int, content: bytes, age: float) -> Path:
    """An archive a run's JVM wrote as it exited, `age` seconds ago."""
    first = class_archive(cache)  # names the archive this installation's runs use
    name = first.rsplit("=", 1)[1]
    path = Path(name).with_name(Path(name).name.replace(f".{os.getpid()}.", f".{pid}."))
    path.write_bytes(content)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_a_first_run_writes_the_archive_as_its_jvm_exits(tmp_path: Path) -> None:
    options = class_archive(tmp_path)
    assert "-XX:ArchiveClassesAtExit=" in options
    assert options.endswith(f".{os.getpid()}.partial")
    assert Path(options.rsplit("=", 1)[1]).parent == _folder(tmp_path)
    assert "-Xlog:cds=off" in options  # nothing on the CLI's stdout, where its JSON goes


def test_a_finished_archive_is_taken_into_use_under_the_shared_name(tmp_path: Path) -> None:
    left = _left(tmp_path, 1, DYNAMIC_ARCHIVE_MAGIC + b"\0" * 60, ARCHIVE_SETTLE_SECONDS + 5)
    options = class_archive(tmp_path)
    shared = left.with_name(left.name.split(".")[0] + ".jsa")
    assert options.endswith(f"-XX:SharedArchiveFile={shared}")
    assert shared.exists() and not left.exists()
    assert class_archive(tmp_path) == options  # and by every run after


def test_a_second_archive_written_beside_the_shared_one_is_removed(tmp_path: Path) -> None:
    ours = Path(class_archive(tmp_path).rsplit("=", 1)[1])
    stamp = time.time() - ARCHIVE_SETTLE_SECONDS - 5
    first, second = (
        ours.with_name(ours.name.replace(f".{os.getpid()}.", f".{n}.")) for n in (1, 2)
    )
    for written in (first, second):  # two runs that started together both wrote one
        written.write_bytes(DYNAMIC_ARCHIVE_MAGIC)
        os.utime(written, (stamp, stamp))
    options = class_archive(tmp_path)
    assert "-XX:SharedArchiveFile=" in options
    assert not first.exists() and not second.exists()


def test_an_archive_cut_short_is_removed_and_written_again(tmp_path: Path) -> None:
    left = _left(tmp_path, 1, b"\0" * 64, ARCHIVE_SETTLE_SECONDS + 5)  # a JVM killed mid-write
    options = class_archive(tmp_path)
    assert not left.exists()
    assert "-XX:ArchiveClassesAtExit=" in options


def test_an_archive_still_being_written_is_left_alone(tmp_path: Path) -> None:
    left = _left(tmp_path, 1, DYNAMIC_ARCHIVE_MAGIC, 1.0)
    assert class_archive(tmp_path) == ""  # no archive this run, and no second writer
    assert left.exists()


def test_the_archive_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWATER_SPARK_CLASS_ARCHIVE", "0")
    assert class_archive(tmp_path) == ""
    assert not _folder(tmp_path).exists()


def test_a_cache_that_cannot_be_written_means_no_archive(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert class_archive(blocker) == ""


def test_local_masters_get_one_shuffle_partition_per_core() -> None:
    assert local_cores("local") == 1
    assert local_cores("local[2]") == 2
    assert local_cores("local[3,2]") == 3  # local[cores,maxFailures]
    assert local_cores("local[*]") == (os.cpu_count() or 1)


def test_only_the_compaction_jobs_local_session_runs_the_client_compiler_alone() -> None:
    """The job's short-lived JVM does little per record: C2 never pays back there; a streaming
    query moves every record through the JVM, where C1's code doubled its CPU per record."""
    job = session_settings("local[2]", compaction=True)
    other = session_settings("local[2]")
    assert "-XX:TieredStopAtLevel=1" in job["spark.driver.extraJavaOptions"].split()
    assert "-XX:TieredStopAtLevel=1" not in other["spark.driver.extraJavaOptions"].split()
    assert "-XX:+UseSerialGC" in other["spark.driver.extraJavaOptions"].split()
    assert job["spark.sql.codegen.wholeStage"] == "false"
    assert "spark.sql.codegen.wholeStage" not in other
    assert "spark.driver.extraJavaOptions" not in session_settings("spark://h:7077")
    given = {"spark.driver.extraJavaOptions": ""}
    overridden = session_settings("local[2]", given, compaction=True)
    assert overridden["spark.driver.extraJavaOptions"] == ""


def test_every_session_names_headwaters_worker_daemon_and_the_job_preloads_its_own_modules() -> (
    None
):
    for master in ("local[2]", "spark://h:7077"):
        job = session_settings(master, compaction=True)
        other = session_settings(master)
        for settings in (job, other):
            assert (
                settings["spark.python.daemon.module"] == "headwater.spark_compaction.worker_daemon"
            )
        assert job[f"spark.executorEnv.{PRELOAD_ENV}"].split(",") == list(COMPACTION_MODULES)
        assert f"spark.executorEnv.{PRELOAD_ENV}" not in other  # the daemon's default: all
