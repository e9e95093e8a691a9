"""TidalScheduler: batch tokens fill what online traffic leaves free, every step.

Loaded by a stock vLLM with
``--scheduling-policy priority --scheduler-cls tidal_engine.scheduler.TidalScheduler``.
It is a thin gate around the stock ``Scheduler.schedule()``; the scheduling
itself (budgets, chunked prefill, KV allocation, preemption) stays vLLM's:

- online requests (priority 0) are never hidden, parked or evicted, and their
  whole demand is inside the step's token budget;
- batch requests (priority >= 1) get at most the cap X per step: the largest
  batch token count the latency model (``latency.py``) predicts to fit the
  budget ``tbt_slo × (1 − guard)``, or a static share of τ
  (max_num_batched_tokens) while online traffic is present and the model's R²
  is too low, or all of τ without online traffic;
- the KV guardband (``guardband.py``) stops batch admission above KV usage
  1 − H and evicts the cheapest resident batch request above 1 − H/2.

How the cap is enforced without forking ``schedule()``: for the duration of
the call, the token budget (``max_num_scheduled_tokens``) is set to online
demand + X, running requests are ordered online first, running batch requests
beyond X are parked out of ``self.running`` (the slot limit shrinks by as many,
so they keep their slots), and batch requests that may not be admitted are
hidden from ``self.waiting``. All are put back afterwards.

Base class. Pinned to vLLM 0.32.x, whose scheduler interface is not public. The
CPU platform forces ``async_scheduling=False`` (``platforms/cpu.py:331``), so
the engine drives a plain ``Scheduler`` and this class subclasses it. On GPU
builds async scheduling is on by default and vLLM warns that a plugin derived
from ``Scheduler`` loses the async overlap (about 78% latency in vLLM PR
#43724); there the same gate must derive from ``AsyncScheduler``
(docs/engine.md, "GPU hosts").

Settings come from ``config.load_settings()`` (the ``TIDAL_SCHED_*`` variables,
inherited by the engine-core process), never from tidal_api or tidal_workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from config import Settings
from config import load_settings
from tidal_engine.guardband import Guardband
from tidal_engine.guardband import Resident
from tidal_engine.guardband import cheapest
from tidal_engine.latency import LatencyModel
from tidal_engine.latency import batch_cap
from tidal_engine.metrics import Mode
from tidal_engine.metrics import SchedulerMetrics

ONLINE_PRIORITY = 0


def is_online(request: Request) -> bool:
    return request.priority <= ONLINE_PRIORITY


def waiting_online(queue) -> list[Request]:
    """The online requests in a priority queue. They sort first, so the queue's
    lazy ordered iteration stops at the first batch request instead of sorting it all."""
    return list(itertools.takewhile(is_online, queue))


def running_demand(request: Request) -> int:
    """Tokens a running request asks for this step (the stock scheduler's formula)."""
    return max(request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens, 0)


def waiting_demand(request: Request) -> int:
    """Tokens a waiting request asks for, ignoring prefix-cache hits (an upper bound)."""
    return max(request.num_tokens - request.num_computed_tokens, 0)


@dataclasses.dataclass
class StepPlan:
    """What the gate decided for one step; kept on the scheduler for tests and metrics."""

    mode: Mode
    batch_cap: int  # X: batch tokens allowed this step
    token_budget: int  # online demand + X, at most τ
    online_demand: int
    kv_usage: float
    guardband: float  # H
    admit_batch: bool
    context: int  # C: tokens resident in the KV of running requests before the step
    evicted: str | None = None
    parked: list[str] = dataclasses.field(default_factory=list)  # running batch ids kept out
    hidden: list[str] = dataclasses.field(default_factory=list)  # waiting batch ids kept out
    online_scheduled: int = 0
    batch_scheduled: int = 0
    batch_waited: bool = False  # batch work waited while online traffic set the budget


class TidalScheduler(Scheduler):
    def __init__(self, *args, settings: Settings | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.policy != SchedulingPolicy.PRIORITY:
            raise ValueError(
                "TidalScheduler needs --scheduling-policy priority: it tells online from batch by priority"
            )
        s = settings or load_settings()
        self.tau = self.max_num_scheduled_tokens
        self.budget_s = s.sched_budget_seconds
        self.r2_min = s.sched_r2_min
        self.static_cap = int(s.sched_static_cap_frac * self.tau)
        self.latency = LatencyModel(window=s.sched_window)
        self.guard = Guardband(s.sched_h_min, s.sched_h_max, s.sched_h_alpha)
        self.kv_capacity_tokens = self.kv_cache_config.num_blocks * self.block_size
        self.tidal_metrics = SchedulerMetrics()
        if s.sched_metrics_port:
            self.tidal_metrics.serve(s.sched_metrics_port, s.sched_metrics_host)
        self.last_plan: StepPlan | None = None
        self._cached_tokens: dict[str, int] = {}  # req_id -> prefix-cache hit at its last admission
        self._step_started: float | None = None
        self._fill = [0, 0]  # batch tokens scheduled, cap tokens offered, over steps in which batch waited

    # --- the gate around the stock schedule() -------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        started = time.monotonic()
        plan = self._plan(started)
        hidden = [r for r in self.waiting if not is_online(r)] if not plan.admit_batch else []
        self.waiting.remove_requests(hidden)
        parked = self._park_running(plan)
        plan.hidden = [r.request_id for r in hidden]
        plan.parked = [r.request_id for r in parked]
        self.max_num_scheduled_tokens = plan.token_budget
        # Parked requests keep their slots: without this the stock loop would admit waiting requests into
        # them (up to max_num_active_reqs), and putting the parked ones back would overfill ``running``
        # (the stock scheduler asserts len(running) <= max_num_running_reqs at the end of the next step).
        self.max_num_active_reqs -= len(parked)
        self.max_num_running_reqs -= len(parked)
        try:
            output = super().schedule(throttle_prefills)
        finally:
            self.max_num_scheduled_tokens = self.tau
            self.max_num_active_reqs += len(parked)
            self.max_num_running_reqs += len(parked)
            self.running.extend(parked)
            for request in hidden:
                self.waiting.add_request(request)
        batch_waits = bool(parked) or len(self.waiting) > len(waiting_online(self.waiting))
        self._account(plan, output, waiting_batch=batch_waits)
        self._step_started = started
        return output

    def _plan(self, now: float) -> StepPlan:
        online_running = [r for r in self.running if is_online(r)]
        online_waiting = waiting_online(self.waiting)
        online_demand = sum(map(running_demand, online_running)) + sum(map(waiting_demand, online_waiting))
        held = sum(r.num_tokens for r in online_running) + sum(r.num_tokens for r in online_waiting)
        h = self.guard.observe(held / self.kv_capacity_tokens)
        usage = self.get_kv_cache_usage()
        evicted = self._evict_cheapest(now) if self.guard.must_evict(usage) else None
        context = sum(r.num_computed_tokens for r in self.running)
        if not (online_running or online_waiting):
            mode, cap = Mode.NO_ONLINE, self.tau
        elif (fit := self.latency.trusted(self.r2_min)) is not None:
            mode = Mode.MODEL
            cap = batch_cap(fit, online_demand, context, self.budget_s, self.tau)
        else:
            mode, cap = Mode.STATIC, self.static_cap
        self.tidal_metrics.online_waiting.set(len(online_waiting))
        return StepPlan(
            mode=mode,
            batch_cap=cap,
            token_budget=max(min(self.tau, online_demand + cap), 1),
            online_demand=online_demand,
            kv_usage=usage,
            guardband=h,
            # Decided on the usage before any eviction, so an evicted request
            # is not re-admitted in the same step.
            admit_batch=self.guard.admits(usage),
            context=context,
            evicted=evicted,
        )

    def _park_running(self, plan: StepPlan) -> list[Request]:
        """Order ``self.running`` online first and take out batch requests beyond the cap."""
        if plan.mode is Mode.NO_ONLINE:
            return []
        self.running.sort(key=lambda r: not is_online(r))  # stable: arrival order kept within each class
        online_waits = bool(self.waiting) and is_online(self.waiting.peek_request())
        remaining, parked = plan.batch_cap, []
        for request in [r for r in self.running if not is_online(r)]:
            demand = running_demand(request)
            if demand <= remaining:
                remaining -= demand
            elif remaining > 0 and not online_waits:
                # Last in the running order: the token budget chunks it to what is left.
                remaining = 0
            else:
                # A partial chunk here would eat the budget kept for waiting
                # online requests, which the stock loop schedules after all
                # running ones.
                parked.append(request)
        for request in parked:
            self.running.remove(request)
        return parked

    def _evict_cheapest(self, now: float) -> str | None:
        residents = [
            Resident(r.request_id, r.num_computed_tokens, self._cached_tokens.get(r.request_id, 0))
            for r in self.running
            if not is_online(r)
        ]
        victim = cheapest(residents)
        if victim is None:
            return None
        request = self.requests[victim.request_id]
        self.running.remove(request)
        # Reported to the model runner through this step's preempted_req_ids.
        self._preempt_request(request, now)
        self.tidal_metrics.evictions.inc()
        return victim.request_id

    def _account(self, plan: StepPlan, output: SchedulerOutput, waiting_batch: bool) -> None:
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
        # Slack is budget left while online traffic sets one; without online
        # traffic there is no TBT budget to leave unfilled.
        plan.batch_waited = waiting_batch and plan.mode is not Mode.NO_ONLINE
        if plan.batch_waited:
            self._fill[0] += min(plan.batch_scheduled, plan.batch_cap)
            self._fill[1] += plan.batch_cap
            self.tidal_metrics.slack_offered_tokens.inc(plan.batch_cap)
            self.tidal_metrics.starved_slack_tokens.inc(max(plan.batch_cap - plan.batch_scheduled, 0))
            if self._fill[1]:
                self.tidal_metrics.slack_fill_ratio.set(self._fill[0] / self._fill[1])
        m = self.tidal_metrics
        m.steps.inc()
        m.batch_cap.set(plan.batch_cap)
        m.set_mode(plan.mode)
        m.guardband.set(plan.guardband)
        if self.latency.fit is not None:
            m.r2.set(self.latency.fit.r2)
        self.last_plan = plan

    # --- learning the step time ----------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput):
        # Synchronous engine: schedule() -> execute_model() -> here, so the time
        # since schedule() began is the step an online token waits for.
        plan, started = self.last_plan, self._step_started
        if plan is not None and started is not None and scheduler_output.total_num_scheduled_tokens > 0:
            seconds = time.monotonic() - started
            self.latency.observe(scheduler_output.total_num_scheduled_tokens, plan.context, seconds)
            if plan.batch_waited:
                self.tidal_metrics.starved_slack_seconds.inc(max(self.budget_s - seconds, 0.0))
        self._step_started = None
        return super().update_from_output(scheduler_output, model_runner_output)

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        # Every finished request passes here (stopped, aborted, length).
        self._cached_tokens.pop(request.request_id, None)
        return super()._free_request(request, delay_free_blocks)
