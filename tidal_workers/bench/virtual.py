"""The real vLLM scheduler in virtual time (``tidal bench virtual``): each step takes the profile's T(P, C, pairs).

A twin point is ten minutes of wall time paced on this machine's two cores, and one run of it swings. Here the same
scheduler classes (vLLM's stock one for online alone and the vLLM-alone peer, TidalScheduler for inside) schedule the
same workload, but nothing runs: each step's time is ``step_time.step_seconds`` of what it scheduled, added to a
virtual clock, so a five-minute window takes about a minute and a seed gives the same figures every time. It leaves
out what the twin has besides the step: the host's time between steps, the API server, HTTP. So its inflations are
the scheduler's alone, and its figures are design evidence for a change to the plugin, never the product's claim
(that is the twin's, ``tidal bench frontier``).

Prompts are drawn tokens, so no two requests share a prefix-cache block, as distinct documents would not.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import typing as t

import numpy as np
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from config import Settings
from tidal_engine.scheduler import scheduled
from tidal_engine.scheduler import step_totals
from tidal_engine.step_time import Profile
from tidal_engine.step_time import step_seconds
from tidal_workers.bench import online
from tidal_workers.bench.oracle import TEMPLATE_TOKENS
from tidal_workers.bench.workload import OnlineLoad
from tidal_workers.bench.workload import Workload

BLOCK_SIZE = 16
VOCAB = 250  # token ids drawn below the tiny model's vocabulary
SAMPLED_TOKEN = 65
BATCH_PRIORITY = 100  # a worker's calmest batch priority (laxity escalates toward 1)


@functools.cache
def _block_hasher() -> t.Callable[[Request], list[t.Any]]:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    return get_request_block_hasher(BLOCK_SIZE, sha256)


def new_request(request_id: str, prompt_ids: list[int], priority: int, max_tokens: int) -> Request:
    """A request as the engine core builds it, generating exactly ``max_tokens`` (EOS ignored)."""
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        priority=priority,
        block_hasher=_block_hasher(),
    )


def model_output(scheduler: Scheduler, output: SchedulerOutput) -> ModelRunnerOutput:
    """The model runner's answer to a step: a token for every request the step took past its prompt (vLLM's
    ``is_prefill_chunk``, set by ``schedule()``)."""
    ids = list(output.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[i].is_prefill_chunk else [SAMPLED_TOKEN] for i in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=sampled)


def build_scheduler(
    cls: type[Scheduler],
    model_dir: str,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_blocks: int,
    settings: Settings | None = None,
    async_scheduling: bool = False,
) -> Scheduler:
    """A real vLLM scheduler (stock or Tidal's) built as the engine core builds it, over the tiny model's config and
    a KV pool of ``num_blocks`` blocks; no model runs."""
    import torch
    from vllm.config import CacheConfig
    from vllm.config import ModelConfig
    from vllm.config import SchedulerConfig
    from vllm.config import VllmConfig
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    init_none_hash(sha256)
    config = VllmConfig(
        model_config=ModelConfig(model=model_dir, dtype="float32", max_model_len=4096, seed=0),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=4096,
            policy="priority",
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
    )
    config.cache_config.num_gpu_blocks = num_blocks
    # The CPU platform turned async scheduling off while the config was built; a GPU build leaves it on.
    config.scheduler_config.async_scheduling = async_scheduling
    # The tiny model's attention: 2 KV heads of size 32.
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=32, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
    )
    extra = {"settings": settings} if settings is not None else {}
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
        log_stats=True,
        **extra,
    )


@dataclasses.dataclass(frozen=True)
class Arm:
    """What serves the online load: the stock scheduler alone (``batch`` 0), or beside at most ``batch`` requests
    kept at the engine: with TidalScheduler's relative budget at ``alpha_set``; on the stock scheduler behind the
    latency gate at ``gate_alpha_set`` (the worker's AIMD controller, fed the engine's ITL every scrape period);
    or, with neither, on vLLM's priority alone."""

    name: str
    batch: int = 0
    alpha_set: float = 0.0
    gate_alpha_set: float = 0.0


@dataclasses.dataclass
class Run:
    """One arm over one online trace; the lists hold what finished after the warm-up."""

    arm: Arm
    seconds: float  # of the window after the warm-up
    ttft_s: list[float] = dataclasses.field(default_factory=list)
    tbt_s: list[float] = dataclasses.field(default_factory=list)
    batch_tokens: int = 0  # batch tokens generated
    batch_prefill_tokens: int = 0
    steps: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # kind -> [steps, batch decodes, ms]
    at_engine: list[int] = dataclasses.field(default_factory=list)  # batch requests at the engine, each second
    # the latency gate's readings: (time, ITL read, smoothed inflation, target, batch requests at the engine)
    gate: list[tuple[float, float | None, float | None, int, int]] = dataclasses.field(default_factory=list)

    def figures(self) -> dict[str, t.Any]:
        def q(values: list[float], p: float) -> float | None:
            return float(np.percentile(values, p)) if values else None

        halves = np.array_split(np.array(self.at_engine, dtype=float), 2) if self.at_engine else []
        means = [float(h.mean()) for h in halves if len(h)]
        return {
            # the frontier's drift: the difference between the two halves' means, over the window's mean
            "batch_at_engine": {
                "mean": float(np.mean(self.at_engine)) if self.at_engine else 0.0,
                "min": min(self.at_engine, default=0),
                "max": max(self.at_engine, default=0),
                "drift": abs(means[0] - means[1]) / max(float(np.mean(means)), 1e-9) if len(means) == 2 else None,
            },
            "gate_readings": self.gate,
            "ttft_p50_s": q(self.ttft_s, 50),
            "ttft_p99_s": q(self.ttft_s, 99),
            "tbt_p50_s": q(self.tbt_s, 50),
            "tbt_p99_s": q(self.tbt_s, 99),
            "online_requests": len(self.ttft_s),
            "harvest_tokens_per_s": self.batch_tokens / self.seconds,
            "prefill_per_generated": self.batch_prefill_tokens / self.batch_tokens if self.batch_tokens else None,
            "steps": {
                kind: {
                    "share": n / max(1, sum(v[0] for v in self.steps.values())),
                    "batch_decodes": d / n,
                    "ms": ms / n,
                }
                for kind, (n, d, ms) in self.steps.items()
                if n
            },
        }


def run(
    arm: Arm,
    profile: Profile,
    workload: Workload,
    load: OnlineLoad,
    settings: Settings,
    model_dir: str,
    *,
    seconds: float,
    warmup_s: float,
    lead_s: float,
    seed: int,
) -> Run:
    """``arm`` over ``seconds`` of ``load``'s trace (seed ``seed``, the same for every arm); the batch arrives
    ``lead_s`` in, and only what happens after ``warmup_s`` counts."""
    from tidal_engine.scheduler import TidalScheduler
    from tidal_workers.bench.frontier_plan import rate_fn

    rng = random.Random(seed)
    arrivals = [
        (at, [rng.randrange(VOCAB) for _ in range(workload.online_prompt.draw(rng) + TEMPLATE_TOKENS)])
        for at in online.arrivals(rate_fn(load, seconds), seconds, seed)
    ]
    lengths = [workload.online_output.draw(rng) for _ in arrivals]
    batch_rng = random.Random(seed + 1)
    clock = [0.0]
    if arm.alpha_set:
        s = settings.replace(sched_metrics_port=0, sched_alpha_set=arm.alpha_set, sched_profile=profile.name)
        scheduler: Scheduler = _on_profile(TidalScheduler, profile, model_dir, s)
        t.cast(TidalScheduler, scheduler).clock = lambda: clock[0]
    else:
        scheduler = _on_profile(Scheduler, profile, model_dir)
    gate = _Gate(arm, settings) if arm.gate_alpha_set else None
    result = Run(arm, seconds - warmup_s)
    arrived: dict[str, float] = {}
    last_token: dict[str, float] = {}
    batch_at_engine, batch_sent, next_online = 0, 0, 0
    while clock[0] < seconds:
        now = clock[0]
        while next_online < len(arrivals) and arrivals[next_online][0] <= now:
            at, prompt = arrivals[next_online]
            rid = f"online-{next_online}"
            scheduler.add_request(new_request(rid, prompt, 0, lengths[next_online]))
            arrived[rid] = at
            next_online += 1
        if gate is not None and now >= lead_s:
            gate.read(scheduler, now, batch_at_engine)
        while now >= lead_s and batch_at_engine < (gate.target if gate else arm.batch):
            prompt = [
                batch_rng.randrange(VOCAB) for _ in range(workload.batch_prompt.draw(batch_rng) + TEMPLATE_TOKENS)
            ]
            rid = f"batch-{batch_sent}"
            scheduler.add_request(new_request(rid, prompt, BATCH_PRIORITY, workload.batch_output.draw(batch_rng)))
            batch_sent, batch_at_engine = batch_sent + 1, batch_at_engine + 1
        if not scheduler.requests:  # idle until the next arrival
            clock[0] = arrivals[next_online][0] if next_online < len(arrivals) else seconds
            continue
        output = scheduler.schedule()
        shape = step_shape(scheduler, output)
        step_s = max(shape.seconds(profile), 1e-3)  # an empty step still takes the engine loop's turn
        clock[0] = now + step_s
        answer = model_output(scheduler, output)
        counted = clock[0] >= warmup_s
        for rid, sampled in zip(answer.req_ids, answer.sampled_token_ids, strict=True):
            if not sampled:
                continue
            if gate is not None and rid in last_token:
                gate.token_gap(clock[0] - last_token[rid])
            if rid.startswith("batch"):
                result.batch_tokens += counted
            elif rid in last_token:
                if counted:
                    result.tbt_s.append(clock[0] - last_token[rid])
            elif arrived[rid] >= warmup_s:
                result.ttft_s.append(clock[0] - arrived[rid])
            last_token[rid] = clock[0]
        if counted:
            while warmup_s + len(result.at_engine) <= clock[0]:
                result.at_engine.append(batch_at_engine)
            result.batch_prefill_tokens += shape.batch_prefill
            tally = result.steps.setdefault("prompt" if shape.prompt else "decode", [0, 0, 0.0])
            tally[0], tally[1], tally[2] = tally[0] + 1, tally[1] + shape.batch_decodes, tally[2] + 1000 * step_s
        before = set(scheduler.requests)
        scheduler.update_from_output(output, answer)
        finished = before - set(scheduler.requests)
        batch_at_engine -= sum(1 for rid in finished if rid.startswith("batch"))
        for rid in finished:
            last_token.pop(rid, None)
    if gate is not None:
        result.gate = gate.readings
    return result


class _Gate:
    """The latency gate as a worker runs it (``policy.aimd``), on virtual time: every scrape period it reads the
    mean inter-token latency of every request since the last reading (vLLM's ITL histogram counts batch and online
    alike) and the batch requests at the engine, and sets the target; a cut reaches the engine as requests finish."""

    def __init__(self, arm: Arm, settings: Settings) -> None:
        from tidal_workers.policy.aimd import AimdConfig
        from tidal_workers.policy.aimd import AimdController

        gate_settings = settings.replace(gate_mode="latency", gate_alpha_set=arm.gate_alpha_set, initial_inflight=1)
        self.controller = AimdController(AimdConfig.from_settings(gate_settings, arm.batch))
        self.state = self.controller.initial()
        self.period = gate_settings.scrape_seconds
        self.read_at: float | None = None
        self.gaps: list[float] = []
        self.preemptions = 0
        self.readings: list[tuple[float, float | None, float | None, int, int]] = []  # as Run.gate

    @property
    def target(self) -> int:
        return self.state.target

    def token_gap(self, seconds: float) -> None:
        self.gaps.append(seconds)

    def read(self, scheduler: Scheduler, now: float, batch_at_engine: int) -> None:
        from tidal_workers.policy.aimd import Observation

        if self.read_at is not None and now - self.read_at < self.period:
            return
        observation = Observation(
            kv_usage=float(scheduler.get_kv_cache_usage()),
            waiting=float(len(scheduler.waiting)),
            running=float(len(scheduler.running)),
            preemptions_total=0.0,  # on the A6000's KV pool at these loads vLLM preempts nothing
            batch_inflight=batch_at_engine,
            itl_seconds=sum(self.gaps) / len(self.gaps) if self.gaps else None,
        )
        self.state = self.controller.step(self.state, observation, now)
        self.read_at, self.gaps = now, []
        self.readings.append((now, observation.itl_seconds, self.state.inflation, self.state.target, batch_at_engine))


def _on_profile(cls: type[Scheduler], profile: Profile, model_dir: str, settings: Settings | None = None) -> Scheduler:
    """The scheduler of an engine on ``profile``'s GPU: its slots, its token budget τ, its KV pool."""
    return build_scheduler(
        cls,
        model_dir,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        num_blocks=profile.kv_pool_tokens // BLOCK_SIZE,
        settings=settings,
    )


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one scheduled step computes, each request's context being its KV before the step; requests named
    ``batch-*`` are the batch, the rest online."""

    tokens: int
    context: int
    pairs: int
    prompt: bool  # an online prompt ran in it
    batch_decodes: int
    batch_prefill: int

    def seconds(self, profile: Profile) -> float:
        """T(P, C, pairs) on ``profile``."""
        return step_seconds(profile, self.tokens, self.context, self.pairs)


def step_shape(scheduler: Scheduler, output: SchedulerOutput) -> StepShape:
    """The shape of the step ``output`` scheduled, read before ``update_from_output`` moves the requests on."""
    tokens, context, pairs = step_totals(scheduler.requests, output)
    batch_decodes = batch_prefill = 0
    prompt = False
    for request, n, before in scheduled(scheduler.requests, output):
        prefill = before < request.num_prompt_tokens
        if request.request_id.startswith("batch"):
            batch_decodes += not prefill
            batch_prefill += n if prefill else 0
        elif prefill:
            prompt = True
    return StepShape(tokens, context, pairs, prompt, batch_decodes, batch_prefill)


INFLATIONS = ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99")


def judged(alone: Run, co: Run, harvest_at: t.Callable[[float], float] | None) -> dict[str, t.Any]:
    """``co`` against online alone on the same trace: each inflation, α_m (the largest, at least 1.10, as the
    frontier judges a point) and E = harvest ÷ H*(α_m) where ``harvest_at`` gives H*."""
    a, c = alone.figures(), co.figures()
    inflation = {q: c[f"{q}_s"] / a[f"{q}_s"] for q in INFLATIONS}
    alpha_m = max(1.10, *inflation.values())
    oracle = harvest_at(alpha_m) if harvest_at else None
    return {
        "inflation": inflation,
        "alpha_m": alpha_m,
        "harvest_tokens_per_s": c["harvest_tokens_per_s"],
        "oracle_tokens_per_s": oracle,
        "E": c["harvest_tokens_per_s"] / oracle if oracle else None,
    }
