"""Laxity, urgency, priority and the floor, on a simulated clock."""

from __future__ import annotations

import itertools
import math

import pytest

from config import load_settings
from tidal_workers.policy.laxity import RateEstimator
from tidal_workers.policy.laxity import TokenBucket
from tidal_workers.policy.laxity import drain_seconds
from tidal_workers.policy.laxity import floor_engaged
from tidal_workers.policy.laxity import floor_slots
from tidal_workers.policy.laxity import laxity_seconds
from tidal_workers.policy.laxity import priority_for
from tidal_workers.policy.laxity import settled_since
from tidal_workers.policy.laxity import tenant_laxities
from tidal_workers.policy.laxity import urgency

SETTINGS = load_settings({})
WINDOW = 24 * 3600.0
H = SETTINGS.escalation_horizon_seconds  # 6 h
TAU = SETTINGS.rate_tau_seconds  # 15 min


def simulate(items, rate_at, step, until, tau=TAU):
    """A batch created at t=0 with a 24 h window, completing ``rate_at(t)`` items/s.

    The re-score looks every ``step`` seconds at the completed count (whole
    items) and yields (t, remaining, rate, laxity, urgency, priority).
    """
    est = RateEstimator(tau=tau).observe(0.0, 0)
    t, done_exact = 0.0, 0.0
    while t < until:
        t += step
        done_exact += rate_at(t) * step
        done = min(items, int(done_exact + 1e-9))
        est = est.observe(t, done)
        lax = laxity_seconds(WINDOW, t, items - done, est.rate)
        u = urgency(lax, H)
        yield t, items - done, est.rate, lax, u, priority_for(u)
        if done == items:
            return


def hm(seconds):
    minutes = round(seconds / 60)
    return minutes // 60, minutes % 60


def test_a1_small_batch_sits_at_100_and_finishes_in_about_7_minutes():
    """A1: 5,000 items at 12/s: laxity 24 h - 6 m 57 s = 23 h 53 m throughout."""
    trace = list(simulate(5_000, lambda t: 12.0, step=5.0, until=WINDOW))
    running = [row for row in trace if row[1] > 0]
    assert {row[5] for row in trace} == {100}
    assert {hm(row[3]) for row in running} == {(23, 53)}
    assert trace[-1][1] == 0 and 6.5 * 60 <= trace[-1][0] <= 7.5 * 60


def test_a2_large_batch_keeps_a_constant_laxity_for_two_hours():
    """A2: 86,000 items at 12/s: laxity 24 h - 1 h 59 m 27 s = 22 h 01 m, constant as it drains."""
    trace = list(simulate(86_000, lambda t: 12.0, step=5.0, until=WINDOW))
    running = [row for row in trace if row[1] > 0]
    assert {row[5] for row in trace} == {100}
    assert {hm(row[3]) for row in running} == {(22, 1)}
    assert max(row[3] for row in running) - min(row[3] for row in running) < 1.0  # seconds, over two hours
    assert 119 * 60 <= trace[-1][0] <= 120 * 60


def test_b_escalates_when_online_load_collapses_its_rate():
    """B: 157,300 items; 12/s for the first 30 min, then online load leaves it 0.06/s.

    These parameters were worked out (with the default tau = 15 min) so the
    published times come out: the estimate decays from 12/s toward 0.06/s,
    the drain grows as it does, and laxity crosses H = 6 h at 54.0 min,
    urgency 0.9 at 58.1 min and priority 1 at 58.5 min, 4.1% of the 24 h
    window. It holds at 100 until the crossing and stays pinned at 1.
    Re-scored every second; the published times are to 0.1 min (+-3 s).
    """
    trace = list(simulate(157_300, lambda t: 12.0 if t <= 1800 else 0.06, step=1.0, until=70 * 60))

    def first(pred):
        return next(row[0] for row in trace if pred(row))

    crossed = first(lambda r: r[3] < H)
    past_09 = first(lambda r: r[4] >= 0.9)
    pinned = first(lambda r: r[5] == 1)
    assert {r[5] for r in trace if r[0] < crossed} == {100}
    assert crossed == pytest.approx(54.0 * 60, abs=3)
    assert past_09 == pytest.approx(58.1 * 60, abs=3)
    assert pinned == pytest.approx(58.5 * 60, abs=3)
    assert {r[5] for r in trace if r[0] >= pinned} == {1}
    assert round(100 * pinned / WINDOW, 1) == 4.1


def test_no_rate_yet_means_the_whole_window_is_slack():
    est = RateEstimator().observe(100.0, 0)
    assert est.rate is None
    assert drain_seconds(5_000, est.rate) == 0.0
    assert priority_for(urgency(laxity_seconds(100.0 + WINDOW, 100.0, 5_000, est.rate), H)) == 100


