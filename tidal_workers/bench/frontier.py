"""`tidal bench frontier`: the harvest frontier, measured in steady windows beside the peers (issue 35).

Each point of the plan (frontier_plan.py) is one window on the timed twin:

1. The online load starts with its lead-in (the same rate, unmeasured), then, ``BATCH_LEAD_S`` later, the batch:
   through a private Tidal (outside, inside) or straight to vLLM at the lowest priority (vllm-priority), or every
   slot of the engine (ceiling).
2. A sampler reads the engine's /metrics and the arm's own counts every second: batch requests at the engine (the
   gate's ``tidal_gate_engine_outstanding``, the lanes in flight, or the engine's running requests for the ceiling)
   and batch completions. The window opens once the batch's admission has settled (``steady.admission``), or at
   ``settle_max_s`` regardless (then it is invalid), and the measured online trace opens with it.
   A flat window that would hold fewer than ``steady.MIN_COMPLETIONS`` batch completions runs on, up to the
   plan's ``window_max_s`` (``window_length``): at a small knob a 180-s window holds 30-120, too few for its prefill
   ratio to be judged.
3. After the window the batch's prefill and generated tokens are the engine's counters less the online ones (from
   the client's records), and the window is judged (frontier_report.verdict: steady.judge plus the point's own
   reasons). Its steps come from the twin's trace.

Every arm of a block sends the same online trace: the same arrival times and lengths (seeded per load and
repetition), with words of its own (a prompt repeated on one engine would be a prefix-cache hit). So each
inflation compares the same requests, one by one (stats.paired_quantile_ratios).

The stock engine stays up for the whole run; each inside point starts its own engine with TidalScheduler at the
point's step budget (``TIDAL_SCHED_TBT_SLO_MS``), since the plugin reads it once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import shutil
import tempfile
import time
import typing as t
import zlib
from pathlib import Path

import numpy as np

from config import Settings
from config.settings import env_name
from tidal_engine.twin import load_profile
from tidal_workers.bench import engine_stats
from tidal_workers.bench import frontier_report
from tidal_workers.bench import online
from tidal_workers.bench import oracle
from tidal_workers.bench import provenance
from tidal_workers.bench import samples
from tidal_workers.bench import steady
from tidal_workers.bench.backlog import Lanes
from tidal_workers.bench.client import OnlineClient
from tidal_workers.bench.engines import BenchEngine
from tidal_workers.bench.engines import EngineRequest
from tidal_workers.bench.engines import started
from tidal_workers.bench.frontier_plan import CEILING
from tidal_workers.bench.frontier_plan import ONLINE_ALONE
from tidal_workers.bench.frontier_plan import FrontierPlan
from tidal_workers.bench.frontier_plan import Point
from tidal_workers.bench.frontier_plan import RunDir
from tidal_workers.bench.frontier_plan import rate_fn
from tidal_workers.bench.stack import TidalStack
from tidal_workers.bench.stack import reserved_redis_db
from tidal_workers.bench.step_trace import Trace
from tidal_workers.bench.workload import BATCH_MIXES
from tidal_workers.bench.workload import GPU_WORKLOAD
from tidal_workers.bench.workload import ONLINE_LOADS
from tidal_workers.bench.workload import OnlineLoad
from tidal_workers.bench.workload import Prompts
from tidal_workers.bench.workload import Request
from tidal_workers.bench.workload import batch_requests
from tidal_workers.bench.workload import chat_body
from tidal_workers.bench.workload import load_tokenizer
from tidal_workers.policy.laxity import PRIORITY_MAX

PERIOD_S = 1.0
LEAD_S = 0.5  # between deciding a window opens and its first measured arrival
DECIDE_AHEAD_S = 2.0  # a window's length is decided this long before its planned end, so no arrival is sent past it
FLOWING_TIMEOUT_S = 180.0  # a Tidal's first completed item: worker start, ingest, a whole first request
LEAD_IN_MARGIN_S = FLOWING_TIMEOUT_S + 60.0  # online lead-in beyond settle_max_s: the batch's start up
# Online alone this long before the batch is sent, as a batch meets a live engine: sent first, it found an engine with
# no online work, where TidalScheduler admits batch into every slot (all 185 of the gate's requests prefilled at once,
# then drained at the mix's output pace: 300 s and more to settle). At 5-8/s the online running count is near its
# level by then.
BATCH_LEAD_S = 10.0
IDLE_TIMEOUT_S = 300.0

Log = t.Callable[[str], None]
Counts = t.Callable[[engine_stats.Reading], dict[str, float]]


class Observer(engine_stats.Periodic):
    """The engine's /metrics and the arm's counts, every PERIOD_S in a thread: the series a window is judged on."""

    def __init__(self, engine_url: str, counts: Counts):
        super().__init__(PERIOD_S)
        self.engine_url, self.counts = engine_url, counts
        self.rows: list[dict[str, float]] = []
        self.error: BaseException | None = None

    def sample(self) -> None:
        reading = engine_stats.read(self.engine_url, timeout=10.0)
        self.rows.append({**dataclasses.asdict(reading), **self.counts(reading)})

    def failed(self, exc: Exception) -> None:
        self.error = exc  # raised by settle(), in the benchmark's thread

    def admission(self, hold_s: float) -> steady.Admission:
        rows = list(self.rows)
        return steady.admission([steady.Sample(r["at"], r["at_engine"], r["completions"], 0, 0) for r in rows], hold_s)

    def settle(self, hold_s: float, settle_max_s: float) -> tuple[steady.Admission, float]:
        """Block until the batch's admission settles or ``settle_max_s`` passes; (the last verdict, seconds)."""
        began = time.monotonic()
        while True:
            if self.error is not None:
                raise RuntimeError("the sampler stopped") from self.error
            verdict = self.admission(hold_s)
            waited = time.monotonic() - began
            if verdict.settled or waited >= settle_max_s:
                return verdict, waited
            time.sleep(PERIOD_S)


