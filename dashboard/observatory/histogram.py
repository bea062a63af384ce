"""The latency histogram of the hourly tool rollups.

Bucket bounds are defined here once: fixed and log-spaced (1-2-5 per decade), so
rollups from different hours, tools and processes add bucket by bucket, and a
percentile read from the sum is off by at most one bucket's width.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Sequence

# Inclusive upper bounds in milliseconds; one more bucket catches everything above.
LATENCY_BUCKET_BOUNDS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 500,
    1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
)
BUCKET_COUNT = len(LATENCY_BUCKET_BOUNDS_MS) + 1


def empty_histogram() -> list[int]:
    return [0] * BUCKET_COUNT


def bucket_index(duration_ms: float) -> int:
    """The bucket a duration falls in: the first bound >= duration."""
    return bisect_left(LATENCY_BUCKET_BOUNDS_MS, max(duration_ms, 0.0))


def histogram_of(durations_ms: Iterable[float]) -> list[int]:
    counts = empty_histogram()
    for duration in durations_ms:
        counts[bucket_index(duration)] += 1
    return counts


def merge(histograms: Iterable[Sequence[int]]) -> list[int]:
    """Sum histograms bucket by bucket (a short or malformed one counts as zeros)."""
    total = empty_histogram()
    for counts in histograms:
        for i, count in enumerate(list(counts)[:BUCKET_COUNT]):
            total[i] += int(count)
    return total


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile (0 < q <= 1); None when
    empty. The overflow bucket reports the last bound (a floor, said on the page)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = max(1, int(-(-q * total // 1)))  # ceil(q * total)
    seen = 0
    for i, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return float(LATENCY_BUCKET_BOUNDS_MS[min(i, len(LATENCY_BUCKET_BOUNDS_MS) - 1)])
    return float(LATENCY_BUCKET_BOUNDS_MS[-1])
