"""`tidal bench harvest`: how much of an engine's ceiling Tidal harvests beside online load, and at what cost
to the online requests: Tidal outside the engine (the AIMD gate, vLLM's stock scheduler) against Tidal inside it (the
same gate plus TidalScheduler). Reports before issue 35 call them A and B (``harvest_report.LEGACY_TECHNIQUES``).

Per repetition and engine, in ABBA order of the engines:

(a) ceiling    every slot of the engine (``max_num_seqs``) kept full of batch work straight to vLLM; generated
               tokens counted between two reads of ``/metrics`` once the slots are full, so no ramp and no
               drain tail are in it;
(b) baseline   the online load alone (flat, then diurnal), sent by the online client in its own process;
(c) co-served  the same online load while a Tidal worker drains a batch backlog into the same engine.

Harvest = batch tokens/s in (c) over (a) of the same engine and repetition. Inflation = an online latency
percentile in (c) over (b). Every phase keeps its raw client records, the engine's /metrics series, UTC times
and the load average, and its window's step figures (steps/s, tokens a step, and from the twin's step trace its
overruns): the report (harvest_report.py) computes every figure from them. These windows are not judged steady;
`tidal bench frontier` (frontier.py) measures steady windows and supersedes this benchmark's harvest figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import tempfile
import time
import typing as t
from pathlib import Path

from config import Settings
from tidal_workers.bench import engine_stats
from tidal_workers.bench import harvest_report
from tidal_workers.bench import histograms
from tidal_workers.bench import online
from tidal_workers.bench import provenance
from tidal_workers.bench import samples
from tidal_workers.bench.backlog import closed_loop
from tidal_workers.bench.client import OnlineClient
from tidal_workers.bench.engines import BenchEngine
from tidal_workers.bench.engines import EngineRequest
from tidal_workers.bench.engines import started
from tidal_workers.bench.stack import TidalStack
from tidal_workers.bench.stats import abba_order
from tidal_workers.bench.step_trace import Trace
from tidal_workers.bench.workload import Prompts
from tidal_workers.bench.workload import Workload
from tidal_workers.bench.workload import batch_requests
from tidal_workers.bench.workload import chat_body
from tidal_workers.bench.workload import load_tokenizer
from tidal_workers.bench.workload import online_requests

RAMP_TIMEOUT_S = 180.0  # filling 256 slots of ~800-token prompts is ~30 s of A6000 prefill at τ = 2,048
RAMP_S = 35.0  # that ramp, for the duration estimate only
STACK_OVERHEAD_S = 40.0  # worker start, upload and ingest, first item, settling: for the duration estimate only
DRAIN_S = 10.0  # the last online answers and the engine going idle after a phase: estimate only
ANSWER_TAIL_S = 20.0  # more of the last answers on a loaded engine (end-to-end p99 ~50 s measured): estimate only


@dataclasses.dataclass(frozen=True)
class HarvestPlan:
    techniques: tuple[str, ...]  # ("outside", "inside"), or one of them
    traces: tuple[str, ...]  # ("flat", "diurnal"), or one of them
    reps: int
    flat_rate: float  # online requests/s
    diurnal_rate: float  # the diurnal trace's mean
    amplitude: float  # the diurnal swing as a fraction of its mean
    samples: int  # online requests per phase: each phase lasts samples / rate (≥ 1,000 TTFT samples)
    ceiling_s: float  # the ceiling's measured window
    settle_s: float  # after the backlog starts flowing, before the co-served window opens
    max_inflight: int  # the harvesting worker's gate ceiling (the ceiling ignores it: all slots)
    inside_gate: str  # the worker's gate in front of TidalScheduler: aimd as outside, or fixed at max_inflight
    workload: Workload
    seed: int = 7

    def rate(self, trace: str) -> float:
        return self.flat_rate if trace == "flat" else self.diurnal_rate

    def phase_s(self, trace: str) -> float:
        return self.samples / self.rate(trace)

    def expected_s(self, engine_start_s: float) -> float:
        """Wall time of the whole run, roughly: what the command prints before it starts."""
        per_unit = (
            self.ceiling_s
            + RAMP_S
            + STACK_OVERHEAD_S
            + sum(2 * (self.phase_s(x) + DRAIN_S + ANSWER_TAIL_S) for x in self.traces)
        )
        return len(self.techniques) * engine_start_s + self.reps * len(self.techniques) * per_unit

    def rate_fn(self, trace: str) -> t.Callable[[float], float]:
        if trace == "diurnal":
            return online.diurnal(self.diurnal_rate, self.amplitude, self.phase_s(trace))
        return online.flat(self.flat_rate)


class Phase:
    """One measured phase's record: UTC times and load average around it, then what it measured."""

    def __init__(self, rep: int, technique: str, name: str, trace: str | None):
        self.record: dict[str, t.Any] = {
            "rep": rep,
            "technique": technique,
            "phase": name,
            "trace": trace,
            "utc_start": provenance.utc_now(),
            "load_average_start": provenance.load_average(),
        }

    def close(self, **measured: t.Any) -> dict:
        self.record.update(measured, utc_end=provenance.utc_now(), load_average_end=provenance.load_average())
        return self.record


