"""TidalAsyncScheduler driven in-process on vLLM's real AsyncScheduler class, in the engine core's async order:
step N+1 is scheduled before step N's output is fed back (tests/support/engine_steps.py, ScheduleAhead)."""

from __future__ import annotations

import numpy as np
import pytest
from vllm.config import SchedulerConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from config import load_settings
from tests.support.engine_steps import ScheduleAhead
from tests.support.engine_steps import make_request
from tidal_engine.metrics import Mode
from tidal_engine.scheduler import TidalAsyncScheduler
from tidal_engine.scheduler import TidalScheduler
from tidal_engine.serve import ASYNC_SCHEDULER_CLS
from tidal_engine.serve import SCHEDULER_CLS
from tidal_engine.serve import EngineOptions

TAU = 2048


def settings(**changes):
    return load_settings().replace(sched_metrics_port=0, **changes)


@pytest.fixture
def make_async(make_scheduler):
    def make(**kwargs) -> TidalAsyncScheduler:
        kwargs.setdefault("settings", settings())
        return make_scheduler(TidalAsyncScheduler, async_scheduling=True, **kwargs)

    return make


def test_it_is_vllms_async_scheduler_and_refuses_a_synchronous_engine(make_async, make_scheduler):
    assert isinstance(make_async(), AsyncScheduler)
    with pytest.raises(ValueError, match="--no-async-scheduling load TidalScheduler"):
        make_scheduler(TidalAsyncScheduler, settings=settings())


def test_the_cap_holds_and_online_decodes_every_step_under_schedule_ahead(make_async):
    s = make_async()
    engine = ScheduleAhead(s)
    for i in range(6):
        s.add_request(make_request(f"batch-{i}", 900, priority=5, max_tokens=40))
    engine.step()
    assert s.last_plan.mode is Mode.NO_ONLINE and s.last_plan.batch_scheduled == TAU

    s.add_request(make_request("online", 300, priority=0, max_tokens=12))
    out = engine.step()  # scheduled while the step before it is still in flight
    assert s.last_plan.mode is Mode.STATIC
    assert out.num_scheduled_tokens["online"] == 300
    assert 0 < s.last_plan.batch_scheduled <= TAU // 4
    assert s.last_plan.parked
    decoded = 0
    while "online" in s.requests:
        out = engine.step()
        plan = s.last_plan
        assert out.total_num_scheduled_tokens <= plan.token_budget
        assert plan.batch_scheduled <= plan.batch_cap
        assert not set(plan.parked) & set(out.num_scheduled_tokens)
        assert "online" not in out.preempted_req_ids
        if "online" in out.num_scheduled_tokens:
            assert out.num_scheduled_tokens["online"] == 1  # a decode token with the previous one still in flight
            decoded += 1
    engine.drain()
    assert decoded == 11  # the prompt's step sampled the first of its 12 tokens; no step past max_tokens
    assert all(f"batch-{i}" in s.requests for i in range(6))  # parked, not dropped


def fixed_h(h: float):
    return settings(sched_h_min=h, sched_h_max=h)


def test_eviction_takes_the_cheapest_while_its_last_step_is_in_flight(make_async):
    """The victim's previous step is still in flight when it is evicted: its late output is dropped as stale,
    it is not re-admitted in the step that evicted it, and it finishes later like any preempted request."""
    # 100 blocks of 16 tokens; H = 0.3: admission stops above 70%, eviction above 85%.
    s = make_async(num_blocks=101, settings=fixed_h(0.3).replace(sched_static_cap_frac=1.0))
    engine = ScheduleAhead(s)
    prefix = [7] * 512
    s.add_request(make_request("warm", prefix + [9], priority=1, max_tokens=1))
    while "warm" in s.requests or engine.in_flight:
        engine.step() if "warm" in s.requests else engine.drain()
    s.add_request(make_request("cached", prefix + [8] * 88, priority=1, max_tokens=50))
    s.add_request(make_request("b", 400, priority=1, max_tokens=50))
    s.add_request(make_request("c", 420, priority=1, max_tokens=50))
    s.add_request(make_request("live", 16, priority=0, max_tokens=50))
    first = engine.step()
    assert {"cached", "b", "c", "live"} <= set(first.num_scheduled_tokens)
    assert s.get_kv_cache_usage() > 0.85

    out = engine.step()  # planned with `first` still in flight
    assert s.last_plan.evict == "cached"
    assert out.preempted_req_ids == {"cached"}
    assert {r.request_id for r in s.running} == {"b", "c", "live"}
    assert "cached" in s.last_plan.hidden  # not re-admitted in the step that evicted it
    assert "cached" not in out.num_scheduled_tokens
    for _ in range(400):
        if not s.requests:
            break
        engine.step() if s.has_requests() else engine.drain()
    engine.drain()
    assert not s.requests  # every request, the evicted one included, finished


