"""The `headwater` command's entry point (and `python -m headwater`'s): `serve` goes to
headwater/cli/serve_command.py, which does not import the client library; every other command to
headwater/cli/main.py."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        from headwater.cli import serve_command

        return serve_command.main()
    from headwater.cli import main as full

    return full.main()