class Harvest:
    """The experiment over the given engines (one per technique), in ABBA order."""

    def __init__(self, plan: HarvestPlan, engines: dict[str, BenchEngine], settings: Settings, out_dir: Path):
        self.plan = plan
        self.engines = engines
        self.settings = settings
        self.out_dir = out_dir
        self.rng = random.Random(plan.seed)
        tokenizers = {e.tokenizer for e in engines.values()}
        self.prompts = {name: Prompts(load_tokenizer(name), plan.seed) for name in tokenizers}
        self.phases: list[dict] = []

    def _prompts(self, engine: BenchEngine) -> Prompts:
        return self.prompts[engine.tokenizer]

    def run(self, log: t.Callable[[str], None]) -> list[dict]:
        """Every unit in ABBA order. No separate warm-up: each unit opens with the ceiling, whose ramp (every slot
        filling, unmeasured) warms a fresh engine before anything is measured on it."""
        for rep, technique in abba_order(self.plan.techniques, self.plan.reps):
            self.unit(rep, technique, log)
        return self.phases

    def unit(self, rep: int, technique: str, log: t.Callable[[str], None]) -> None:
        """One repetition on one engine: ceiling, the baselines, the co-served runs."""
        engine = self.engines[technique]
        log(f"[rep {rep + 1}/{self.plan.reps} {technique}] ceiling, all {engine.max_num_seqs} slots ...")
        phase = Phase(rep, technique, "ceiling", None)
        self.phases.append(phase.close(**self.ceiling(engine, self.plan.ceiling_s)))
        items_per_s = self.phases[-1]["requests_per_s"]
        for trace in self.plan.traces:
            log(f"[rep {rep + 1} {technique}] online only, {trace}, {self.plan.phase_s(trace):.0f} s ...")
            phase = Phase(rep, technique, "baseline", trace)
            self.phases.append(phase.close(**self.online_phase(engine, trace)))
            engine_stats.wait_idle(engine.url, timeout=300)
        backlog_s = sum(self.plan.phase_s(x) + DRAIN_S for x in self.plan.traces) + 60.0
        count = math.ceil(1.5 * items_per_s * backlog_s) + self.plan.max_inflight
        gate_mode = self.plan.inside_gate if technique == "inside" else "aimd"
        stack_dir = self.out_dir / f"stack-{technique}-{rep}"
        with TidalStack(
            self.settings, engine.url, stack_dir, gate_mode=gate_mode, max_inflight=self.plan.max_inflight
        ) as stack:
            prompts = self._prompts(engine)
            stack.submit(
                [chat_body(engine.model, r) for r in batch_requests(count, self.plan.workload, prompts, self.rng)]
            )
            stack.wait_until_flowing()
            time.sleep(self.plan.settle_s)  # the gate reaches its steady state before the window opens
            for trace in self.plan.traces:
                log(f"[rep {rep + 1} {technique}] co-served, {trace}, {self.plan.phase_s(trace):.0f} s ...")
                phase = Phase(rep, technique, "coserved", trace)
                measured = self.online_phase(engine, trace, stack)
                measured["backlog_submitted"] = count
                self.phases.append(phase.close(**measured))
            stack.cancel_all()
        engine_stats.wait_idle(engine.url, timeout=300)

    def ceiling(self, engine: BenchEngine, window_s: float) -> dict:
        """All slots full of batch work; tokens counted between two reads once they are full (no ramp, no drain)."""
        prompts = self._prompts(engine)
        bodies = (chat_body(engine.model, r, 100) for r in batch_requests(10**9, self.plan.workload, prompts, self.rng))

        async def measure() -> dict:
            lanes = asyncio.create_task(closed_loop(engine.url, bodies, engine.max_num_seqs, math.inf))
            try:
                ramp = await asyncio.to_thread(_wait_running, engine, engine.max_num_seqs, RAMP_TIMEOUT_S)
                with engine_stats.Sampler(engine.url) as sampler:
                    await asyncio.sleep(window_s)
            finally:
                lanes.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lanes
            readings = sampler.readings  # the closing read too: the lanes are cancelled only after it
            first, last = readings[0], readings[-1]
            window = last.at - first.at
            return {
                "ramp_s": ramp,
                "window_s": window,
                "slots": engine.max_num_seqs,
                "batch_tokens_per_s": (last.generation_tokens - first.generation_tokens) / window,
                "requests_per_s": (last.finished - first.finished) / window,
                "running_mean": sum(r.running for r in readings) / len(readings),
                **_engine_side(readings, engine, first, last),
            }

        result = asyncio.run(measure())
        engine_stats.wait_idle(engine.url, timeout=300)
        return result

    def online_phase(self, engine: BenchEngine, trace: str, stack: TidalStack | None = None) -> dict:
        """The online load of ``trace`` from the client process; with a stack, Tidal harvests beside it."""
        times = _first_n(
            online.arrivals(self.plan.rate_fn(trace), self.plan.phase_s(trace) * 1.5, seed=self.rng.randrange(1 << 30)),
            self.plan.samples,
        )
        window = times[-1]  # the last arrival closes the window: online load is present all through it
        requests = online_requests(times, self.plan.workload, self._prompts(engine), self.rng)
        before = stack.progress() if stack else None
        cpu_before = stack.worker_cpu_seconds() if stack else None
        hist_before = stack.histograms() if stack else None
        plugin_before = engine_stats.read_plugin(engine.plugin_metrics_url) if engine.plugin_metrics_url else None
        with tempfile.TemporaryDirectory(prefix="tidal-client-") as tmp:
            client = OnlineClient(Path(tmp), engine.url, engine.model, requests)
            with engine_stats.Sampler(engine.url, also=stack.gate if stack else None) as sampler:
                opens = client.open()
                start = _read_at(engine, opens)
                end = _read_at(engine, opens + window)
                after = stack.progress() if stack else None
                hist_after = stack.histograms() if stack else None
                records = client.wait(timeout=window + 900)
        generated = end.generation_tokens - start.generation_tokens
        online_tokens = samples.tokens_until(records, window)
        result: dict[str, t.Any] = {
            "window_s": end.at - start.at,
            "opens_at_s": start.at - sampler.readings[0].at,  # where the window starts on the series' clock
            "rate": self.plan.rate(trace),
            "batch_tokens_per_s": max(0.0, generated - online_tokens) / (end.at - start.at),
            "online_tokens_in_window": online_tokens,
            "summary": samples.summary(records),
            "records": records,
            "metrics": [dataclasses.asdict(r) for r in sampler.readings],
            **_engine_side(sampler.readings, engine, start, end),
        }
        if stack is not None and before is not None and after is not None and cpu_before is not None:
            result["tidal_items_completed"] = after.items - before.items
            result["tidal_output_tokens_per_s"] = (after.output_tokens - before.output_tokens) / window
            result["worker_cpu_cores"] = (stack.worker_cpu_seconds() - cpu_before) / window
            result["gate"] = [  # (time, target, leases held, requests at the engine)
                (at, g.get("tidal_gate_target"), g.get("tidal_gate_inflight"), g.get("tidal_gate_engine_outstanding"))
                for at, g in sampler.also_readings
            ]
        if hist_before is not None and hist_after is not None:  # freed token → next POST, POST, POST end → release
            result["dispatch"] = {
                name: histograms.summarize_histogram(histograms.delta(hist_after[name], hist_before[name]))
                for name in histograms.HISTOGRAMS
            }
        if plugin_before is not None and engine.plugin_metrics_url:
            result["plugin"] = _plugin_delta(plugin_before, engine_stats.read_plugin(engine.plugin_metrics_url))
        return result


