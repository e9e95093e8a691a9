"""TidalScheduler: batch tokens fill what online traffic leaves free, every step.

Loaded by a stock vLLM with ``--scheduling-policy priority --scheduler-cls
tidal_engine.scheduler.TidalScheduler --no-async-scheduling`` (or ``TidalAsyncScheduler`` with
``--async-scheduling``).
It is a thin gate around the stock ``Scheduler.schedule()``; the scheduling
itself (budgets, chunked prefill, KV allocation, preemption) stays vLLM's:

- online requests (priority 0) are never hidden, parked or evicted, and their
  whole demand is inside the step's token budget;
- batch requests (priority >= 1) get at most the cap X per step: the largest
  batch token count the latency model (``latency.py``) predicts to fit the
  budget ``tbt_slo × (1 − guard)``, or a static share of τ
  (max_num_batched_tokens) while online traffic is present and the model's R²
  is too low, or all of τ without online traffic;
- with ``TIDAL_SCHED_ALPHA_SET`` the budget is relative instead
  (``step_budget.py``): ``alpha_set × T̂(the step's online work alone)``, each
  running batch request priced by what it adds (its own KV read included),
  those that do not fit parked, and one parked longer than
  ``TIDAL_SCHED_MAX_PARK_SECONDS`` preempted so that its KV is freed;
- the KV guardband (``guardband.py``) stops batch admission above KV usage
  1 − H and evicts the cheapest resident batch request above 1 − H/2;
- an online request never waits for a slot that batch holds: when online
  requests wait and every slot is taken, the cheapest running batch requests
  yield theirs (vLLM's priority orders only the waiting queue, issue #40004).

Each step runs in four phases, so that deciding and acting stay apart:

1. plan (``_plan``): read the queues and the KV pool, decide the cap, the
   token budget, whether batch may be admitted, which batch request to evict,
   which yield their slots to waiting online requests and which running batch
   requests sit the step out. Nothing is changed.
2. evict (``_evict``): preempt the chosen victim and the yielding requests
   through vLLM's own path.
3. gate (``_gated``): for the duration of the stock ``schedule()`` call, the
   token budget (``max_num_scheduled_tokens``) is online demand + X, running
   requests are ordered online first, the parked ones are out of
   ``self.running`` (the slot limit shrinks by as many, so they keep their
   slots), and batch requests that may not be admitted are hidden from
   ``self.waiting``. All are put back afterwards.
4. check and account (``_check``, ``_account``): assert the step stayed inside
   the plan's budget and everything taken out is back, then export what the
   step did (``metrics.py``).

Base classes. Pinned to vLLM 0.32.x, whose scheduler interface is not public.
``TidalScheduler`` subclasses the plain ``Scheduler``, which the engine drives
with async scheduling off: always on the CPU platform (``platforms/cpu.py:331``),
and on GPU builds with ``--no-async-scheduling``. GPU builds turn async
scheduling on by default, and vLLM only warns that a plugin derived from
``Scheduler`` then loses the overlap of scheduling with the forward pass (about
78% latency in vLLM PR #43724). ``TidalAsyncScheduler`` is the same gate on
``AsyncScheduler`` for those engines; only how it times a step differs
(docs/engine.md, "Which class when").

Settings come from ``config.load_scheduler_settings()`` (the ``TIDAL_SCHED_*`` variables alone,
inherited by the engine-core process), never from tidal_api or tidal_workers.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import time
import typing as t

import numpy as np
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from config import SchedulerSettings
from config import load_scheduler_settings
from tidal_engine.guardband import Guardband
from tidal_engine.guardband import Resident
from tidal_engine.guardband import cheapest
from tidal_engine.guardband import cheapest_first
from tidal_engine.host_time import HostFit
from tidal_engine.latency import LatencyModel
from tidal_engine.latency import batch_cap
from tidal_engine.metrics import Mode
from tidal_engine.metrics import SchedulerMetrics
from tidal_engine.step_budget import StepCost
from tidal_engine.step_budget import Work
from tidal_engine.step_budget import select
from tidal_engine.step_time import StepCosts
from tidal_engine.step_time import sequence_pairs
from tidal_engine.twin import load_profile

ONLINE_PRIORITY = 0
INFLATION_EWMA = 0.02  # weight of one cycle in the measured inflation (about 50 steps)
# Relative budget: a step with an online prompt waiting may take 1 + this × (α_set − 1) times its online work alone.
# Filled to α_set, such steps lengthen every waiting online prompt's TTFT as well as its own, and the queue amplifies
# it: in the scheduler run in virtual time on the A6000 profile at 8 online requests/s (docs/engine.md), TTFT p50
# came out at 1.13× for TBT p50 1.107× at α_set 1.1; at 0.75 the two meet (1.108, 1.105) and the batch harvests
# 204 tokens/s where the decode steps' share alone harvested 177 at 1.10×.
PROMPT_STEP_SHARE = 0.75


def is_online(request: Request) -> bool:
    return bool(request.priority <= ONLINE_PRIORITY)


def waiting_online(queue: RequestQueue) -> list[Request]:
    """The online requests in a priority queue. They sort first: an O(1) peek answers the common case of none,
    and otherwise the queue's lazy ordered iteration stops at the first batch request."""
    if not queue or not is_online(queue.peek_request()):
        return []
    return list(itertools.takewhile(is_online, queue))