def test_every_step_stays_inside_its_plan_under_schedule_ahead(make_async):
    """Random online and batch arrivals on a small pool, schedule-ahead order: the sync class's identities hold."""
    s = make_async(num_blocks=301, max_num_seqs=8)
    engine = ScheduleAhead(s)
    rng = np.random.default_rng(18)
    batch = online = capped = evictions = yields = 0
    for step in range(300):
        if rng.random() < 0.3:
            size = int(rng.integers(8, 80))
            s.add_request(make_request(f"online-{step}", size, priority=0, max_tokens=int(rng.integers(1, 16))))
        if rng.random() < 0.2:
            size = int(rng.integers(200, 1200))
            s.add_request(make_request(f"batch-{step}", size, priority=int(rng.integers(1, 100)), max_tokens=16))
        out = engine.step()
        plan = s.last_plan
        assert out.total_num_scheduled_tokens == plan.online_scheduled + plan.batch_scheduled <= plan.token_budget
        assert plan.online_scheduled <= plan.online_demand
        assert plan.batch_scheduled <= plan.batch_cap + (plan.online_demand - plan.online_scheduled)
        assert not set(plan.parked) & set(out.num_scheduled_tokens)
        assert set(plan.parked) <= {r.request_id for r in s.running}
        assert not plan.online_preempted and not {i for i in out.preempted_req_ids if i.startswith("online")}
        batch += plan.batch_scheduled
        online += plan.online_scheduled
        capped += plan.batch_capped
        evictions += plan.evict is not None
        assert set(plan.yielded) <= set(out.preempted_req_ids) and not any(i.startswith("online") for i in plan.yielded)
        yields += len(plan.yielded)
    engine.drain()
    sample = s.tidal_metrics.registry.get_sample_value
    assert sample("tidal_sched_batch_tokens_total") == batch > 0
    assert sample("tidal_sched_online_tokens_total") == online > 0
    assert sample("tidal_sched_capped_steps_total") == capped > 0  # the cap bound, not vacuous
    assert sample("tidal_sched_evictions_total") == evictions
    assert sample("tidal_sched_slot_yields_total") == yields
    print(f"evictions {evictions}, slot yields {yields}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_step_is_timed_between_consecutive_outputs_and_charged_to_its_own_plan(make_async):
    s = make_async()
    s.clock = clock = Clock()
    observed: list[tuple[int, int, float]] = []
    s.latency.observe = lambda p, c, seconds: observed.append((p, c, seconds))
    engine = ScheduleAhead(s)
    s.add_request(make_request("a", 100, priority=1, max_tokens=30))
    s.add_request(make_request("online", 20, priority=0, max_tokens=30))

    step1 = engine.schedule()  # t = 0
    plan1 = s.last_plan
    clock.now = 1.0
    step2 = engine.schedule()  # t = 1: step 2 is planned before step 1's output arrives
    plan2 = s.last_plan
    assert plan2.context > plan1.context == 0  # step 2 sees step 1's tokens as resident
    clock.now = 10.0
    engine.feed()  # step 1 ends at t = 10: 10 s since it was scheduled (no output before it)
    clock.now = 10.5
    engine.schedule()  # step 3, t = 10.5
    clock.now = 25.0
    engine.feed()  # step 2 ends at t = 25: 15 s since step 1's output, not 24 s since it was scheduled
    assert observed == [
        (step1.total_num_scheduled_tokens, plan1.context, 10.0),
        (step2.total_num_scheduled_tokens, plan2.context, 15.0),
    ]
    clock.now = 26.0
    engine.feed()  # step 3 ends: 1 s after step 2's
    engine.drain()
    clock.now = 100.0  # the engine idles; then a new step is scheduled alone
    engine.schedule()
    clock.now = 100.25
    engine.feed()
    assert [seconds for *_, seconds in observed] == [10.0, 15.0, 1.0, 0.25]  # the idle time is no step's


def test_each_plugin_class_is_served_with_its_scheduling_mode():
    """`tidal engine serve` (EngineOptions) names each class with its flag, and vLLM resolves both names."""
    sync = EngineOptions(model="m", tidal_scheduler=True).argv(8000)
    assert sync[sync.index("--scheduler-cls") + 1] == SCHEDULER_CLS and "--no-async-scheduling" in sync
    gpu = EngineOptions(model="m", tidal_scheduler=True, cpu=False, async_scheduling=True).argv(8000)
    assert gpu[gpu.index("--scheduler-cls") + 1] == ASYNC_SCHEDULER_CLS and "--async-scheduling" in gpu
    assert "--no-async-scheduling" not in gpu
    stock = EngineOptions(model="m", cpu=False).argv(8000)
    assert not {"--scheduler-cls", "--async-scheduling", "--no-async-scheduling"} & set(stock)  # vLLM's choice
    with pytest.raises(ValueError, match="CPU platform"):
        EngineOptions(model="m", tidal_scheduler=True, async_scheduling=True)
    assert SchedulerConfig.default_factory(scheduler_cls=SCHEDULER_CLS).get_scheduler_cls() is TidalScheduler
    assert SchedulerConfig.default_factory(scheduler_cls=ASYNC_SCHEDULER_CLS).get_scheduler_cls() is TidalAsyncScheduler