@dataclasses.dataclass(frozen=True)
class TraceItem:
    """One online request of a load's trace: when, and its lengths (the words are each arm's own)."""

    at: float
    prompt_tokens: int
    max_tokens: int


@dataclasses.dataclass(frozen=True)
class OnlineTrace:
    seed: int
    lead_in: tuple[TraceItem, ...]
    measured: tuple[TraceItem, ...]

    @classmethod
    def of(cls, plan: FrontierPlan, load: OnlineLoad, rep: int) -> OnlineTrace:
        """The load's trace in repetition ``rep``: a flat lead-in at the trace's starting rate, long enough for the
        slowest settling, then the measured window (one period of a diurnal load)."""
        seed = zlib.crc32(f"{plan.seed}/{load.name}/{rep}".encode())
        rng = random.Random(seed)
        rate = rate_fn(load, plan.window_for(load.trace))

        def items(times: list[float]) -> tuple[TraceItem, ...]:
            """On the wall clock: the plan's times stretched by its time scale."""
            prompt, output = GPU_WORKLOAD.online_prompt, GPU_WORKLOAD.online_output  # every mix's online lengths
            return tuple(TraceItem(plan.time_scale * at, prompt.draw(rng), output.draw(rng)) for at in times)

        lead_s = max(plan.settle_max_s + LEAD_IN_MARGIN_S, plan.baseline_lead_s)  # the same trace at every scale
        lead = online.arrivals(online.flat(rate(0.0)), lead_s, seed=rng.randrange(1 << 30))
        measured = online.arrivals(rate, plan.longest_window_for(load.trace), seed=rng.randrange(1 << 30))
        return cls(seed, items(lead), items(measured))

    def requests(self, prompts: Prompts) -> tuple[list[Request], list[Request]]:
        """(lead-in, measured) with the words of ``prompts``."""

        def made(items: tuple[TraceItem, ...]) -> list[Request]:
            return [Request(i.at, prompts.make(i.prompt_tokens), i.max_tokens) for i in items]

        return made(self.lead_in), made(self.measured)


def _seed(text: str) -> int:
    return zlib.crc32(text.encode())


