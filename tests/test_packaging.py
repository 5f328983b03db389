"""The distribution as a user installs it: a wheel built from the checkout, installed into a fresh
virtualenv, exposes one import name (`headwater`) and a `headwater` command that serves, creates a
topic and round-trips a message, from a directory outside the checkout.

The fresh venv has no pip and no index: the wheel goes in with this interpreter's pip
(`--python`, `--no-deps`), and the third-party dependencies come from this venv's site-packages
through a `.pth` line. A path listed in a `.pth` file is not itself scanned for `.pth` files, so
the checkout's editable install does not leak into the fresh venv."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP = (sys.executable, "-m", "pip")
# Without PYTHONPATH: run with the checkout on it (`PYTHONPATH=$PWD pytest`), pip asked about the
# fresh venv found the checkout's `headwater.egg-info` there, said "already satisfied" and
# installed nothing, and the venv then had no `headwater`.
CLEAN_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "headwater", source / "headwater", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    dist = work / "dist"
    subprocess.run(
        [
            *PIP,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "-w",
            str(dist),
            str(source),
        ],
        check=True,
        timeout=300,
        env=CLEAN_ENV,
    )
    (built,) = dist.glob("headwater-*.whl")
    return built


def test_the_wheel_holds_one_import_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"headwater"}
    for module in ("wire/frames.py", "storage/wal.py", "durables/cursor.py", "server/serve.py"):
        assert f"headwater/{module}" in names
    assert "headwater/spark_compaction/job.py" in names
    assert not any(name.startswith(("tests/", "loadtest/")) for name in names)


def test_a_fresh_venv_serves_and_round_trips(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # `--python` runs this pip against the fresh venv (`--prefix` would first uninstall the
    # checkout's own editable install from the venv running the tests)
    subprocess.run(
        [
            *PIP,
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
        env=CLEAN_ENV,
    )
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    # the dependencies (construct, aiokafka, rocksdict, ...) from the venv running the tests
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=elsewhere, env=CLEAN_ENV, capture_output=True, text=True, timeout=60
        )

    probe = run(
        str(python),
        "-c",
        "import headwater, headwater.server.serve, headwater.spark_compaction.loader;"
        "print(headwater.__file__)",
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(env_dir))
    for name in ("wire", "storage", "durables", "server", "spark_compaction"):
        missing = run(str(python), "-c", f"import {name}")
        assert f"No module named '{name}'" in missing.stderr

    command = str(env_dir / "bin" / "headwater")
    port_file = tmp_path / "port"
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [
            command,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=elsewhere,
        env=CLEAN_ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.05)
        assert port_file.exists(), (tmp_path / "server.log").read_text()
        address = f"127.0.0.1:{port_file.read_text()}"
        created = run(command, "topic", "create", "packaged", "--server", address)
        assert created.returncode == 0, created.stderr
        produced = run(command, "produce", "packaged", "hello", "--server", address)
        assert produced.returncode == 0, produced.stderr
        consumed = run(
            command,
            "consume",
            "packaged",
            "-s",
            "s",
            "--from",
            "earliest",
            "--count",
            "1",
            "--server",
            address,
        )
        assert consumed.returncode == 0, consumed.stderr
        assert "hello" in consumed.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0, (tmp_path / "server.log").read_text()
        log.close()
