"""The interval a peer benchmark gives its latency ratios: a paired block bootstrap over the
blocks of searches the two systems took in turns."""

from __future__ import annotations

import numpy as np
import pytest

from bench import common


def _latencies(seed: int, n: int = 400) -> list[float]:
    return list(np.random.default_rng(seed).gamma(9.0, 2.5, n))


def test_two_runs_of_one_system_get_an_interval_holding_one():
    low, high = common.paired_ratio_interval(_latencies(1), _latencies(2), 20, percentile=95)
    assert low < 1.0 < high


def test_a_system_a_fifth_slower_gets_an_interval_above_one_around_its_ratio():
    low, high = common.paired_ratio_interval([1.2 * ms for ms in _latencies(1)], _latencies(2), 20, percentile=95)
    assert 1.0 < low < 1.2 < high


def test_the_same_blocks_are_drawn_for_both_so_a_slow_minute_on_both_cancels():
    """Paired: whichever blocks are drawn, a ratio that holds search by search holds for the draw."""
    slowed = [ms * (3.0 if i // 20 in (4, 5) else 1.0) for i, ms in enumerate(_latencies(3))]
    low, high = common.paired_ratio_interval(slowed, [1.1 * ms for ms in slowed], 20, percentile=95)
    assert low == pytest.approx(1 / 1.1) and high == pytest.approx(1 / 1.1)


def test_slow_minutes_that_fall_in_blocks_widen_the_interval_more_than_the_same_searches_spread_out():
    """Blocks, not single searches, are drawn: a busy minute moves a whole block."""
    other = _latencies(5)
    clustered = [ms * (2.0 if i // 20 in (2, 3, 11) else 1.0) for i, ms in enumerate(_latencies(4))]
    spread = list(np.random.default_rng(6).permutation(clustered))
    width = [high - low for low, high in (common.paired_ratio_interval(x, other, 20, percentile=95)
                                          for x in (clustered, spread))]
    assert width[0] > 1.5 * width[1]


def test_too_few_blocks_give_no_interval_and_unequal_runs_are_refused():
    assert common.paired_ratio_interval(_latencies(1, 180), _latencies(2, 180), 20, percentile=50) is None
    with pytest.raises(ValueError):
        common.paired_ratio_interval(_latencies(1, 400), _latencies(2, 380), 20, percentile=50)


def test_a_report_says_each_intervals_ratio_or_that_there_were_too_few_blocks():
    a, b = [11.0 + i % 5 for i in range(400)], [10.0 + i % 5 for i in range(400)]
    said = common.ratio_intervals(a, b, 20)
    assert said.startswith("p50 1.") and ", p95 1." in said and ", p99 1." in said
    assert common.ratio_intervals(a[:100], b[:100], 20) == f"none: fewer than {common.MIN_BOOTSTRAP_BLOCKS} blocks"
    assert common.by_process({"postgres": 4.0, "python3.11": 17.25}) == "python3.11 17.2, postgres 4.0"