class Frontier:
    """The run: each point of the plan not yet in the run directory, in order, each written as it ends."""

    def __init__(self, plan: FrontierPlan, engine: EngineRequest, settings: Settings, run: RunDir, log: Log):
        self.plan, self.request, self.run_dir, self.log = plan, engine, run, log
        self.k = plan.time_scale  # wall seconds per plan second
        self.settings = settings.replace(  # Tidal's control periods, stretched with the twin's steps
            scrape_seconds=self.k * settings.scrape_seconds,
            metrics_stale_seconds=self.k * settings.metrics_stale_seconds,
            gate_reference_itl_ms=self.k * settings.gate_reference_itl_ms,
            sched_max_park_seconds=self.k * settings.sched_max_park_seconds,
            sched_tbt_slo_ms=self.k * settings.sched_tbt_slo_ms,
        )
        self.profile = load_profile(plan.profile)
        self.traces: dict[tuple[str, int], OnlineTrace] = {}
        self._stock: BenchEngine | None = None
        self._tokenizer: t.Any = None

    def run(self) -> None:
        points = self.plan.points()
        todo = [p for p in points if not self.run_dir.done(p)]
        traces = {name: ONLINE_LOADS[name].trace for name in self.plan.loads}
        self.log(
            f"{len(points)} points, {len(points) - len(todo)} already measured; about "
            f"{self.plan.expected_s(todo, traces) / 60:.0f} min for the rest"
        )
        began = time.monotonic()
        with contextlib.ExitStack() as running:
            self.running = running
            self.redis_db = running.enter_context(reserved_redis_db(self.settings, hours=24.0))
            for i, point in enumerate(todo):
                expected = self.plan.expected_s(todo[i:], traces)
                elapsed = time.monotonic() - began
                self.log(
                    f"[{i + 1}/{len(todo)}] {point.name} (elapsed {elapsed / 60:.0f} min, "
                    f"about {expected / 60:.0f} min left)"
                )
                try:
                    record = self.measure(point)
                except Exception as exc:  # one point's failure costs that point, not the hours after it
                    path = self.run_dir.fail(point, exc)
                    self.log(f"    FAILED ({type(exc).__name__}: {exc}); measured again by the next run: {path}")
                    continue
                path = self.run_dir.write(point, record)
                verdict = record["verdict"]
                said = "valid" if verdict["valid"] else "INVALID: " + "; ".join(verdict["reasons"])
                harvest = record.get("harvest_tokens_per_s")
                self.log(
                    f"    done in {record['seconds'] / 60:.1f} min"
                    + (f", batch {self.k * harvest:.0f} tokens/s" if harvest is not None else "")
                    + f", {said} -> {path.name}"
                )

    # --- engines and prompts -------------------------------------------------------------------------------

    def stock(self) -> BenchEngine:
        """The stock engine, started on first need and kept up for the run."""
        if self._stock is None:
            self.log("    starting the stock engine ...")
            log_path = self.run_dir.root / "logs" / "engine-stock.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._stock = self.running.enter_context(
                started(self.request, self.settings, plugin=False, log_path=log_path)
            )
        return self._stock

    @contextlib.contextmanager
    def inside_engine(self, point: Point, alpha_set: float) -> t.Iterator[BenchEngine]:
        self.log(f"    starting an engine with TidalScheduler, α_set {alpha_set:g} ...")
        log_path = self.run_dir.root / "logs" / f"engine-{point.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        engine_settings = self.settings.replace(sched_alpha_set=alpha_set, sched_profile=self.plan.twin_profile)
        with started(self.request, engine_settings, plugin=True, log_path=log_path) as engine:
            yield engine

    def prompts(self, point: Point, engine: BenchEngine) -> Prompts:
        """Words of the point's own, in the tokens of ``engine``'s tokenizer (loaded once)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(engine.tokenizer)
        return Prompts(self._tokenizer, _seed(point.name))

    def trace(self, point: Point) -> OnlineTrace:
        assert point.load is not None
        key = (point.load, point.rep)
        if key not in self.traces:
            self.traces[key] = OnlineTrace.of(self.plan, ONLINE_LOADS[point.load], point.rep)
        return self.traces[key]

    # --- points --------------------------------------------------------------------------------------------

    def measure(self, point: Point) -> dict[str, t.Any]:
        if self._stock is not None:  # what a failed point left at the engine would fall into this one's window
            engine_stats.wait_idle(self._stock.url, timeout=IDLE_TIMEOUT_S)
        began = time.monotonic()
        head: dict[str, t.Any] = {
            "utc_start": provenance.utc_now(),
            "load_average_start": provenance.load_average(),
            "machine": provenance.machine(),
            "git_commit": provenance.git_commit(),
            "profile": self.plan.profile,
            "profile_hash": oracle.profile_hash(self.profile),
            "twin_profile": self.plan.twin_profile,
        }
        if point.kind == CEILING:
            body = self.ceiling(point)
        elif point.kind == ONLINE_ALONE:
            body = self.online_alone(point)
        elif point.technique == "vllm-priority":
            body = self.vllm_priority(point)
        else:
            body = self.tidal(point)
        record = {
            "point": point.as_dict(),
            **head,
            **body,
            "utc_end": provenance.utc_now(),
            "load_average_end": provenance.load_average(),
            "seconds": time.monotonic() - began,
        }
        record["verdict"] = frontier_report.verdict(record, self.plan, None).as_dict()
        return record

    def ceiling(self, point: Point) -> dict[str, t.Any]:
        engine = self.stock()
        mix = BATCH_MIXES[point.mix]
        prompts, rng = self.prompts(point, engine), random.Random(_seed(point.name))
        bodies = (chat_body(engine.model, r) for r in batch_requests(10**9, mix.workload(), prompts, rng))
        trace = Trace(engine.trace_path) if engine.trace_path else None
        mark = trace.mark() if trace else 0
        with Lanes(engine.url, bodies, engine.max_num_seqs), Observer(engine.url, _engine_counts) as observer:
            admission, settle_s = observer.settle(self.k * self.plan.hold_s, self.k * self.plan.settle_max_s)
            opens = time.monotonic()
            closes = opens + self.k * self.plan.window_s
            self.log(f"    window open after {settle_s:.0f} s ({_settled(admission)}), {closes - opens:.0f} s ...")
            _sleep_until(closes + PERIOD_S)
        engine_stats.wait_idle(engine.url, timeout=IDLE_TIMEOUT_S)
        return _window_record(engine, observer, trace, mark, admission, settle_s, opens, closes, [], [], 0.0)

    def online_alone(self, point: Point) -> dict[str, t.Any]:
        engine = self.stock()
        lead_in, measured = self.trace(point).requests(self.prompts(point, engine))
        trace = Trace(engine.trace_path) if engine.trace_path else None
        mark = trace.mark() if trace else 0
        window = self.k * self.plan.longest_window_for(ONLINE_LOADS[str(point.load)].trace)  # all co-served ones'
        with (
            tempfile.TemporaryDirectory(prefix="tidal-frontier-") as tmp,
            _client(Path(tmp), engine, measured, lead_in) as client,
            Observer(engine.url, lambda r: {"at_engine": 0.0, "completions": 0.0}) as observer,
        ):
            lead_opens = time.monotonic() + LEAD_S
            client.start(lead_opens)
            opens = lead_opens + self.k * self.plan.baseline_lead_s
            client.start(opens)
            closes = opens + window
            self.log(f"    online alone, window {window:.0f} s ...")
            _sleep_until(closes + PERIOD_S)
            records = client.wait(timeout=window + 900)
            lead = client.lead_in_records()
        engine_stats.wait_idle(engine.url, timeout=IDLE_TIMEOUT_S)
        online_part = _online_part(self.trace(point), lead_opens, opens, lead, records)
        record = _window_record(engine, observer, trace, mark, None, 0.0, opens, closes, lead, records, lead_opens)
        return {**record, "online": online_part}

    def vllm_priority(self, point: Point) -> dict[str, t.Any]:
        engine = self.stock()
        mix = BATCH_MIXES[point.mix]
        prompts, rng = self.prompts(point, engine), random.Random(_seed(point.name))
        batch = (chat_body(engine.model, r, PRIORITY_MAX) for r in batch_requests(10**9, mix.workload(), prompts, rng))
        lanes = Lanes(engine.url, batch, int(t.cast(float, point.knob)))

        def counts(_reading: engine_stats.Reading) -> dict[str, float]:
            return {"at_engine": float(lanes.counts.inflight), "completions": float(lanes.counts.done)}

        body = self._coserved(point, engine, prompts, counts, lanes)
        engine_stats.wait_idle(engine.url, timeout=IDLE_TIMEOUT_S)
        return {**body, "knob": {"concurrency": point.knob, "priority": PRIORITY_MAX}}

    def tidal(self, point: Point) -> dict[str, t.Any]:
        load, mix = ONLINE_LOADS[str(point.load)], BATCH_MIXES[point.mix]
        knob: dict[str, t.Any] = {}
        gate_mode = "aimd"
        gate_env: dict[str, str] = {}
        if point.technique == "inside":
            # Behind a fixed gate at the deployment's ceiling: the plugin alone decides what runs, and parks the rest
            # with its KV. Behind the AIMD gate, whose target halves on an open-loop stream's normal waiting, the
            # requests at the engine swung 77 % across the window at α_set 1.1 and no window was steady.
            engine_cm: t.ContextManager[BenchEngine] = self._inside(point, knob)
            cap = self.plan.gate_ceiling
            gate_mode = "fixed"
            knob["gate_mode"] = gate_mode
        elif point.technique == "outside-latency":  # the latency gate at the point's α_set, its reference fitted
            engine_cm = contextlib.nullcontext(self.stock())
            cap = self.plan.gate_ceiling
            # From one request, as a deployed worker starts (TIDAL_INITIAL_INFLIGHT's default): the gate's own climb
            # spreads the working set its reference is fitted on; started at the cap it has none to fit.
            gate_mode = "latency"
            gate_env = {env_name("gate_alpha_set"): f"{point.knob:g}", env_name("initial_inflight"): "1"}
            reference = self.plan.gate_reference_ms
            if reference:
                gate_env[env_name("gate_reference_itl_ms")] = f"{reference:g}"
            elif self.plan.gate_profile:
                gate_env[env_name("gate_profile")] = self.plan.twin_profile
            knob.update(
                gate_alpha_set=point.knob,
                gate_ceiling=cap,
                gate_reference=f"{reference:g} ms" if reference else "profile" if self.plan.gate_profile else "fitted",
                initial_inflight=1,
            )
        else:  # outside, or outside-staged: the AIMD gate at the point's ceiling
            engine_cm = contextlib.nullcontext(self.stock())
            cap = int(t.cast(float, point.knob))
            knob["gate_ceiling"] = cap
        stage_tokens = self.plan.stage_tokens_for(str(point.technique))
        if stage_tokens:
            gate_env[env_name("prefill_stage_tokens")] = str(stage_tokens)
            gate_env[env_name("prefill_stage_min_tokens")] = str(self.plan.stage_min_tokens)
            knob["prefill_stage_tokens"] = stage_tokens
            knob["prefill_stage_min_tokens"] = self.plan.stage_min_tokens
        count = self._backlog(load, mix.name, cap)
        stack_home = self.run_dir.root / "stacks" / point.name
        shutil.rmtree(stack_home, ignore_errors=True)  # an interrupted earlier try of this point
        with engine_cm as engine:
            prompts, rng = self.prompts(point, engine), random.Random(_seed(point.name))
            bodies = [chat_body(engine.model, r) for r in batch_requests(count, mix.workload(), prompts, rng)]
            with TidalStack(
                self.settings,
                engine.url,
                stack_home,
                gate_mode=gate_mode,
                max_inflight=cap,
                extra_env=gate_env,
                redis_db=self.redis_db,
            ) as stack:
                plugin_url = engine.plugin_metrics_url

                def counts(_reading: engine_stats.Reading) -> dict[str, float]:
                    gate = stack.gate()
                    row = {
                        "at_engine": gate.get("tidal_gate_engine_outstanding", 0.0),
                        "gate_target": gate.get("tidal_gate_target", 0.0),
                        "gate_inflight": gate.get("tidal_gate_inflight", 0.0),
                        "completions": float(stack.progress().items),
                        "warmups": gate.get("tidal_prefill_stages_total", 0.0),
                        "warmup_tokens": gate.get("tidal_prefill_stage_tokens_total", 0.0),
                    }
                    if point.technique == "outside-latency":  # what the gate believed: its reference, its inflation
                        for name, key in (
                            ("reference_itl_seconds", "gate_reference_s"),
                            ("inflation", "gate_inflation"),
                            ("online_requests_per_second", "gate_online_rate"),
                            ("profile_level", "gate_profile_level"),
                            ("steered_inflation", "gate_steered"),
                        ):
                            value = gate.get(f"tidal_gate_{name}", math.nan)
                            row[key] = value if math.isfinite(value) else 0.0
                    if point.technique == "inside" and plugin_url:
                        # Behind a fixed gate the requests sent are constant; what settles is what the plugin holds
                        # at the engine: batch requests with KV, decoding or parked (the rest wait unprefilled).
                        row["gate_outstanding"] = row["at_engine"]
                        row["at_engine"] = engine_stats.read_plugin(plugin_url).get("tidal_sched_batch_resident", 0.0)
                    return row

                plugin_before = engine_stats.read_plugin(plugin_url) if plugin_url else None
                cpu_before, cpu_began = stack.worker_cpu_seconds(), time.monotonic()
                submitted = _submitted(stack.submit, bodies)
                body = self._coserved(point, engine, prompts, counts, submitted, flowing=stack.wait_until_flowing)
                elapsed = time.monotonic() - cpu_began
                body["worker_cpu_cores"] = (stack.worker_cpu_seconds() - cpu_before) / elapsed  # the whole point
                if plugin_url and plugin_before is not None:  # the plugin's counters over the whole point
                    after = engine_stats.read_plugin(plugin_url)
                    body["plugin"] = {
                        k: v - plugin_before.get(k, 0.0) if k.endswith("_total") else v for k, v in after.items()
                    }
                stack.cancel_all()
            engine_stats.wait_idle(engine.url, timeout=IDLE_TIMEOUT_S)
        _keep_log(stack_home, self.run_dir.root / "logs" / f"worker-{point.name}.log")
        return {**body, "knob": knob, "backlog_submitted": count}

    def _inside(self, point: Point, knob: dict[str, t.Any]) -> t.ContextManager[BenchEngine]:
        """The inside engine at the point's α_set: each step at most α_set × T̂(its online work alone), priced on the
        profile the twin runs (step_budget.py)."""
        alpha_set = t.cast(float, point.knob)
        knob.update(alpha_set=alpha_set, sched_profile=self.plan.twin_profile, gate_ceiling=self.plan.gate_ceiling)
        knob.update(sched_tbt_slo_ms=self.settings.sched_tbt_slo_ms, sched_guard=self.settings.sched_guard)
        return self.inside_engine(point, alpha_set)

    def _backlog(self, load: OnlineLoad, mix_name: str, cap: int) -> int:
        """Batch items enough for the slowest settling and the window at the most any scheduler harvests, with half
        again to spare, and the gate's fill twice over (the report flags a window whose backlog ran out)."""
        mix = BATCH_MIXES[mix_name].workload()
        online_class = oracle.RequestClass.of(mix.online_prompt, mix.online_output)
        batch_class = oracle.RequestClass.of(mix.batch_prompt, mix.batch_output)
        low_rate = load.step_from if load.trace == "step" else load.rate * (1 - load.amplitude)
        bound = oracle.any_latency_bound(self.profile, low_rate, online_class, batch_class) / batch_class.output
        seconds = self.plan.settle_max_s + self.plan.window_for(load.trace) + 60.0
        return math.ceil(1.5 * bound * seconds) + 2 * cap

    def _coserved(
        self,
        point: Point,
        engine: BenchEngine,
        prompts: Prompts,
        counts: Counts,
        batch: t.ContextManager[object],
        flowing: t.Callable[..., None] | None = None,
    ) -> dict[str, t.Any]:
        """The lead-in, then the batch (entered ``BATCH_LEAD_S`` after it and left once the online answers are in),
        flowing (``flowing`` blocks until it does), settling, the window."""
        online_trace = self.trace(point)
        lead_in, measured = online_trace.requests(prompts)
        trace_kind = ONLINE_LOADS[str(point.load)].trace
        window, longest = self.k * self.plan.window_for(trace_kind), self.k * self.plan.longest_window_for(trace_kind)
        trace = Trace(engine.trace_path) if engine.trace_path else None
        with (
            tempfile.TemporaryDirectory(prefix="tidal-frontier-") as tmp,
            _client(Path(tmp), engine, measured, lead_in) as client,
            contextlib.ExitStack() as batch_flows,
        ):
            lead_opens = _online_then_batch(client, batch_flows, batch, self.k * BATCH_LEAD_S)
            flowed = True
            if flowing is not None:
                try:
                    flowing(timeout=FLOWING_TIMEOUT_S)
                except TimeoutError:  # measured all the same: its window shows what the arm did, and is invalid
                    flowed = False
                    self.log(f"    no batch item completed in {FLOWING_TIMEOUT_S:.0f} s; settling all the same")
            mark = trace.mark() if trace else 0
            with Observer(engine.url, counts) as observer:
                admission, settle_s = observer.settle(self.k * self.plan.hold_s, self.k * self.plan.settle_max_s)
                opens = time.monotonic() + LEAD_S
                client.start(opens)
                self.log(f"    window open after {settle_s:.0f} s ({_settled(admission)}), {window:.0f} s ...")
                decide = opens + max(window - DECIDE_AHEAD_S, PERIOD_S)
                _sleep_until(decide)
                rows = list(observer.rows)
                before = [r["completions"] for r in rows if r["at"] <= opens]
                so_far = rows[-1]["completions"] - (before[-1] if before else rows[0]["completions"])
                length = window_length(window, longest, so_far, decide - opens)
                closes = opens + length
                client.start(closes)  # no measured arrival from then on
                if length > window:
                    self.log(f"    {so_far:.0f} batch completions so far: the window runs {length:.0f} s")
                _sleep_until(closes + PERIOD_S)
                records = client.wait(timeout=length + 900)  # the batch flows on until the last online answer
                lead = client.lead_in_records()
        record = _window_record(
            engine, observer, trace, mark, admission, settle_s, opens, closes, lead, records, lead_opens
        )
        return {**record, "flowed": flowed, "online": _online_part(online_trace, lead_opens, opens, lead, records)}


