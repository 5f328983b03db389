"""Server configuration: one frozen dataclass, built once by `serve` and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wire.limits import MAX_FRAME_SIZE


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 6650
    data_dir: Path = Path("./data")
    # Written with the bound port once the server listens (useful with port 0).
    port_file: Path | None = None
    max_frame_size: int = MAX_FRAME_SIZE
    # Non-reliable: messages a subscription holds while its consumers have no credit. Past it,
    # new messages are dropped and counted, so a slow consumer costs bounded memory.
    subscription_backlog: int = 10_000
    # Bytes queued on a consumer's socket before the server stops sending to it (asyncio's
    # write-buffer high-water mark); resumes at a quarter of it.
    consumer_write_buffer: int = 4 * 1024 * 1024
    # How long a graceful shutdown waits for connections to flush.
    shutdown_timeout: float = 5.0
    log_format: str = "console"  # or "json"
    log_level: str = "info"
