"""The AIMD rule that sets how many batch items a node may have in flight.

The engine is the mechanism (priority admission and preemption between
scrapes); this is the policy that keeps batch work from bloating the engine's
queue. One :meth:`AimdController.step` per scrape of the co-located vLLM:

* KV usage and online waiting are smoothed by an EWMA (``alpha``; the first
  good reading seeds it).
* Pressure: KV EWMA > ``kv_high``, or online-waiting EWMA, counted in whole
  requests (>= ``online_waiting_tolerance + 0.5``), above the tolerance, or
  ``preemptions_total`` rose since the last reading. Pressure halves the
  target (rounding down), at most once per ``period`` however often it is
  scraped, so one burst seen by several scrapes does not collapse the target.
* Growth: no pressure and KV EWMA < ``kv_low`` add one, at most once per
  period and not within a period of the last change, and only while the gate
  is in use (``batch_inflight >= target - 1``, O: requests at the engine): an idle node's target stays
  where it is instead of ballooning, so a burst of batch work starts from a
  target that was earned under load.
* Between ``kv_low`` and ``kv_high`` the target holds (hysteresis).
* A counter that falls (an engine restart) is a new baseline, not pressure.
* A failed reading (``ok=False``: unreachable, malformed or stale) closes the
  target to ``min_target`` at once and forgets the EWMAs; good readings then
  reopen it one step per period.

Waiting counts are whole requests: comparing the rounded count keeps an EWMA
that decays geometrically toward zero from holding a tolerance of 0 breached
for ever after a burst ends.

With ``alpha_set`` configured (``TIDAL_GATE_MODE=latency``) the target follows
online latency instead (:mod:`tidal_workers.policy.inflation`): KV pressure and
preemptions still halve it, online waiting does not, and between them the
target moves to the working set that keeps the engine's inter-token latency
within ``alpha_set`` of its online-alone reference (once per period; until the
reference is known, it grows by one as above). The reference is given, or the engine's profile's
(:mod:`tidal_workers.policy.profile_reference`), or fitted, in that order.
"""

from __future__ import annotations

import dataclasses
import typing as t

from tidal_workers.policy import inflation
from tidal_workers.policy.inflation import ItlFit
from tidal_workers.policy.profile_reference import Batch
from tidal_workers.policy.profile_reference import ProfileReference
from tidal_workers.policy.profile_reference import Work

if t.TYPE_CHECKING:
    from config import Settings
    from tidal_engine.step_time import Profile

HALVE = "halve"
GROW = "grow"
HOLD = "hold"
FAILSAFE = "failsafe"
CUT = "cut"  # latency mode: inflation over alpha_set
DECISIONS = (HALVE, GROW, HOLD, FAILSAFE, CUT)


#: The gate's ceiling while the engine has told neither its slots nor its KV capacity (the CPU engine's value).
UNKNOWN_ENGINE_CEILING = 4


