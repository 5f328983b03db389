"""Map get/set against Redis GET/SET and NATS KV: now the "map" rows of loadtest/peers.py.

Kept so that the command in docs/BENCHMARKS.md's earlier sections still runs; the peer servers,
clients and ratios live in loadtest/peers.py, loadtest/peer_servers.py and
loadtest/peer_clients.py, and last-value fan-out is a row of loadtest/bench.py. Arguments are
passed on to loadtest.peers (`--quick`, `--format json`, ...).

    python -m loadtest.map_bench        # = python -m loadtest.peers --only map
"""

from __future__ import annotations

import sys

from loadtest import peers


def main(argv: list[str] | None = None) -> int:
    return peers.main(["--only", "map", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