def test_a_steady_rate_reads_true_from_the_first_interval():
    est = RateEstimator().observe(0.0, 0).observe(5.0, 60)
    assert est.rate == pytest.approx(12.0)


def test_a_batch_that_completes_nothing_reads_zero_after_one_time_constant():
    est = RateEstimator(tau=60.0).observe(0.0, 0)
    for t in range(5, 60, 5):
        est = est.observe(float(t), 0)
        assert est.rate is None
    est = est.observe(61.0, 0)
    assert est.rate == 0.0
    assert drain_seconds(10, est.rate) == math.inf
    assert priority_for(urgency(laxity_seconds(WINDOW, 61.0, 10, est.rate), H)) == 1


def test_bursts_average_out():
    """120 items landing at once every 10 s is 12/s, not alternately 0 and 120.

    Early on the gap after each burst weighs more (120 items in 69 s is
    10.4/s); after a couple of minutes the sawtooth is within 10%.
    """
    est, done = RateEstimator(tau=300.0).observe(0.0, 0), 0
    for t in range(1, 1201):
        if t % 10 == 0:
            done += 120
        est = est.observe(float(t), done)
        if t >= 120:
            assert est.rate == pytest.approx(12.0, rel=0.1)


def test_a_pause_makes_the_rate_fall_and_the_laxity_shrink():
    est, done = RateEstimator(tau=300.0).observe(0.0, 0), 0
    for t in range(1, 601):
        done += 12
        est = est.observe(float(t), done)
    rates, laxities = [], []
    for t in range(601, 1201, 10):  # stalled: nothing completes for ten minutes
        est = est.observe(float(t), done)
        rates.append(est.rate)
        laxities.append(laxity_seconds(WINDOW, float(t), 50_000, est.rate))
    assert all(b < a for a, b in itertools.pairwise(rates))
    assert all(b < a for a, b in itertools.pairwise(laxities))
    assert rates[-1] < 12.0 * math.exp(-1)  # two time constants in
    # and it climbs back when work resumes
    for t in range(1201, 1801):
        done += 12
        est = est.observe(float(t), done)
    assert est.rate > rates[-1] * 2


def test_the_estimator_ignores_a_repeated_time_and_rebases_on_a_falling_count():
    est = RateEstimator().observe(0.0, 0).observe(10.0, 100)
    assert est.observe(10.0, 200) is est  # no time has passed: nothing to learn
    rebased = est.observe(20.0, 5)  # the count was rebuilt lower: a new baseline, not a negative rate
    assert rebased.rate == est.rate and rebased.last_done == 5


def test_drain_seconds():
    assert drain_seconds(0, 0.0) == 0.0  # nothing left: done, whatever the rate
    assert drain_seconds(120, 12.0) == 10.0
    assert drain_seconds(120, None) == 0.0
    assert drain_seconds(120, 0.0) == math.inf


def test_urgency_is_zero_beyond_the_horizon_and_one_at_no_slack():
    assert urgency(2 * H, H) == 0.0
    assert urgency(H, H) == 0.0
    assert urgency(H / 2, H) == 0.5
    assert urgency(0.0, H) == 1.0
    assert urgency(-100.0, H) == 1.0
    assert urgency(-math.inf, H) == 1.0


def test_priority_for():
    assert priority_for(0.0) == 100
    assert priority_for(0.9) == 11  # round(100 - 89.1)
    assert priority_for(1.0) == 1
    assert priority_for(1.0, priority_min=5) == 5
    assert priority_for(1.0, priority_min=0) == 1  # 0 is online traffic's without sla_strict
    assert priority_for(1.0, sla_strict=True) == 0
    assert priority_for(0.99, sla_strict=True) == 2  # only a batch out of slack reaches parity


def test_floor_engaged():
    assert not floor_engaged(0.89)
    assert floor_engaged(0.9)
    assert floor_engaged(0.95, threshold=0.95)


def test_floor_slots_are_a_share_of_the_pool_and_at_least_one():
    assert floor_slots(196, 0.1) == 19
    assert floor_slots(4, 0.5) == 2
    assert floor_slots(4, 0.1) == 1
    assert floor_slots(10, 1.0) == 10


@pytest.mark.parametrize("rate", [None, 0.0, 0.5, 12.0])
@pytest.mark.parametrize("remaining", [0, 1, 5_000, 1_000_000])
def test_a_tenant_with_one_batch_reads_as_that_batch(rate, remaining):
    now = 1_000.0
    assert tenant_laxities(now, [(now + WINDOW, remaining)], rate) == [
        laxity_seconds(now + WINDOW, now, remaining, rate)
    ]