@contextlib.contextmanager
def _client(
    tmp: Path, engine: BenchEngine, measured: list[Request], lead_in: list[Request]
) -> t.Iterator[OnlineClient]:
    client = OnlineClient(tmp, engine.url, engine.model, measured, lead_in=lead_in)
    try:
        client.ready()
        yield client
    finally:
        client.kill()  # a no-op once it has ended; a phase given up stops its load


def _online_then_batch(
    client: OnlineClient, batch_flows: contextlib.ExitStack, batch: t.ContextManager[object], lead_s: float
) -> float:
    """Start the online lead-in, and ``lead_s`` after it enter ``batch`` on ``batch_flows``; returns when the
    lead-in opened."""
    lead_opens = time.monotonic() + LEAD_S
    client.start(lead_opens)
    _sleep_until(lead_opens + lead_s)
    batch_flows.enter_context(batch)
    return lead_opens


@contextlib.contextmanager
def _submitted(submit: t.Callable[[list[dict]], str], bodies: list[dict]) -> t.Iterator[str]:
    """The batch submitted on entry; a Tidal's batch is cancelled with its stack, not here."""
    yield submit(bodies)


def window_length(window_s: float, longest_s: float, completions: float, after_s: float) -> float:
    """How long a window runs that saw ``completions`` batch completions in its first ``after_s``: ``window_s``,
    or, if at that pace it would close with fewer than steady.MIN_COMPLETIONS, as long as they take with a tenth to
    spare, up to ``longest_s``. Decided once, before the planned end, not by stopping when the count is reached
    (a stop on the count would end windows on a burst)."""
    if longest_s <= window_s:
        return window_s
    pace = completions / after_s if after_s > 0 else 0.0
    if pace * window_s >= steady.MIN_COMPLETIONS:
        return window_s
    needed = 1.1 * steady.MIN_COMPLETIONS / pace if pace > 0 else math.inf
    return min(max(needed, window_s), longest_s)


