"""The interval a peer benchmark gives its latency ratios: a paired block bootstrap over the
blocks of searches the two systems took in turns."""

from __future__ import annotations

import math

import numpy as np

from bench import common


def _latencies(seed: int, n: int = 400) -> list[float]:
    return list(np.random.default_rng(seed).gamma(9.0, 2.5, n))


def test_two_runs_of_one_system_get_an_interval_holding_one():
    low, high = common.paired_ratio_interval(_latencies(1), _latencies(2), 20, percentile=95)
    assert low < 1.0 < high


def test_a_system_a_fifth_slower_gets_an_interval_above_one_around_its_ratio():
    fast = _latencies(1)
    low, high = common.paired_ratio_interval([1.2 * ms for ms in fast], _latencies(2), 20, percentile=95)
    assert 1.0 < low < 1.2 < high


def test_the_same_blocks_are_drawn_for_both_so_a_slow_minute_on_both_cancels():
    """Paired: a block that is slow for both moves both percentiles, not their ratio."""
    both = _latencies(3)
    slowed = [ms * (3.0 if i // 20 == 4 else 1.0) for i, ms in enumerate(both)]
    low, high = common.paired_ratio_interval(slowed, [1.1 * ms for ms in slowed], 20, percentile=95)
    assert math.isclose(low, 1 / 1.1) and math.isclose(high, 1 / 1.1)


def test_fewer_than_two_blocks_give_no_interval():
    assert all(math.isnan(x) for x in common.paired_ratio_interval(_latencies(1, 30), _latencies(2, 30), 20,
                                                                    percentile=50))
