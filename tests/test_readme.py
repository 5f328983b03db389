"""The README's tour runs, twice in a row, against a live server: the command-line block (as a
bash script whose `headwater` is this checkout's) and the Python block, each taken from the
README itself so the test follows the text."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from headwater.testing import ServerProcess

README = Path(__file__).resolve().parent.parent / "README.md"
TOUR_ADDRESS = "127.0.0.1:6650"


def tour_block(heading: str, language: str) -> str:
    """The first ```language block after `heading` in the README."""
    text = README.read_text()
    start = text.index(heading)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match is not None, f"no {language} block after {heading!r}"
    return match.group(1)


def run_cli_tour(server: ServerProcess, script: str) -> subprocess.CompletedProcess[str]:
    # Background commands (`consume ... &`) end when their topic is deleted; any still running
    # at the end are stopped by their PIDs, so each run leaves nothing behind.
    wrapped = f"""set -euo pipefail
headwater() {{ "{sys.executable}" -m headwater "$@"; }}
export HEADWATER_SERVER={server.address}
{script}
for job in $(jobs -p); do kill "$job" 2>/dev/null || true; done
wait || true
"""
    return subprocess.run(
        ["bash", "-c", wrapped],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )


def test_the_command_line_tour_runs_twice(fresh_server: ServerProcess) -> None:
    script = tour_block("### From the command line", "sh")
    assert "headwater topic create" in script
    for run in (1, 2):
        result = run_cli_tour(fresh_server, script)
        assert result.returncode == 0, f"run {run}:\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, f"run {run}:\n{result.stderr}"
        assert "headwater: error:" not in result.stderr.replace(
            "headwater: error: UNKNOWN_TOPIC",
            "",  # the background consumer, told of the delete
        ), f"run {run}:\n{result.stderr}"
        assert "IBM" in result.stdout or "142.10" in result.stdout


def test_the_python_tour_runs_twice(fresh_server: ServerProcess) -> None:
    code = tour_block("### From Python", "python")
    assert TOUR_ADDRESS in code
    code = code.replace(TOUR_ADDRESS, fresh_server.address)
    for run in (1, 2):
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"run {run}:\n{result.stdout}\n{result.stderr}"
        assert "stored at" in result.stdout and "b'hello'" in result.stdout