@pytest.mark.parametrize("rate", [None, 0.0, 0.01, 1.0, 12.0])
@pytest.mark.parametrize("parts", [[100_000], [1_000] * 100, [99_001] + [10] * 99 + [0] * 5, [1, 99_999]])
def test_items_split_into_batches_of_one_deadline_are_as_urgent_as_one_batch(rate, parts):
    """M2: 100 batches are no more urgent than one batch holding their items, whatever the rate."""
    whole = laxity_seconds(WINDOW, 0.0, sum(parts), rate)
    split = tenant_laxities(0.0, [(WINDOW, n) for n in parts], rate)
    assert all(lax == whole for lax, n in zip(split, parts) if n > 0)
    assert all(lax == WINDOW for lax, n in zip(split, parts) if n == 0)  # finished: holds up nobody


def test_a_late_batch_raises_the_batches_due_before_it_but_not_after():
    h = 3600.0
    batches = [(60 * h, 10), (1 * h, 10), (2 * h, 100_000)]  # any order in, the same order out
    late, first, last = tenant_laxities(0.0, batches, rate=1.0)
    assert first == last == 2 * h - 100_010  # the first is drained before the late one: it holds it up
    assert late == 60 * h - 100_020  # due after: on time at the tenant's rate, whatever is late before it
    assert urgency(first, H) == 1.0 and urgency(late, H) == 0.0


def test_settled_since_counts_each_batchs_rise_from_its_last_count():
    before = {"a": 10, "b": 5, "gone": 7}
    now = {"a": 25, "b": 3, "gone": 9, "new": 40}  # b's count was rebuilt lower; gone left with 9; new is a baseline
    assert settled_since(before, now) == 15 + 0 + 2
    assert settled_since({}, now) == 0


def test_a_split_tenant_draining_one_batch_at_a_time_never_escalates():
    """M2's scenario on the policy alone: 100 batches of 1,000 items, due together in 24 h, drained earliest
    deadline first at 12/s (the tenant's share: about 2 h 19 m of work). Judged batch by batch, every batch still
    waiting reads rate 0 after one tau and urgency 1; judged as the tenant's, none moves from priority 100."""
    tau, step, n, size = 900.0, 5.0, 100, 1_000
    done = [0] * n
    per_batch = [RateEstimator(tau=tau).observe(0.0, 0) for _ in range(n)]
    tenant = RateEstimator(tau=tau).observe(0.0, 0)
    t, seen, settled = 0.0, dict.fromkeys(range(n), 0), 0
    worst_per_batch, worst_tenant = 0.0, 0.0
    while sum(done) < n * size:
        t += step
        left = 12 * int(step)
        for i in range(n):  # earliest deadline first: ties by batch, as the queue orders them
            took = min(left, size - done[i])
            done[i], left = done[i] + took, left - took
        now = {str(i): done[i] for i in range(n)}
        settled += settled_since({str(i): c for i, c in seen.items()}, now)
        seen = dict(enumerate(done))
        tenant = tenant.observe(t, settled)
        per_batch = [est.observe(t, done[i]) for i, est in enumerate(per_batch)]
        open_ = [i for i in range(n) if done[i] < size]
        worst_per_batch = max(
            [worst_per_batch]
            + [urgency(laxity_seconds(WINDOW, t, size - done[i], per_batch[i].rate), H) for i in open_]
        )
        laxities = tenant_laxities(t, [(WINDOW, size - done[i]) for i in open_], tenant.rate)
        worst_tenant = max([worst_tenant] + [urgency(lax, H) for lax in laxities])
    assert worst_per_batch == 1.0  # the bug: a sibling waiting its turn reads as stalled
    assert worst_tenant == 0.0 and t < 2.5 * 3600


def test_token_bucket_admits_its_rate_and_no_more():
    bucket = TokenBucket(rate=2.0)
    assert bucket.take(0.0)
    assert not bucket.take(0.0)
    assert not bucket.take(0.4)
    assert bucket.take(0.5)
    admitted = sum(bucket.take(0.5 + i / 100) for i in range(1, 1001))  # polled at 100 Hz for 10 s
    assert admitted == 20


def test_token_bucket_burst_and_a_clock_that_steps_back():
    bucket = TokenBucket(rate=1.0, burst=3.0)
    assert [bucket.take(10.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(9.0)  # an earlier time refills nothing
    assert not bucket.take(10.5)
    assert bucket.take(11.0)
