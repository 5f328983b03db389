"""The disk probe (loadtest/disk_probe.py) runs, small, and its figures are consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import disk_probe

MIB = 1 << 20


def _ordered(row: dict[str, float]) -> bool:
    return 0 <= row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"] <= row["max_ms"]


def test_each_probe_reports_ordered_percentiles_and_leaves_nothing(tmp_path: Path) -> None:
    kinds = disk_probe.fsync_kinds(tmp_path, count=50)
    assert [row["file"] for row in kinds] == ["growing", "over zeros", "over fallocate"]
    assert all(_ordered(row) for row in kinds)
    freed = disk_probe.freeing(tmp_path, size=4 * MIB)
    assert [row["freed"] for row in freed] == [
        "at once (unlink)",
        "8 MiB per step",
        "4 MiB per step",
        "1 MiB per step",
    ]
    for row in freed:
        assert row["took_ms"] >= 0 and row["beside_max_ms"] >= row["beside_p99_ms"]
    for slots in (1, 2):
        row = disk_probe.group_commit(tmp_path, rate=2000, slots=slots, seconds=0.2)
        assert row["in_flight"] == slots and _ordered(row)
    assert list(tmp_path.iterdir()) == []


def test_the_command_prints_json_and_refuses_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(disk_probe.PROBES, "fsync", lambda d: disk_probe.fsync_kinds(d, count=20))
    assert disk_probe.main(["--dir", str(tmp_path), "--only", "fsync", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["fsync"]) == 3
    with pytest.raises(SystemExit) as exit_info:
        disk_probe.main(["--dir", str(tmp_path / "absent")])
    assert exit_info.value.code == 2
    assert "not a directory" in capsys.readouterr().err
