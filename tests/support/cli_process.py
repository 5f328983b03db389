"""The `headwater` command as a child process against a live server, for the CLI tests. Every bound
here only bounds a hang: a CLI process takes seconds to start on a loaded machine.

`hw` runs each command in a process of its own, with its own stdin, stdout, stderr, environment and
exit status, as a user's shell would, but forked from a per-worker *zygote* that has already
imported `headwater.cli.main`: the command runs `main(argv)` exactly as `python -m headwater` does
after its imports. Starting an interpreter and importing the client costs about a second of CPU per
command, and the CLI tests run hundreds of commands, which made them the suite's slowest modules.
The interpreter start and the `headwater` entry point run from scratch wherever a test needs a
process of its own (`start_consumer`, signals in tests/test_cli_ops.py, tokens in
tests/test_security.py, the installed wheel in tests/test_packaging.py).

The zygote is single-threaded and never starts an event loop or a thread before it forks, so the
child starts as a fresh `headwater` process would after its imports. It serves one command at a
time: it forks, waits for the child and answers with its exit status; `hw` holds a lock so that
threads of one test process take turns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from headwater.testing import ServerProcess

# Runs in the zygote: read one JSON request per line, fork, answer one JSON line per command.
_ZYGOTE = r"""
import json, os, sys
import headwater.cli.main

requests, answers = sys.stdin, os.fdopen(int(sys.argv[1]), "w")
for line in requests:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(answers.fileno())
            os.chdir(request["cwd"])
            stdin = os.open(request["stdin"], os.O_RDONLY)
            stdout = os.open(request["stdout"], os.O_WRONLY)
            stderr = os.open(request["stderr"], os.O_WRONLY)
            for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
                os.dup2(fd, target)
                os.close(fd)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = ["headwater", *request["argv"]]
            try:
                code = headwater.cli.main.main(request["argv"])
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code if isinstance(code, int) else 1)
    answers.write(json.dumps({"pid": pid}) + "\n")
    answers.flush()
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
    answers.flush()
"""


class _Zygote:
    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, str(write_fd)],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            text=True,
        )
        os.close(write_fd)
        self.answers = os.fdopen(read_fd)
        self.lock = threading.Lock()

    def run(
        self, argv: list[str], stdin: str | bytes | None, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with self.lock, tempfile.TemporaryDirectory(prefix="hw-") as scratch:
            paths = {name: Path(scratch) / name for name in ("stdin", "stdout", "stderr")}
            if isinstance(stdin, bytes):
                paths["stdin"].write_bytes(stdin)
            else:
                paths["stdin"].write_text(stdin or "")
            for name in ("stdout", "stderr"):
                paths[name].touch()
            request = {
                "argv": argv,
                "env": env,
                "cwd": os.getcwd(),
                **{k: str(v) for k, v in paths.items()},
            }
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            pid = json.loads(self.answers.readline())["pid"]
            status = self._wait(pid, timeout)
            command = ["headwater", *argv]
            if status is None:
                raise subprocess.TimeoutExpired(
                    command, timeout, paths["stdout"].read_text(), paths["stderr"].read_text()
                )
            return subprocess.CompletedProcess(
                command, status, paths["stdout"].read_text(), paths["stderr"].read_text()
            )

    def _wait(self, pid: int, timeout: float) -> int | None:
        """The child's exit status, or None after killing it when it outlived `timeout`."""
        finished = threading.Event()
        answer: list[int] = []

        def read() -> None:
            line = self.answers.readline()
            if line:
                answer.append(json.loads(line)["status"])
            finished.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if not finished.wait(timeout):
            os.kill(pid, 9)
            if not finished.wait(30):
                self.process.kill()  # out of step with its answers: the next hw starts another
            return None
        if not answer:
            raise RuntimeError("the CLI zygote died")
        return answer[0]


_zygote: _Zygote | None = None


def hw(
    *args: str,
    server: ServerProcess | None = None,
    stdin: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`headwater ARGS [--server ADDRESS]` in a child process: its exit status, stdout, stderr."""
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = _Zygote()
    argv = [*args, *(["--server", server.address] if server is not None else [])]
    return _zygote.run(argv, stdin, {**os.environ, **(env or {})}, timeout)


def start_consumer(server: ServerProcess, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "headwater", "consume", *args, "--server", server.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process


def wait_for_consumers(server: ServerProcess, topic: str, count: int) -> None:
    deadline = time.monotonic() + 60  # a hang bound: a CLI process takes seconds under load
    while time.monotonic() < deadline:
        out = hw("topic", "describe", topic, server=server).stdout
        if out.count("    consumer ") >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{count} consumers never attached to {topic}")