def running_demand(request: Request) -> int:
    """Tokens a running request asks for this step (the stock scheduler's formula)."""
    return max(int(request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens), 0)


def unscheduled_demand(request: Request) -> int:
    """Tokens a running request wanted and a step just left unscheduled: running_demand less the output
    placeholders, which under async scheduling are the next step's tokens, not this one's."""
    return max(int(request.num_tokens_with_spec - request.num_computed_tokens), 0)


def scheduled(requests: t.Mapping[str, Request], output: SchedulerOutput) -> t.Iterator[tuple[Request, int, int]]:
    """Each request ``output`` scheduled, with its tokens and its context before the step. Read before
    ``update_from_output`` moves the requests on: ``schedule()`` has already counted the step's tokens."""
    for req_id, num in output.num_scheduled_tokens.items():
        request = requests[req_id]
        yield request, num, request.num_computed_tokens - num


def step_totals(requests: t.Mapping[str, Request], output: SchedulerOutput) -> tuple[int, int, int]:
    """The step ``output`` scheduled as T̂ reads it: its tokens, their requests' context before it, their attention
    pairs."""
    tokens = context = pairs = 0
    for _, num, before in scheduled(requests, output):
        tokens, context, pairs = tokens + num, context + before, pairs + sequence_pairs(num, before)
    return tokens, context, pairs


def waiting_demand(request: Request) -> int:
    """Tokens a waiting request asks for, ignoring prefix-cache hits (an upper bound)."""
    return max(int(request.num_tokens - request.num_computed_tokens), 0)


