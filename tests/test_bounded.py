"""headwater.server.catalog.bounded: the catalog opens and closes thousands of topics through it."""

from __future__ import annotations

import asyncio

import pytest

from headwater.server.catalog.bounded import bounded_gather


async def test_results_in_order_and_never_more_than_the_limit_at_once() -> None:
    running = peak = 0

    async def work(value: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return value * 2

    assert await bounded_gather((work(i) for i in range(100)), 7) == [i * 2 for i in range(100)]
    assert peak == 7


async def test_a_failure_is_raised_after_every_other_one_ran() -> None:
    finished: list[int] = []

    async def work(value: int) -> None:
        await asyncio.sleep(0)
        if value == 3:
            raise OSError("disk gone")
        finished.append(value)

    with pytest.raises(OSError, match="disk gone"):
        await bounded_gather((work(i) for i in range(10)), 2)
    assert sorted(finished) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
