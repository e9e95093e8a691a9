"""The benchmark statistics: ABBA order, the bootstrap interval, the "no measurable change" rule, the refusal."""

from __future__ import annotations

import pytest

from tidal_workers.bench import stats

pytestmark = pytest.mark.no_sql


def test_abba_order_alternates_which_technique_goes_first():
    assert stats.abba_order(["A", "B"], 3) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B")]
    assert stats.abba_order(["A"], 2) == [(0, "A"), (1, "A")]


def test_bootstrap_interval_brackets_the_mean_within_the_values():
    interval = stats.bootstrap([1.0, 2.0, 3.0, 4.0])
    assert interval.value == 2.5
    assert 1.0 <= interval.low < 2.5 < interval.high <= 4.0
    assert interval.reps == 4


def test_identical_values_give_a_point_interval():
    interval = stats.bootstrap([0.7, 0.7, 0.7])
    assert (interval.value, interval.low, interval.high) == pytest.approx((0.7, 0.7, 0.7))
    assert stats.ratio_text(stats.bootstrap([1.0, 1.0, 1.0])).startswith(stats.NO_CHANGE)


def test_bootstrap_is_reproducible():
    assert stats.bootstrap([1.0, 5.0, 2.0, 8.0]) == stats.bootstrap([1.0, 5.0, 2.0, 8.0])


def test_the_t_interval_at_three_repetitions_reaches_past_the_extreme_ones_where_the_bootstrap_cannot():
    values = [1.0, 2.0, 3.0]
    t = stats.t_bounds(values)
    assert (t["t_low"], t["t_high"]) == pytest.approx((2.0 - 4.303 / 3**0.5, 2.0 + 4.303 / 3**0.5))
    boot = stats.bootstrap(values)
    assert t["t_low"] < 1.0 <= boot.low and boot.high <= 3.0 < t["t_high"]
    many = stats.t_bounds([float(i % 2) for i in range(40)])  # past 30 degrees of freedom: the normal's 1.96
    assert many["t_high"] == pytest.approx(0.5 + 1.96 * (10 / 39) ** 0.5 / 40**0.5)  # stdev of 20 zeros, 20 ones
    assert stats.t_bounds([1.0, 2.0]) == {"t_low": None, "t_high": None}


@pytest.mark.parametrize("values", [[], [1.2], [1.2, 1.3]])
def test_fewer_than_three_repetitions_are_refused(values):
    with pytest.raises(stats.TooFewRepetitions):
        stats.bootstrap(values)
    text = stats.figure_text(values, stats.ratio_text)
    assert text.startswith("refused:")
    assert "1.2" not in text  # the refusal never shows the number


def test_a_ratio_whose_interval_spans_one_is_no_measurable_change():
    assert stats.ratio_text(stats.bootstrap([0.8, 1.1, 1.3])).startswith(stats.NO_CHANGE)
    assert stats.ratio_text(stats.Interval(0.9, 0.85, 1.0, 3)).startswith(stats.NO_CHANGE)


def test_a_ratio_whose_interval_excludes_one_is_printed_with_its_interval():
    text = stats.ratio_text(stats.bootstrap([1.20, 1.25, 1.30]))
    assert text.startswith("1.25× [1.2")
    assert stats.NO_CHANGE not in text


def test_percentile_interpolates():
    assert stats.percentile([], 0.5) is None
    assert stats.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert stats.percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)


def test_a_ratio_of_means_resamples_each_arm_on_its_own():
    """Two versions run as whole commands are not paired: new ÷ old of the means, each arm resampled alone."""
    same = stats.ratio_of_means([4.0, 4.2, 3.8, 4.0], [4.0, 4.2, 3.8, 4.0])
    assert same.value == pytest.approx(1.0) and same.low < 1.0 < same.high and same.reps == 4
    assert stats.ratio_of_means([2.0] * 3, [3.0] * 5) == stats.Interval(1.5, 1.5, 1.5, 3)
    with pytest.raises(stats.TooFewRepetitions):
        stats.ratio_of_means([1.0, 1.0], [1.0, 1.0, 1.0])