@dataclasses.dataclass
class StepPlan:
    """One step: what the plan decided before the stock scheduler ran, then what the step did.

    Kept on the scheduler as ``last_plan`` for tests and metrics.
    """

    # Decided by _plan, before anything changes.
    mode: Mode  # the rule that set the cap: the latency model, a static share of τ, or no online traffic
    batch_cap: int  # X: batch tokens allowed this step
    token_budget: int  # online demand + X, at most τ: the stock scheduler's token budget for this step
    online_demand: int  # tokens online requests want: running ones exactly, waiting ones ignoring prefix hits
    kv_usage: float  # fraction of the KV pool in use when planning, before any eviction
    guardband: float  # H, after this step's online KV demand was folded into its EWMA
    admit_batch: bool  # kv_usage <= 1 − H and no slot yielded: waiting batch requests may be admitted this step
    context: int  # C: tokens resident in the KV of the running requests that stay (victim and yielding excluded)
    evict: str | None = None  # kv_usage > 1 − H/2: the resident batch request whose eviction loses least
    yielded: list[str] = dataclasses.field(default_factory=list)  # batch requests giving waiting online a slot
    parked: list[str] = dataclasses.field(default_factory=list)  # running batch requests beyond X: sit out
    released: list[str] = dataclasses.field(default_factory=list)  # parked too long: preempted, KV freed
    batch_order: list[str] = dataclasses.field(default_factory=list)  # relative budget: running batch, in its order
    alone_s: float | None = None  # relative budget: T̂ of the step's online work alone
    pool_short: bool | None = None  # relative budget, a step with an online prompt: it carried the pool and more
    forward_s: float | None = None  # relative budget: T̂ of what the step scheduled, for the host's fit
    requests: int = 0  # requests the step scheduled
    # Filled in by _gated and _account, from what the step did.
    hidden: list[str] = dataclasses.field(default_factory=list)  # waiting batch requests kept out (not admitted)
    online_scheduled: int = 0  # tokens the step scheduled for online requests
    batch_scheduled: int = 0  # tokens the step scheduled for batch requests
    online_deferred: int = 0  # online tokens still wanted after the step (chunked, no free slot or KV)
    online_preempted: list[str] = dataclasses.field(default_factory=list)  # by vLLM, with no batch left to take
    batch_waited: bool = False  # batch work waited while online traffic set the budget

    @property
    def batch_capped(self) -> bool:
        """Online traffic set a budget and batch reached its cap X: the step the cap exists for."""
        return self.mode is not Mode.NO_ONLINE and self.batch_scheduled >= self.batch_cap

    @property
    def batch_over_cap(self) -> int:
        """Batch tokens past X. Only online's unused reservation can supply them (an online prompt that hit the
        prefix cache needs less than its reserved demand); the step's total stays inside the budget."""
        return max(self.batch_scheduled - self.batch_cap, 0)


@dataclasses.dataclass
class SlackFill:
    """Batch tokens scheduled against cap tokens offered, over the steps in which online traffic set a budget
    and batch work waited: the slack the plugin exists to fill."""

    scheduled: int = 0
    offered: int = 0

    def add(self, scheduled: int, cap: int) -> None:
        self.scheduled += min(scheduled, cap)
        self.offered += cap

    @property
    def ratio(self) -> float | None:
        return self.scheduled / self.offered if self.offered else None