def _first_n(times: list[float], n: int) -> list[float]:
    if len(times) < n:
        raise RuntimeError(f"only {len(times)} arrivals drawn for {n} requests")
    return times[:n]


def _read_at(engine: BenchEngine, when: float) -> engine_stats.Reading:
    if (delay := when - time.monotonic()) > 0:
        time.sleep(delay)
    return engine_stats.read(engine.url, timeout=30.0)  # a window's edge: a busy API server answers late, not never


def _wait_running(engine: BenchEngine, slots: int, timeout: float) -> float:
    """Seconds until the slots are full (the ceiling's window opens then): all but a few, since finished requests
    are replaced one round trip later."""
    started = time.monotonic()
    while engine_stats.read(engine.url).running < slots - max(1, slots // 32):
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"the engine never ran {slots} requests at once in {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - started


def _engine_side(
    readings: list[engine_stats.Reading], engine: BenchEngine, start: engine_stats.Reading, end: engine_stats.Reading
) -> dict:
    """The series over the whole phase (for the plots); step figures over the window [start, end] only."""
    window = [start, *(r for r in readings if start.at < r.at < end.at), end]
    steps = Trace(engine.trace_path).window(start.at, end.at) if engine.trace_path else None
    return {
        "fill": engine_stats.budget_fill(readings, engine.budget_tokens),
        "generation_rate": engine_stats.generation_rate(readings),
        **engine_stats.step_rate(window),
        "steps": steps.as_dict() if steps else None,
    }


def _plugin_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """The plugin's state over the window: gauges as last seen, counters as increments."""
    return {k: (v - before.get(k, 0.0)) if k.endswith("_total") else v for k, v in after.items()}


def run_harvest(
    plan: HarvestPlan,
    engines: dict[str, EngineRequest | BenchEngine],
    settings: Settings,
    out_dir: Path,
    log: t.Callable[[str], None],
) -> dict:
    """Start the engines not given by URL (all kept up for the whole run, so ABBA costs no restarts), run the
    experiment, and return harvest.json's content: the plan, each engine's description, every phase record
    with its raw samples, and the figures with their intervals."""
    with contextlib.ExitStack() as running:
        live: dict[str, BenchEngine] = {}
        for technique, engine in engines.items():
            if isinstance(engine, BenchEngine):
                live[technique] = engine
                continue
            log(f"[{technique}] starting the {engine.kind} engine ...")
            live[technique] = running.enter_context(
                started(engine, settings, plugin=technique == "inside", log_path=out_dir / f"engine-{technique}.log")
            )
        phases = Harvest(plan, live, settings, out_dir).run(log)
    return {
        "plan": dataclasses.asdict(plan),
        "engines": {technique: engine.provenance() for technique, engine in live.items()},
        "sched_tbt_slo_ms": settings.sched_tbt_slo_ms,
        "summary": harvest_report.intervals(phases),
        "phases": phases,
    }
