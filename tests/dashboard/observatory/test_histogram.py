"""The rollups' latency histogram: fixed log-spaced buckets that add up."""

from dashboard.observatory.histogram import (
    BUCKET_COUNT,
    LATENCY_BUCKET_BOUNDS_MS,
    bucket_index,
    histogram_of,
    merge,
    percentile,
)


def test_it_puts_a_duration_in_the_first_bucket_whose_bound_holds_it():
    assert bucket_index(0) == 0 and bucket_index(1) == 0 and bucket_index(1.01) == 1
    assert bucket_index(-5) == 0
    assert bucket_index(10**9) == BUCKET_COUNT - 1


def test_it_merges_histograms_bucket_by_bucket_and_tolerates_short_ones():
    assert merge([histogram_of([1, 3]), histogram_of([3]), [1]]) == histogram_of([1, 3, 3, 1])


def test_it_reads_percentiles_as_bucket_upper_bounds():
    counts = histogram_of([1] * 50 + [40] * 45 + [900] * 5)
    assert (percentile(counts, 0.5), percentile(counts, 0.95), percentile(counts, 0.99)) == (1.0, 50.0, 1000.0)
    assert percentile(histogram_of([]), 0.5) is None
    assert percentile(histogram_of([10**9]), 0.5) == float(LATENCY_BUCKET_BOUNDS_MS[-1])