class TidalScheduler(Scheduler):
    def __init__(self, *args: t.Any, settings: SchedulerSettings | None = None, **kwargs: t.Any) -> None:
        super().__init__(*args, **kwargs)
        if self.policy != SchedulingPolicy.PRIORITY:
            raise ValueError(
                "TidalScheduler needs --scheduling-policy priority: it tells online from batch by priority"
            )
        s = settings or load_scheduler_settings()
        self.tau: int = self.max_num_scheduled_tokens
        self.budget_s = s.sched_budget_seconds
        self.r2_min = s.sched_r2_min
        self.static_cap = int(s.sched_static_cap_frac * self.tau)
        self.latency = LatencyModel(window=s.sched_window)
        self.alpha_set = s.sched_alpha_set  # 0: the absolute budget alone
        # the profile's T̂ as a table over the step's tokens (exact: the form is separable), for pricing in bulk
        self.profile_costs = (
            StepCosts.of(load_profile(s.sched_profile), self.tau) if s.sched_profile and self.alpha_set else None
        )
        self.max_park_s = s.sched_max_park_seconds
        self.guard = Guardband(s.sched_h_min, s.sched_h_max, s.sched_h_alpha)
        self.kv_capacity_tokens: int = self.kv_cache_config.num_blocks * self.block_size
        self.tidal_metrics = SchedulerMetrics()
        if s.sched_metrics_port:
            self.tidal_metrics.serve(s.sched_metrics_port, s.sched_metrics_host)
        self.last_plan: StepPlan | None = None
        self.slack_fill = SlackFill()
        self._parked_since: dict[str, float] = {}  # req_id -> when its current stretch of sitting out began
        self._ran_last: set[str] = set()  # batch requests scheduled in the last step
        # the last step with an online prompt carried every batch request with KV and had room for one more: the
        # pool is sized to what those steps carry (relative budget)
        self._pool_short = False
        # measured cycle ÷ the reference, smoothed (relative budget); also ι, the online concurrency the batch added
        self.inflation: float | None = None
        self.host_fit = HostFit()  # the host's time a cycle takes beyond T̂ (relative budget)
        self._cycle: tuple[StepPlan, float] | None = None  # the last budgeted step's plan and when it was scheduled
        if self.alpha_set:
            self.tidal_metrics.alpha_set.set(self.alpha_set)
        self._cached_tokens: dict[str, int] = {}  # req_id -> prefix-cache hit at its last admission
        self._step_started: float | None = None
        self.clock: t.Callable[[], float] = time.monotonic  # the step timer's clock; tests drive their own

    # --- one step: plan, evict, gate the stock schedule(), check, account ------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        started = self.clock()
        self._observe_cycle(started)
        plan = self._plan(started)
        self._evict(plan, started)
        with self._gated(plan):
            output = super().schedule(throttle_prefills)
        self._check(plan, output)
        self._account(plan, output, started)
        self._step_started = started
        if plan.forward_s is not None:
            self._cycle = plan, started
        return output

    def _observe_cycle(self, now: float) -> None:
        """The last budgeted step's cycle, from its schedule() to this one: its time beyond T̂ into the host's fit,
        and its time over the reference into ι. Only a busy engine's: with nothing running, the engine core may have
        waited for work in between."""
        last, self._cycle = self._cycle, None
        if last is None or not self.running:
            return
        plan, started = last
        assert plan.forward_s is not None
        cycle = now - started
        self.host_fit.observe(plan.requests, cycle - plan.forward_s, plan.forward_s)
        if plan.alone_s:
            sample = cycle / plan.alone_s
            prev = self.inflation
            self.inflation = sample if prev is None else prev + INFLATION_EWMA * (sample - prev)
            self.tidal_metrics.inflation.set(self.inflation)

    def _plan(self, now: float) -> StepPlan:
        """Decide the step from the queues and the KV pool; changes nothing but the guardband's EWMA."""
        online_running = [r for r in self.running if is_online(r)]
        online_waiting = waiting_online(self.waiting)
        online_demand = sum(map(running_demand, online_running)) + sum(map(waiting_demand, online_waiting))
        held = sum(r.num_tokens for r in online_running) + sum(r.num_tokens for r in online_waiting)
        h = self.guard.observe(held / self.kv_capacity_tokens)
        usage = float(self.get_kv_cache_usage())
        victim = self._cheapest_batch() if self.guard.must_evict(usage) else None
        staying = self.running if victim is None else [r for r in self.running if r.request_id != victim]
        yielded = self._slot_yields(staying, len(online_waiting))
        if yielded:
            staying = [r for r in staying if r.request_id not in yielded]
        released = self._park_expired(staying, now) if self.alpha_set else []
        if released:
            staying = [r for r in staying if r.request_id not in released]
        context = sum(r.num_computed_tokens for r in staying)
        admit = self.guard.admits(usage) and not yielded
        order: list[str] = []  # relative budget: the running batch requests that take part, in order
        pool_short: bool | None = None
        alone: float | None = None
        if not (online_running or online_waiting):
            mode, cap, parked = Mode.NO_ONLINE, self.tau, []
        elif self.alpha_set and (cost := self._step_cost()) is not None:
            chosen = select(
                cost,
                [Work(r.request_id, running_demand(r), r.num_computed_tokens) for r in online_running]
                + [Work(r.request_id, waiting_demand(r), r.num_computed_tokens) for r in online_waiting],
                [Work(r.request_id, running_demand(r), r.num_computed_tokens) for r in self._batch_order(staying)],
                self.alpha_set if not online_waiting else 1 + PROMPT_STEP_SHARE * (self.alpha_set - 1),
                self.budget_s,
                self.tau,
                chunk_allowed=not online_waiting,
                admit_room=admit and self._pool_short,
                concurrency_inflation=min(max(self.inflation or 1.0, 1.0), self.alpha_set),
                host=self.host_fit.host,
            )
            mode, cap, parked = Mode.RELATIVE, chosen.batch_tokens, list(chosen.parked)
            order, alone = list(chosen.scheduled), chosen.alone_s
            pool_short = chosen.carries_more if online_waiting else None
            # A waiting batch request starts only in the room the budget gave it. Otherwise the stock loop admits
            # one into any token the step leaves (a released request at once, a reservation an online request did
            # not use): a twin run at α 1.05 held 185 requests with KV beside a working set of 5-7.
            admit = admit and chosen.room > 0
        else:
            if (fit := self.latency.trusted(self.r2_min)) is not None:
                mode, cap = Mode.MODEL, batch_cap(fit, online_demand, context, self.budget_s, self.tau)
            else:
                mode, cap = Mode.STATIC, self.static_cap
            parked = beyond_cap(staying, cap, online_waits=bool(online_waiting))
        self.tidal_metrics.online_waiting.set(len(online_waiting))
        return StepPlan(
            mode=mode,
            batch_cap=cap,
            token_budget=max(min(self.tau, online_demand + cap), 1),
            online_demand=online_demand,
            kv_usage=usage,
            guardband=h,
            # Decided on the usage before any eviction, so an evicted request
            # is not re-admitted in the same step; nor is a yielding one.
            admit_batch=admit,
            context=context,
            evict=victim,
            yielded=yielded,
            parked=parked,
            released=released,
            batch_order=order,
            alone_s=alone,
            pool_short=pool_short,
        )

    def _step_cost(self) -> StepCost | None:
        """T̂ for the relative budget: the profile's form where the engine's profile is named (its knee is what a
        small alpha_set depends on, and a linear fit has none), else the trusted rolling fit; None without either."""
        if self.profile_costs is not None:
            return self.profile_costs.seconds
        fit = self.latency.trusted(self.r2_min)
        if fit is None:
            return None
        return lambda tokens, context, _pairs: fit.predict(tokens, context)

    def _forward_seconds(self, cost: StepCost, output: SchedulerOutput) -> float:
        """T̂ of what the step scheduled."""
        tokens, context, pairs = step_totals(self.requests, output)
        if not tokens:
            return 0.0
        one = (np.array([min(tokens, self.tau)]), np.array([context]), np.array([pairs]))
        return float(cost(*one)[0])

    def _batch_order(self, staying: list[Request]) -> list[Request]:
        """Running batch requests in the order they join a relative budget: the most urgent priority first (a batch
        that laxity escalated spends the budget before the others, never past it); within a priority a prefill in
        progress (the pool is short, or it would not have started), then those that ran last step (a working set
        finishes what it started), then the longest parked."""

        def key(r: Request) -> tuple[int, bool, bool, float]:
            ran = r.request_id in self._ran_last
            return r.priority, running_demand(r) == 1, not ran, self._parked_since.get(r.request_id, float("inf"))

        return sorted((r for r in staying if not is_online(r)), key=key)

    def _park_expired(self, staying: list[Request], now: float) -> list[str]:
        """Batch requests parked longer than TIDAL_SCHED_MAX_PARK_SECONDS: their KV is freed (preempted)."""
        return [
            r.request_id
            for r in staying
            if not is_online(r) and now - self._parked_since.get(r.request_id, now) > self.max_park_s
        ]

    def _batch_residents(self, running: list[Request]) -> list[Resident]:
        return [
            Resident(r.request_id, r.num_computed_tokens, self._cached_tokens.get(r.request_id, 0))
            for r in running
            if not is_online(r)
        ]

    def _cheapest_batch(self) -> str | None:
        victim = cheapest(self._batch_residents(self.running))
        return victim.request_id if victim is not None else None

    def _slot_yields(self, staying: list[Request], online_waiting: int) -> list[str]:
        """The running batch requests that give their slots to waiting online requests, cheapest first: as many
        as the online requests that would otherwise find every slot taken."""
        # The stock loop's admission count: running requests and paused streaming sessions, against
        # max_num_active_reqs (max_num_seqs unless set lower).
        free = self.max_num_active_reqs - len(staying) - self.num_waiting_for_streaming_input
        short = online_waiting - free
        if short <= 0:
            return []
        return [r.request_id for r in cheapest_first(self._batch_residents(staying))[:short]]

    def _evict(self, plan: StepPlan, now: float) -> None:
        """Preempt the plan's victim and yielding requests; vLLM reports them to the model runner in this step's
        preempted_req_ids, and they wait to be re-admitted like any preempted request."""
        if plan.evict is not None:
            self._preempt(plan.evict, now)
            self.tidal_metrics.evictions.inc()
        for req_id in plan.yielded:
            self._preempt(req_id, now)
            self.tidal_metrics.slot_yields.inc()
        for req_id in plan.released:
            self._preempt(req_id, now)
            self.tidal_metrics.park_releases.inc()

    def _preempt(self, req_id: str, now: float) -> None:
        request = self.requests[req_id]
        self.running.remove(request)
        self._preempt_request(request, now)

    @contextlib.contextmanager
    def _gated(self, plan: StepPlan) -> t.Iterator[None]:
        """The stock scheduler's view for one call: the plan's budget, online first, parked and hidden out."""
        hidden = [r for r in self.waiting if not is_online(r)] if not plan.admit_batch else []
        self.waiting.remove_requests(hidden)
        plan.hidden = [r.request_id for r in hidden]
        if plan.mode is not Mode.NO_ONLINE:
            # Online first; under a relative budget the batch in the order it was priced in, so that a chunk the
            # budget cut goes to the request it was priced for. Stable: arrival order kept otherwise.
            rank = {req_id: i for i, req_id in enumerate(plan.batch_order)}
            self.running.sort(key=lambda r: (not is_online(r), rank.get(r.request_id, len(rank))))
        parked = [self.requests[i] for i in plan.parked]
        for request in parked:
            self.running.remove(request)
        self.max_num_scheduled_tokens = plan.token_budget
        # Parked requests keep their slots: without this the stock loop would admit waiting requests into
        # them (up to max_num_active_reqs), and putting the parked ones back would overfill ``running``
        # (the stock scheduler asserts len(running) <= max_num_running_reqs at the end of the next step).
        self.max_num_active_reqs -= len(parked)
        self.max_num_running_reqs -= len(parked)
        try:
            yield
        finally:
            self.max_num_scheduled_tokens = self.tau
            self.max_num_active_reqs += len(parked)
            self.max_num_running_reqs += len(parked)
            self.running.extend(parked)
            for request in hidden:
                self.waiting.add_request(request)

    def _check(self, plan: StepPlan, output: SchedulerOutput) -> None:
        """The step's invariants; a failure is a bug in the gate, and stops the engine core like vLLM's own."""
        assert output.total_num_scheduled_tokens <= plan.token_budget <= self.tau, (
            f"scheduled {output.total_num_scheduled_tokens} tokens on a budget of {plan.token_budget} (τ {self.tau})"
        )
        assert self.max_num_scheduled_tokens == self.tau, "the token budget was not restored"
        if plan.parked:
            running = {r.request_id for r in self.running}
            assert running.issuperset(plan.parked), f"parked requests not restored: {set(plan.parked) - running}"
            assert not set(plan.parked) & set(output.num_scheduled_tokens), "a parked request was scheduled"
        if plan.hidden:
            waiting = {r.request_id for r in self.waiting}
            assert waiting.issuperset(plan.hidden), f"hidden requests not restored: {set(plan.hidden) - waiting}"

    def _account(self, plan: StepPlan, output: SchedulerOutput, now: float) -> None:
        for new in output.scheduled_new_reqs:
            self._cached_tokens[new.req_id] = new.num_computed_tokens
        for req_id in output.scheduled_cached_reqs.resumed_req_ids:
            self._cached_tokens[req_id] = (
                self.requests[req_id].num_computed_tokens - output.num_scheduled_tokens[req_id]
            )
        for req_id, num in output.num_scheduled_tokens.items():
            if is_online(self.requests[req_id]):
                plan.online_scheduled += num
            else:
                plan.batch_scheduled += num
        online_waiting = waiting_online(self.waiting)
        if plan.mode is not Mode.NO_ONLINE:  # else no online request was there to schedule
            plan.online_deferred = sum(unscheduled_demand(r) for r in self.running if is_online(r)) + sum(
                map(waiting_demand, online_waiting)
            )
        plan.online_preempted = sorted(
            i for i in output.preempted_req_ids if i in self.requests and is_online(self.requests[i])
        )
        batch_waits = bool(plan.parked) or len(self.waiting) > len(online_waiting)
        # Slack is budget left while online traffic sets one; without online
        # traffic there is no TBT budget to leave unfilled.
        plan.batch_waited = batch_waits and plan.mode is not Mode.NO_ONLINE
        m = self.tidal_metrics
        if plan.batch_waited:
            self.slack_fill.add(plan.batch_scheduled, plan.batch_cap)
            m.slack_offered_tokens.inc(plan.batch_cap)
            m.starved_slack_tokens.inc(max(plan.batch_cap - plan.batch_scheduled, 0))
            if (ratio := self.slack_fill.ratio) is not None:
                m.slack_fill_ratio.set(ratio)
        m.steps.inc()
        for counter, value in (
            (m.batch_tokens, plan.batch_scheduled),
            (m.online_tokens, plan.online_scheduled),
            (m.batch_over_cap_tokens, plan.batch_over_cap),
            (m.online_deferred_tokens, plan.online_deferred),
            (m.online_preempted, len(plan.online_preempted)),
            (m.capped_steps, int(plan.batch_capped)),
        ):
            if value:  # most are 0 on most steps: skip the counter's lock
                counter.inc(value)
        ran = {i for i in output.num_scheduled_tokens if not is_online(self.requests[i])}
        if plan.mode is Mode.RELATIVE and (cost := self._step_cost()) is not None:
            plan.forward_s, plan.requests = self._forward_seconds(cost, output), len(output.num_scheduled_tokens)
            m.host_step_seconds.set(self.host_fit.host.per_step)
            m.host_request_seconds.set(self.host_fit.host.per_request)
        if self.alpha_set:  # the order and the park bound of the relative budget; nothing else reads them
            for req_id in plan.parked:
                self._parked_since.setdefault(req_id, now)
            for req_id in (*ran, *plan.released, *plan.yielded, *([plan.evict] if plan.evict else [])):
                self._parked_since.pop(req_id, None)
            self._ran_last = ran
            if plan.pool_short is not None:
                self._pool_short = plan.pool_short
            m.batch_resident.set(sum(1 for r in self.running if not is_online(r)))
        m.working_set.set(len(ran))
        if plan.alone_s is not None:
            m.reference_step_seconds.set(plan.alone_s)
        m.batch_cap.set(plan.batch_cap)
        m.set_mode(plan.mode)
        m.guardband.set(plan.guardband)
        if self.latency.fit is not None:
            m.r2.set(self.latency.fit.r2)
        self.last_plan = plan

    # --- learning the step time ----------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> t.Any:  # vLLM's dict[int, EngineCoreOutputs]
        measured = self._measured_step(scheduler_output)
        if measured is not None and scheduler_output.total_num_scheduled_tokens > 0:
            plan, seconds = measured
            self.latency.observe(scheduler_output.total_num_scheduled_tokens, plan.context, seconds)
            if plan.batch_waited:
                self.tidal_metrics.starved_slack_seconds.inc(max(self.budget_s - seconds, 0.0))
        return super().update_from_output(scheduler_output, model_runner_output)

    def _measured_step(self, scheduler_output: SchedulerOutput) -> tuple[StepPlan, float] | None:
        """The plan of the step this output ends, and the step's seconds.

        Synchronous engine: schedule() -> execute_model() -> here, so the time
        since schedule() began is the step an online token waits for.
        """
        plan, started = self.last_plan, self._step_started
        self._step_started = None
        if plan is None or started is None:
            return None
        return plan, self.clock() - started

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> t.Any:
        # Every finished request passes here (stopped, aborted, length).
        self._cached_tokens.pop(request.request_id, None)
        self._parked_since.pop(request.request_id, None)
        return super()._free_request(request, delay_free_blocks)