def engine_ceiling(slots: int, kv_tokens: int | None, request_tokens: int, headroom: float) -> int | None:
    """Batch requests the engine can hold beside its online peak: its slots and the requests its KV cache fits,
    the smaller, less ``headroom`` of it (at least one); None while neither is known (``slots`` 0: unknown)."""
    bounds = [b for b in (slots, kv_tokens // request_tokens if kv_tokens else 0) if b > 0]
    if not bounds:
        return None
    return max(1, int(min(bounds) * (1 - headroom)))


@dataclasses.dataclass(frozen=True)
class AimdConfig:
    kv_high: float = 0.85
    kv_low: float = 0.70
    alpha: float = 0.5
    period: float = 1.0
    online_waiting_tolerance: float = 0.0
    min_target: int = 0
    max_target: int = 4
    initial_target: int = 1
    alpha_set: float | None = None  # latency mode: the inflation of online ITL the batch may cause
    reference_itl_s: float = 0.0  # latency mode: the online-alone ITL if known (> 0), else the profile's, else fitted
    profile: Profile | None = None  # latency mode: the engine's step-time profile, where known

    def __post_init__(self) -> None:
        if self.alpha_set is not None and self.alpha_set <= 1:
            raise ValueError(f"alpha_set must exceed 1, got {self.alpha_set}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not self.kv_low <= self.kv_high:
            raise ValueError(f"kv_low ({self.kv_low}) must not exceed kv_high ({self.kv_high})")
        if not 0 <= self.min_target <= self.initial_target <= self.max_target:
            raise ValueError(
                f"need 0 <= min_target <= initial_target <= max_target, got "
                f"{self.min_target}, {self.initial_target}, {self.max_target}"
            )

    @classmethod
    def from_settings(cls, settings: Settings, ceiling: int, profile: Profile | None = None) -> AimdConfig:
        """The rule as configured, under ``ceiling`` (``TIDAL_MAX_INFLIGHT``, or what the engine allows), with the
        engine's ``profile`` (``TIDAL_GATE_PROFILE``, loaded by the caller) for the latency mode's reference."""
        return cls(
            kv_high=settings.kv_high,
            kv_low=settings.kv_low,
            alpha=settings.ewma_alpha,
            period=settings.scrape_seconds,
            online_waiting_tolerance=settings.online_waiting_tolerance,
            min_target=min(settings.min_inflight, ceiling),
            max_target=ceiling,
            # a misconfigured start value is clamped rather than fatal: the bounds are what matter
            initial_target=min(max(settings.initial_inflight, settings.min_inflight), ceiling),
            alpha_set=settings.gate_alpha_set if settings.gate_mode == "latency" else None,
            reference_itl_s=settings.gate_reference_itl_ms / 1000,
            profile=profile,
        )


@dataclasses.dataclass(frozen=True)
class Observation:
    """One scrape of the engine, plus this node's own batch items in flight."""

    kv_usage: float  # 0..1
    waiting: float  # requests in the engine's waiting queue, online and batch alike
    running: float
    preemptions_total: float  # a counter
    batch_inflight: int  # O: this node's batch requests at the engine (POSTs sent and not yet answered)
    ok: bool = True  # False: unreachable, malformed or stale
    itl_seconds: float | None = None  # the engine's mean inter-token latency since the last reading; None: no token
    online_finished: Work | None = None  # requests the engine finished since the last reading, less this node's
    online_arrived: float | None = None  # requests whose first token the engine gave since then, less this node's
    batch: Batch = Batch()  # this node's batch work at the engine since the last reading, for the profile

    @classmethod
    def failed(cls, batch_inflight: int) -> Observation:
        return cls(0.0, 0.0, 0.0, 0.0, batch_inflight, ok=False)

    @property
    def online_waiting(self) -> float:
        """Waiting requests that cannot be ours: ``max(0, W - max(0, O - R))``.

        vLLM does not label its queue by origin. Of this node's O requests at
        the engine, at least ``O - R`` are not running (R running, ours or not),
        so at most ``max(0, O - R)`` of the W waiting are ours. The estimate errs
        toward online traffic: it is exact whenever our requests are all
        running, it never hides an online request behind one of ours that is in
        fact running, and it can only over-count (some of ours wait while online
        ones run), which closes the gate sooner. Other nodes do not share this
        engine, so their requests never appear here.
        """
        return max(0.0, self.waiting - max(0.0, self.batch_inflight - self.running))


@dataclasses.dataclass(frozen=True)
class AimdState:
    target: int
    kv_ewma: float | None = None
    waiting_ewma: float | None = None  # of online waiting
    preemptions_seen: float | None = None  # last counter value, the baseline for "rose"
    halved_at: float | None = None
    changed_at: float | None = None
    decision: str = HOLD  # what the last step decided
    fit: ItlFit = ItlFit()  # latency mode: ITL against the working set, for the reference
    profiled: ProfileReference = ProfileReference()  # latency mode with a profile: the load and the level
    reference_s: float | None = None  # latency mode: the online-alone ITL now believed
    inflation: float | None = None  # latency mode: smoothed ITL ÷ reference
    working_ewma: float | None = None  # latency mode: O smoothed alike, set whenever inflation is
    steered: float | None = None  # latency mode: the inflation the target last moved on (the profile's, or inflation)


class AimdController:
    def __init__(self, config: AimdConfig):
        self.config = config

    def initial(self) -> AimdState:
        return AimdState(target=self.config.initial_target)

    def step(self, state: AimdState, obs: Observation, now: float) -> AimdState:
        cfg = self.config
        if not obs.ok:
            return AimdState(target=cfg.min_target, halved_at=state.halved_at, changed_at=now, decision=FAILSAFE)

        kv = _ewma(state.kv_ewma, obs.kv_usage, cfg.alpha)
        waiting = _ewma(state.waiting_ewma, obs.online_waiting, cfg.alpha)
        preempted = state.preemptions_seen is not None and obs.preemptions_total > state.preemptions_seen
        pressure = kv > cfg.kv_high or waiting >= cfg.online_waiting_tolerance + 0.5 or preempted
        new = dataclasses.replace(
            state, kv_ewma=kv, waiting_ewma=waiting, preemptions_seen=obs.preemptions_total, decision=HOLD
        )

        if cfg.alpha_set is not None:
            new = self._track_inflation(new, obs)
            pressure = kv > cfg.kv_high or preempted  # online waiting is priced by the ITL it causes
        if pressure:
            if _elapsed(state.halved_at, now, cfg.period):
                target = max(cfg.min_target, state.target // 2)
                return dataclasses.replace(new, target=target, halved_at=now, changed_at=now, decision=HALVE)
            return new
        if cfg.alpha_set is not None and (steering := self._steering(new, cfg.alpha_set)) is not None:
            if not _elapsed(state.changed_at, now, cfg.period):
                return new
            working = t.cast(float, new.working_ewma)
            steered, wanted = steering
            new = dataclasses.replace(new, steered=steered)
            target = inflation.next_target(
                state.target, working, steered, cfg.alpha_set, cfg.min_target, cfg.max_target, wanted
            )
            if target == state.target:
                return new
            decision = CUT if target < state.target else GROW
            return dataclasses.replace(new, target=target, changed_at=now, decision=decision)
        in_use = obs.batch_inflight >= state.target - 1
        if kv < cfg.kv_low and in_use and state.target < cfg.max_target and _elapsed(state.changed_at, now, cfg.period):
            return dataclasses.replace(new, target=state.target + 1, changed_at=now, decision=GROW)
        return new

    def _steering(self, state: AimdState, alpha_set: float) -> tuple[float, float | None] | None:
        """The inflation the latency target moves on and the working set it wants (None: the rule's own O*), or
        None where it has none, and the KV rule moves it.

        With a profile: the profile's inflation at the smoothed working set and its O*, without a period's noise,
        unless the measured inflation reads far over the budget (a step of the online load the sums have not
        followed yet). That needs no level, so it also steers a light online load, where too few requests finish
        for the level and there is no reference to measure against: at 1 request a second the gate had none, grew
        by the KV rule to its ceiling (173 batch requests at the engine), and a step to 8/s met them all."""
        cfg, measured, working = self.config, state.inflation, state.working_ewma
        if cfg.profile is not None and working is not None and (measured or 0.0) <= alpha_set + inflation.GUARD:
            steering = state.profiled.steering(cfg.profile, working, alpha_set, cfg.max_target)
            if steering is not None:
                return steering
        return None if measured is None else (measured, None)

    def _track_inflation(self, state: AimdState, obs: Observation) -> AimdState:
        """The reading's ITL into the fit, the reference, and the smoothed inflation (unchanged without a token)."""
        cfg = self.config
        if obs.itl_seconds is None:
            return state
        fit = state.fit.add(float(obs.batch_inflight), obs.itl_seconds)
        profiled = state.profiled
        if cfg.profile is not None and obs.online_finished is not None:
            profiled = profiled.add(cfg.profile, obs.online_finished, obs.batch, obs.itl_seconds, obs.online_arrived)
        if cfg.reference_itl_s > 0:
            ref: float | None = cfg.reference_itl_s
        elif cfg.profile is not None:
            ref = profiled.reference(cfg.profile)
        else:
            ref = fit.reference()
        # once known, a reference outlives a stretch in which the working set held still and the fit lost its spread
        ref = ref or state.reference_s
        infl = None if ref is None else _ewma(state.inflation, obs.itl_seconds / ref, inflation.SMOOTHING)
        working = _ewma(state.working_ewma, float(obs.batch_inflight), inflation.SMOOTHING)
        return dataclasses.replace(
            state, fit=fit, profiled=profiled, reference_s=ref, inflation=infl, working_ewma=working
        )


def _ewma(prev: float | None, value: float, alpha: float) -> float:
    return value if prev is None else alpha * value + (1 - alpha) * prev


def _elapsed(since: float | None, now: float, period: float) -> bool:
    # a clock that stepped back must not freeze the controller until it catches up
    return since is None or not 0 <= now - since < period
