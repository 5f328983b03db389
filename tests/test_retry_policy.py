"""The exact delay sequence of each retry strategy, with the cap and the total timeout."""

from __future__ import annotations

import random

import pytest

from headwater.client.producer import RetryPolicy, RetryStrategy
from headwater.wire.errors import InvalidRequest


def test_fixed() -> None:
    policy = RetryPolicy(
        max_retries=4, initial_delay=0.5, max_delay=2, strategy=RetryStrategy.FIXED
    )
    assert list(policy.delays()) == [0.5, 0.5, 0.5, 0.5]


def test_fibonacci_with_cap() -> None:
    policy = RetryPolicy(
        max_retries=8, initial_delay=0.1, max_delay=0.6, strategy=RetryStrategy.FIBONACCI
    )
    assert list(policy.delays()) == pytest.approx([0.1, 0.1, 0.2, 0.3, 0.5, 0.6, 0.6, 0.6])


def test_exponential_doubles_and_caps() -> None:
    policy = RetryPolicy(max_retries=6, initial_delay=0.01, max_delay=0.1)
    assert list(policy.delays()) == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])


def test_max_retries_zero_means_no_retry() -> None:
    assert list(RetryPolicy(max_retries=0).delays()) == []


def test_timeout_bounds_the_schedule() -> None:
    policy = RetryPolicy(
        max_retries=10,
        initial_delay=1.0,
        max_delay=4.0,
        timeout=10.0,
        strategy=RetryStrategy.EXPONENTIAL,
    )
    # delays 1, 2, 4, 4, 4 ...: retries start at 1, 3, 7; the next would start at 11 > 10
    assert policy.schedule() == [1.0, 3.0, 7.0]


def test_jitter_stays_within_each_delay() -> None:
    policy = RetryPolicy(max_retries=5, initial_delay=0.1, max_delay=1.0, jitter=True)
    rng = random.Random(7)
    jittered = list(policy.delays(rng))
    plain = list(RetryPolicy(max_retries=5, initial_delay=0.1, max_delay=1.0).delays())
    assert all(0 <= j <= p for j, p in zip(jittered, plain, strict=True))
    assert jittered != plain


@pytest.mark.parametrize(
    "arguments",
    [{"max_retries": -1}, {"initial_delay": -0.1}, {"timeout": 0}],
    ids=["negative-retries", "negative-delay", "zero-timeout"],
)
def test_bad_policies(arguments: dict[str, float]) -> None:
    with pytest.raises(InvalidRequest):
        RetryPolicy(**arguments)  # type: ignore[arg-type]