def _engine_counts(reading: engine_stats.Reading) -> dict[str, float]:
    """The ceiling's: every request at the engine is batch."""
    return {"at_engine": reading.running, "completions": reading.finished}


def _settled(admission: steady.Admission) -> str:
    if admission.settled:
        return f"settled at {admission.level:.0f} batch requests at the engine"
    return f"NOT settled: {admission.level:.0f} at the engine, {admission.turnover:.0f} completions at that level"


def _sleep_until(when: float) -> None:
    if (delay := when - time.monotonic()) > 0:
        time.sleep(delay)


def _online_part(
    trace: OnlineTrace, lead_opens: float, opens: float, lead: list[dict], records: list[dict]
) -> dict[str, t.Any]:
    return {
        "trace_seed": trace.seed,
        "lead_in_sent": len(lead),
        "lead_in_s": opens - lead_opens,
        "summary": samples.summary(records),
        "records": records,
    }


def batch_samples(rows: list[dict[str, float]], online: list[tuple[list[dict], float]]) -> list[list[float]]:
    """The batch's samples ([at from the first row, at the engine, completions, prefill, generated], cumulative) from
    the engine's counters in ``rows`` less the online tokens of each (records, the instant their trace opened), and
    less staged prefill's warm-ups where the row counts them (their prompts and their one token each: the item's
    own request counts its whole prompt again)."""
    times = [r["at"] for r in rows]
    prompt, generated = np.zeros(len(rows)), np.zeros(len(rows))
    for records, opens in online:
        p, g = samples.cumulative_tokens(records, opens, times)
        prompt, generated = prompt + p, generated + g
    return [
        [
            r["at"] - times[0],
            r["at_engine"],
            r["completions"],
            r["prompt_tokens"] - r.get("warmup_tokens", 0.0) - p,
            r["generation_tokens"] - r.get("warmups", 0.0) - g,
        ]
        for r, p, g in zip(rows, prompt.tolist(), generated.tolist(), strict=True)
    ]


