"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import headwater


async def drain(consumer: headwater.Consumer, idle: float = 0.6) -> list[headwater.Message]:
    """Every message that arrives until none has come for `idle` seconds."""
    received = []
    while True:
        try:
            received.append(await consumer.receive(timeout=idle))
        except TimeoutError:
            return received