class TidalAsyncScheduler(TidalScheduler, AsyncScheduler):
    """The same gate on vLLM's ``AsyncScheduler``, for an engine with async scheduling on (GPU builds' default).

    The MRO puts TidalScheduler's plan, evict, gate, check and account around AsyncScheduler's own steps
    (its output placeholders, its stale-output handling). Only the step timer differs: the engine core schedules
    step N+1 before step N's output arrives (its batch queue holds two steps), so schedule() to
    update_from_output() spans two steps, and ``last_plan`` is already step N+1's when step N's output comes.
    Step N's time is the interval since the previous update_from_output() call, the one that ended step N-1,
    and no longer than since step N was scheduled (an engine idle in between did not spend that time on it);
    it is charged to the plan made for that output.
    """

    def __init__(self, *args: t.Any, settings: SchedulerSettings | None = None, **kwargs: t.Any) -> None:
        super().__init__(*args, settings=settings, **kwargs)
        if not self.scheduler_config.async_scheduling:
            raise ValueError(
                "TidalAsyncScheduler needs async scheduling on; with --no-async-scheduling load TidalScheduler"
            )
        self._in_flight: collections.deque[tuple[SchedulerOutput, StepPlan, float]] = collections.deque()
        self._last_output_at: float | None = None

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        output = super().schedule(throttle_prefills)
        assert self.last_plan is not None and self._step_started is not None
        self._in_flight.append((output, self.last_plan, self._step_started))
        return output

    def _measured_step(self, scheduler_output: SchedulerOutput) -> tuple[StepPlan, float] | None:
        now = self.clock()
        previous, self._last_output_at = self._last_output_at, now
        # Outputs come back in the order they were scheduled; one that never came back is dropped here.
        while self._in_flight:
            output, plan, scheduled = self._in_flight.popleft()
            if output is scheduler_output:
                started = scheduled if previous is None else max(scheduled, previous)
                return plan, now - started
        return None


def beyond_cap(running: list[Request], cap: int, online_waits: bool) -> list[str]:
    """The running batch requests that sit this step out: those past the cap X in online-first running order.

    The last one that only partly fits is chunked by the token budget to what is left, unless online requests
    wait: the stock loop schedules waiting requests after all running ones, so that chunk would eat the budget
    kept for them.
    """
    remaining, parked = cap, []
    for request in (r for r in running if not is_online(r)):
        demand = running_demand(request)
        if demand <= remaining:
            remaining -= demand
        elif remaining > 0 and not online_waits:
            remaining = 0
        else:
            parked.append(request.request_id)
    return parked
