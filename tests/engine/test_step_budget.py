"""The relative step budget (tidal_engine/step_budget.py; pure), priced on the A6000 twin's own step-time form."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from tidal_engine.host_time import HostTime
from tidal_engine.step_budget import Work
from tidal_engine.step_budget import select
from tidal_engine.step_time import StepCosts
from tidal_engine.step_time import decode_seconds
from tidal_engine.step_time import sequence_pairs
from tidal_engine.step_time import step_seconds
from tidal_engine.twin import load_profile

pytestmark = pytest.mark.no_sql

A6000 = load_profile("qwen2.5-7b@a6000")
TAU = 2048
SLO = 0.160  # the absolute budget's default: 200 ms less its 20 % guard


cost = StepCosts.of(A6000, TAU).seconds


def decodes(prefix: str, n: int, context: int) -> list[Work]:
    return [Work(f"{prefix}-{i}", 1, context) for i in range(n)]


def choose(online, batch, alpha=1.2, *, chunk_allowed=True, admit_room=False, concurrency_inflation=1.0):
    return select(
        cost,
        online,
        batch,
        alpha,
        SLO,
        TAU,
        chunk_allowed=chunk_allowed,
        admit_room=admit_room,
        concurrency_inflation=concurrency_inflation,
    )


def test_the_budget_is_alpha_times_the_online_work_alone():
    online = decodes("on", 40, 600)
    chosen = choose(online, decodes("b", 200, 800))
    assert chosen.alone_s == pytest.approx(decode_seconds(A6000, 40, 600))
    assert chosen.budget_s == pytest.approx(1.2 * chosen.alone_s)
    assert chosen.predicted_s <= chosen.budget_s
    n = len(chosen.scheduled)
    # the working set is what the budget holds: one more batch decode would not fit
    with_one_more = step_seconds(
        A6000, 40 + n + 1, 40 * 600 + (n + 1) * 800, 40 * sequence_pairs(1, 600) + (n + 1) * sequence_pairs(1, 800)
    )
    assert with_one_more > chosen.budget_s
    assert 10 <= n <= 60 and len(chosen.parked) == 200 - n
    assert chosen.batch_tokens == n and chosen.room == 0


def test_the_working_set_grows_with_alpha():
    sizes = [len(choose(decodes("on", 40, 600), decodes("b", 300, 800), alpha).scheduled) for alpha in (1.1, 1.5, 2.0)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_the_table_prices_steps_exactly_as_the_twin_paces_them():
    rng = np.random.default_rng(5)
    tokens, context, pairs = rng.integers(0, TAU + 1, 500), rng.integers(0, 200_000, 500), rng.integers(0, 10**8, 500)
    exact = [step_seconds(A6000, int(p), int(c), int(q)) for p, c, q in zip(tokens, context, pairs)]
    assert np.allclose(cost(tokens, context, pairs), exact, rtol=1e-12, atol=1e-15)


def test_one_that_cannot_fit_even_alone_is_set_aside_and_holds_nobody_up():
    online = decodes("on", 8, 400)
    huge = Work("long-context", 1, 200_000)  # its KV read alone would overrun the budget
    chosen = choose(online, [huge, Work("short", 1, 100)], alpha=1.1)
    assert chosen.parked == ("long-context",) and chosen.scheduled == ("short",)


def test_the_longest_run_in_order_takes_part_and_nobody_overtakes():
    """The scheduler's order is urgency, then the working set, then the longest parked: a cheap request behind the
    first one that does not fit waits its turn rather than jump it."""
    online = decodes("on", 8, 400)
    batch = [*decodes("first", 3, 1000), Work("big", 1, 12_000), *decodes("cheap", 3, 100)]  # big fits alone
    chosen = choose(online, batch, alpha=1.05)
    assert chosen.scheduled == ("first-0", "first-1", "first-2")
    assert chosen.parked == ("big", "cheap-0", "cheap-1", "cheap-2")
    assert choose(online, [Work("big", 1, 12_000)], alpha=1.05).scheduled == ("big",)


def test_online_is_never_held_back_and_batch_gets_nothing_when_online_alone_fills_the_ceiling():
    online = [Work("prompt", 2000, 0)]  # a long online prompt: its step alone is over the absolute ceiling
    chosen = choose(online, decodes("b", 5, 100), alpha=1.5)
    assert chosen.alone_s > SLO and chosen.budget_s == chosen.alone_s
    assert chosen.scheduled == () and len(chosen.parked) == 5 and chosen.batch_tokens == 0


def test_a_prefill_in_progress_takes_the_chunk_that_fits_unless_online_waits():
    online = decodes("on", 20, 500)
    prefill = Work("prefill", 1500, 512)
    chosen = choose(online, [prefill, Work("after", 1, 100)], alpha=1.5)
    assert chosen.scheduled == ("prefill",) and chosen.parked == ("after",)  # the chunk spent the budget
    assert 0 < chosen.batch_tokens < 1500 and chosen.predicted_s <= chosen.budget_s
    waits = choose(online, [prefill, Work("after", 1, 100)], alpha=1.5, chunk_allowed=False)
    assert waits.scheduled == ("after",) and waits.parked == ("prefill",)


def test_a_short_pool_prefills_first_where_no_online_prompt_waits():
    """In a decode step a new prompt's chunk goes before the decodes: its room is a few decodes, and after them
    there would be none left for the pool to grow to what the prompt steps carry."""
    online = decodes("on", 20, 500)
    first = choose(online, decodes("b", 3, 500), alpha=1.5, admit_room=True)
    alone = choose(online, [], alpha=1.5, admit_room=True)
    assert first.room == alone.room > 0  # the room is what the step has beside its online work alone
    assert first.batch_tokens == len(first.scheduled) + first.room and first.predicted_s <= first.budget_s
    assert choose(online, decodes("b", 3, 500), alpha=1.5).room == 0  # admission closed (the KV guardband)
    # a prefill in progress goes on first instead: no new prompt beside it
    going = choose(online, [Work("prefill", 700, 100), *decodes("b", 3, 500)], alpha=1.5, admit_room=True)
    assert going.room == 0 and going.scheduled[0] == "prefill"


def test_where_an_online_prompt_waits_the_decodes_go_first_and_a_parked_one_keeps_the_room_shut():
    """A chunk there would take the online prompt's tokens (the stock loop schedules running requests first), so
    what the decodes leave is room for a new prompt, and only once every running batch request took part."""
    online = [*decodes("on", 20, 500), Work("on-prompt", 300, 0)]
    chosen = choose(online, decodes("b", 3, 500), alpha=1.5, chunk_allowed=False, admit_room=True)
    assert len(chosen.scheduled) == 3 and chosen.room > 0 and chosen.batch_tokens == 3 + chosen.room
    crowded = choose(online, decodes("b", 300, 500), alpha=1.5, chunk_allowed=False, admit_room=True)
    assert crowded.parked and crowded.room == 0 and crowded.batch_tokens == len(crowded.scheduled)
    # a request set aside (it cannot fit even alone) does not hold the room shut
    aside = choose(
        online,
        [*decodes("b", 3, 500), Work("long-context", 1, 400_000)],
        alpha=1.5,
        chunk_allowed=False,
        admit_room=True,
    )
    assert aside.parked == ("long-context",) and aside.room > 0


def test_a_step_tells_whether_it_carries_the_whole_pool_and_one_more():
    """What sizes the pool: a step with an online prompt that took every batch request and had room for another."""
    online = [*decodes("on", 20, 500), Work("on-prompt", 300, 0)]
    sizes = range(1, 120)
    carried = [choose(online, decodes("b", n, 800), alpha=1.2, chunk_allowed=False) for n in sizes]
    most = max(n for n, c in zip(sizes, carried, strict=True) if not c.parked)  # the most the step carries
    assert [c.carries_more for c in carried] == [n < most for n in sizes]
    assert not choose(online, decodes("b", 300, 800), alpha=1.2, chunk_allowed=False).carries_more
    assert choose(online, [], alpha=1.2, chunk_allowed=False).carries_more  # an empty pool is short


def test_every_selection_stays_inside_its_budget_and_tau():
    rng = random.Random(3)
    for _ in range(200):
        online = [Work(f"on-{i}", rng.choice([1, 1, 1, rng.randint(2, 900)]), rng.randint(0, 3000)) for i in range(8)]
        batch = [Work(f"b-{i}", rng.choice([1, 1, rng.randint(2, 1500)]), rng.randint(0, 3000)) for i in range(60)]
        alpha = rng.uniform(1.05, 4.0)
        chosen = choose(online, batch, alpha, chunk_allowed=rng.random() < 0.5, admit_room=rng.random() < 0.5)
        assert chosen.predicted_s <= chosen.budget_s + 1e-12
        assert sum(w.tokens for w in online) + chosen.batch_tokens <= max(TAU, sum(w.tokens for w in online))
        assert sorted(chosen.scheduled + chosen.parked) == sorted(w.request_id for w in batch)


def test_a_step_is_priced_in_a_few_passes_whatever_its_size():
    """The plugin's time adds to every step the online user waits for: 200 batch decodes are priced in as many
    passes of T̂ over vectors as 20 are (at most), not one T̂ per request (the first version's per-request pricing took ~1 ms
    of a 26-ms step on this machine)."""
    rng = random.Random(1)
    online = [Work(f"on-{i}", 1, rng.randint(100, 2000)) for i in range(40)]
    passes = {}
    for size in (20, 200):
        calls: list[int] = []
        batch = [Work(f"b-{i}", 1, rng.randint(300, 3000)) for i in range(size)]
        select(functools.partial(counted, calls), online, batch, 1.5, SLO, TAU, chunk_allowed=True, admit_room=True)
        passes[size] = len(calls)
        assert max(calls) >= size  # whole vectors, every request at once
    assert max(passes.values()) <= 5, passes  # a fixed few: 200 parks some, so it prices no room (one fewer)


def counted(calls: list[int], tokens, context, pairs):
    """``cost``, noting the length of each vector it prices."""
    calls.append(len(tokens))
    return cost(tokens, context, pairs)


def test_the_reference_is_the_online_work_at_the_concurrency_it_would_have_alone():
    """By Little's law the online requests running grow with the step time the batch adds: at ι 1.1 the 44 decoding
    beside the batch would be 40 alone. The budget is α times that step, never under the online work itself."""
    online = [*decodes("on", 44, 600), Work("prompt", 300, 0)]
    at_once = choose(online, decodes("b", 200, 800), 1.1)
    scaled = choose(online, decodes("b", 200, 800), 1.1, concurrency_inflation=1.1)
    alone_40 = step_seconds(A6000, 40 + 300, 40 * 600, 40 * sequence_pairs(1, 600) + sequence_pairs(300, 0))
    assert at_once.alone_s > alone_40
    assert scaled.alone_s == pytest.approx(alone_40)
    assert scaled.budget_s == pytest.approx(1.1 * alone_40)
    assert len(scaled.scheduled) < len(at_once.scheduled)
    crowded = choose(decodes("on", 44, 600), [], 1.01, concurrency_inflation=1.5)
    assert crowded.budget_s == pytest.approx(crowded.predicted_s)  # α × the thinned step is under the online work


def test_the_hosts_time_is_charged_to_every_request_priced_the_reference_included():
    """A cycle takes T̂ plus the host's time (host_time.py): with 0.1 ms a request the budget is α × (T̂ alone + the
    host's time of the online requests alone), and each batch decode costs its KV read and its 0.1 ms, so fewer
    fit, and the whole step, host included, stays within the budget."""
    host = HostTime(0.004, 100e-6)
    online = [*decodes("on", 44, 600), Work("prompt", 300, 0)]
    batch = decodes("b", 200, 800)
    bare = choose(online, batch, 1.1, concurrency_inflation=1.1)
    hosted = select(
        cost, online, batch, 1.1, SLO, TAU, chunk_allowed=True, admit_room=False, concurrency_inflation=1.1, host=host
    )
    alone_40 = step_seconds(A6000, 40 + 300, 40 * 600, 40 * sequence_pairs(1, 600) + sequence_pairs(300, 0))
    assert hosted.alone_s == pytest.approx(alone_40 + host.seconds(41))  # 40 decodes alone and the prompt
    assert hosted.budget_s == pytest.approx(1.1 * hosted.alone_s)
    n = len(hosted.scheduled)
    forward = step_seconds(
        A6000, 44 + 300 + n, 44 * 600 + n * 800, 44 * sequence_pairs(1, 600) + sequence_pairs(300, 0) + n * 801
    )
    assert hosted.predicted_s == pytest.approx(forward + host.seconds(45 + n))
    assert hosted.predicted_s <= hosted.budget_s
    assert 0 < n < len(bare.scheduled)
