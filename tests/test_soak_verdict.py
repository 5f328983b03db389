"""The soak's verdict (loadtest/soak.py): what counts as memory and descriptors levelling off."""

from __future__ import annotations

from typing import Any

from loadtest.soak import verdict


def _report(fds: list[int], rss_mb: list[float]) -> dict[str, Any]:
    return {
        "settings": {"seconds": float(len(fds))},
        "producer": {"acked": 10, "send_errors": 0},
        "consumer": {
            "counts": {"reliable": {"unique": 10}, "non_reliable": {"missing_below": 0}},
        },
        "resources": [
            {"t": float(t), "fds": f, "rss_mb": r}
            for t, (f, r) in enumerate(zip(fds, rss_mb, strict=True))
        ],
    }


def test_a_saw_tooth_of_open_segments_is_flat_and_a_climb_is_not() -> None:
    """Segments open at each roll and close when retention removes them: a saw-tooth whose
    highest point falls in the last fifth is not growth (a 480 s soak was judged not flat on
    its maxima, 29 then 32); a descriptor kept per roll is."""
    tooth = [28] * 5 + [29] * 5 + [30] * 5 + [31] * 5 + [32] * 5  # a roll every 5 samples
    saw = tooth * 4
    saw[-3] = 34  # a moment with three more open (a read of old segments) in the last fifth
    rss = [80.0] * 100
    assert verdict(_report(saw, rss), warmup=0)["resources_flat"] is True
    climb = [28 + t // 10 for t in range(100)]
    result = verdict(_report(climb, rss), warmup=0)
    assert result["resources_flat"] is False
    assert result["fd_growth"] == 8
    grown = verdict(_report(saw, [80.0] * 80 + [90.0] * 20), warmup=0)
    assert grown["resources_flat"] is False and grown["rss_growth_pct"] == 12.5