def _window_record(
    engine: BenchEngine,
    observer: Observer,
    trace: Trace | None,
    mark: int,
    admission: steady.Admission | None,
    settle_s: float,
    opens: float,
    closes: float,
    lead: list[dict],
    records: list[dict],
    lead_opens: float,
) -> dict[str, t.Any]:
    """What every point keeps: the series (times from its first reading), the batch's samples with the online
    tokens taken out, the window, and the twin's steps in it."""
    rows = observer.rows
    t0 = rows[0]["at"]
    batch = batch_samples(rows, [(lead, lead_opens), (records, opens)])
    steps = trace.window(opens, closes, since=mark) if trace else None
    window = steady.within([steady.Sample(*s) for s in batch], opens - t0, closes - t0)
    generated = window[-1].generated - window[0].generated if len(window) >= 2 else 0.0
    seconds = window[-1].at - window[0].at if len(window) >= 2 else 0.0
    return {
        "engine": engine.provenance(),
        "t0": t0,
        "series": [{**r, "at": r["at"] - t0} for r in rows],
        "samples": batch,
        "window": {
            "opens": opens - t0,
            "closes": closes - t0,
            "settle_s": settle_s,
            "admission": dataclasses.asdict(admission) if admission else None,
        },
        "steps": steps.as_dict() if steps else None,
        "harvest_tokens_per_s": generated / seconds if seconds > 0 else None,
    }


def _keep_log(stack_home: Path, to: Path) -> None:
    """A point's Tidal: its worker log kept, its store (every item's body and answer) dropped."""
    with contextlib.suppress(FileNotFoundError):
        shutil.copyfile(stack_home / "worker.log", to)
    shutil.rmtree(stack_home, ignore_errors=True)
