"""`tidal bench fleet`: batch work placed across replicas by their own gates, against a static even split of the
same batch over the same replicas, and against pinning it all to one replica (the design's comparison).

Two replicas (timed twins of the seed's GPU, or tiny CPU engines), each with its own online load sent straight to
it at priority 0, diurnal and in anti-phase (replica 1's peak is replica 0's trough). Per repetition, in ABBA
order of the arms (fleet_report.ARMS):

baseline   the online load alone: each replica's own reference for latency inflation;
placement  one Tidal, one `tidal worker` per replica (its own node name, engine URL and AIMD gate), both claiming
           from the same queue: an item goes to whichever gate is open;
split      two Tidals, each with one worker on its own replica, each given half of the batch;
pinning    one Tidal, one worker, on replica 0.

Every batch arm gets the same finite batch, submitted as the online load opens, and the same online schedule. A
finite batch is what tells placement from a split: with an endless backlog each worker keeps its own replica's
gate full either way. The headline is batch tokens/s while the batch had work (until its last item finished, or
the window's end), per replica and in all; latency inflation compares the online requests scheduled in that span
with the same requests in the baseline. Raw client records, /metrics series and engine CPU are kept.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import random
import subprocess
import tempfile
import time
import typing as t
from pathlib import Path

import psutil
import requests

from config import Settings
from tidal_engine.serve import free_port
from tidal_workers.bench import engine_stats
from tidal_workers.bench import fleet_report
from tidal_workers.bench import online
from tidal_workers.bench import provenance
from tidal_workers.bench import samples
from tidal_workers.bench.client import LEAD_S
from tidal_workers.bench.client import OnlineClient
from tidal_workers.bench.engines import BenchEngine
from tidal_workers.bench.engines import EngineRequest
from tidal_workers.bench.engines import started
from tidal_workers.bench.stack import BENCH_REDIS_DB
from tidal_workers.bench.stack import TidalStack
from tidal_workers.bench.step_trace import Trace
from tidal_workers.bench.workload import Prompts
from tidal_workers.bench.workload import Workload
from tidal_workers.bench.workload import batch_requests
from tidal_workers.bench.workload import chat_body
from tidal_workers.bench.workload import load_tokenizer
from tidal_workers.bench.workload import online_requests

STACK_S = 25.0  # a Tidal and its workers started and stopped: for the duration estimate only
DRAIN_S = 15.0  # the last online answers, cancelled batch work leaving the engines: estimate only
READY_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True)
class FleetPlan:
    reps: int
    period: float  # seconds of one online "day" (the seed's: 600)
    periods: float  # days per arm
    online_rate: float  # mean online requests/s per replica
    amplitude: float  # the diurnal swing as a fraction of the mean
    batch_items: int  # the batch every batch arm gets
    max_inflight: int  # each worker's gate ceiling
    interval: float  # seconds per bin of the fill series and the correlation
    workload: Workload
    seed: int = 7
    batch_arms: tuple[str, ...] = fleet_report.BATCH_ARMS  # the arms run beside the baseline (``--arms``)

    @property
    def window_s(self) -> float:
        return self.period * self.periods

    def rate_fn(self, replica: int, replicas: int) -> t.Callable[[float], float]:
        """Replica ``i``'s online rate: the same day, shifted by ``i / replicas`` of a period."""
        day = online.diurnal(self.online_rate, self.amplitude, self.period)
        shift = self.period * replica / replicas
        return lambda now: day(now + shift)

    def expected_s(self, engine_start_s: float) -> float:
        """Wall time of the whole run, roughly: what the command prints before it starts."""
        arms = 1 + len(self.batch_arms)
        stacks = sum(2 if arm == fleet_report.SPLIT else 1 for arm in self.batch_arms)
        per_rep = arms * (self.window_s + DRAIN_S) + stacks * STACK_S
        return engine_start_s + self.reps * per_rep


@dataclasses.dataclass
class RepInputs:
    """What every arm of one repetition sends: the same online schedule per replica and the same batch."""

    online: list[list]  # per replica: workload.Request
    batch: list[dict]  # chat bodies


def start_replicas(
    request: EngineRequest, count: int, settings: Settings, out_dir: Path
) -> tuple[contextlib.ExitStack, list[BenchEngine]]:
    """``count`` engines, replica ``i`` bound to core ``i`` (unbound, both would share core 0); closing the
    returned ExitStack stops them, one after the other (two vLLM starts at once on 2 cores only slow each other)."""
    stack = contextlib.ExitStack()
    engines = []
    try:
        for i in range(count):
            log_path = out_dir / f"engine-{i}.log"
            env = {"VLLM_CPU_OMP_THREADS_BIND": str(i)}
            engines.append(stack.enter_context(started(request, settings, plugin=False, log_path=log_path, env=env)))
    except BaseException:
        stack.close()
        raise
    return stack, engines


def node_name(replica: int) -> str:
    return f"replica-{replica}"


class EngineCpu:
    """CPU seconds (user + system) used by one engine's processes: the server and its engine core."""

    def __init__(self, url: str):
        port = url.rsplit(":", 1)[1]
        mine = psutil.Process().children(recursive=True)
        servers = [p for p in mine if _has_port(p, port)]
        self.processes = [q for p in servers for q in (p, *p.children(recursive=True))]

    def seconds(self) -> float | None:
        if not self.processes:
            return None  # an engine given by URL: not ours to watch
        total = 0.0
        for p in self.processes:
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                total += times.user + times.system
        return total


def _has_port(process: psutil.Process, port: str) -> bool:
    with contextlib.suppress(psutil.Error):
        argv = process.cmdline()
        return any(a == "--port" and b == port for a, b in itertools.pairwise(argv))
    return False


class Fleet:
    """The experiment over two (or more) replicas, in ABBA order of the arms."""

    def __init__(
        self, plan: FleetPlan, engines: list[BenchEngine], settings: Settings, out_dir: Path, split_db: int
    ) -> None:
        self.plan = plan
        self.engines = engines
        self.settings = settings
        self.out_dir = out_dir
        self.split_dbs = [BENCH_REDIS_DB, split_db]
        self.cpu = [EngineCpu(e.url) for e in engines]
        self.prompts = Prompts(load_tokenizer(engines[0].tokenizer), plan.seed)
        self.rng = random.Random(plan.seed)
        self.inputs: dict[int, RepInputs] = {}
        self.arms: list[dict] = []

    def run(self, log: t.Callable[[str], None]) -> list[dict]:
        """Every arm in ABBA order; each arm's record is also written to fleet-partial.json as it ends, so a run
        that dies hours in keeps what it measured."""
        partial = self.out_dir / "fleet-partial.json"
        for rep, arm in fleet_report.arm_order(self.plan.reps, self.plan.batch_arms):
            log(f"[rep {rep + 1}/{self.plan.reps}] {arm}, {self.plan.window_s:.0f} s ...")
            self.arms.append(self.arm(rep, arm))
            partial.write_text(json.dumps(self.arms, default=str))
        for record in self.arms:
            if record["arm"] == fleet_report.BASELINE:
                continue
            baseline = next(a for a in self.arms if a["rep"] == record["rep"] and a["arm"] == fleet_report.BASELINE)
            for mine, base in zip(record["replicas"], baseline["replicas"]):
                mine["inflation"] = fleet_report.inflation(mine["records"], base["records"], record["span_s"])
        return self.arms

    def _inputs(self, rep: int) -> RepInputs:
        if rep not in self.inputs:
            count = len(self.engines)
            online_reqs = []
            for i in range(count):
                times = online.arrivals(
                    self.plan.rate_fn(i, count), self.plan.window_s, seed=self.rng.randrange(1 << 30)
                )
                online_reqs.append(online_requests(times, self.plan.workload, self.prompts, self.rng))
            batch = batch_requests(self.plan.batch_items, self.plan.workload, self.prompts, self.rng)
            self.inputs[rep] = RepInputs(online_reqs, [chat_body(self.engines[0].model, r) for r in batch])
        return self.inputs[rep]

    def _stacks(self, rep: int, arm: str, running: contextlib.ExitStack) -> list[tuple[TidalStack, list[int]]]:
        """The arm's Tidals, each with the metrics ports of its workers; none for the baseline."""
        urls = [e.url for e in self.engines]
        home = self.out_dir / f"stack-{arm}-{rep}"

        def tidal(k: int, replica: int) -> TidalStack:
            return running.enter_context(
                TidalStack(
                    self.settings,
                    urls[replica],
                    home / str(k),
                    max_inflight=self.plan.max_inflight,
                    extra_env={"TIDAL_NODE": node_name(replica)},
                    redis_db=self.split_dbs[k],
                )
            )

        if arm == fleet_report.PLACEMENT:
            stack = tidal(0, 0)
            ports = [stack.metrics_port]
            for i in range(1, len(urls)):
                ports.append(free_port())
                worker = stack.spawn_worker(
                    urls[i], node_name(i), max_inflight=self.plan.max_inflight, metrics_port=ports[-1]
                )
                running.callback(_stop, worker)
            return [(stack, ports)]
        if arm == fleet_report.SPLIT:
            return [(s, [s.metrics_port]) for s in (tidal(k, k) for k in range(len(urls)))]
        if arm == fleet_report.PINNING:
            stack = tidal(0, 0)
            return [(stack, [stack.metrics_port])]
        return []

    def arm(self, rep: int, arm: str) -> dict:
        """One arm of one repetition: Tidals up and their workers ready, then the online load and the batch
        start together and run for the window."""
        inputs = self._inputs(rep)
        record: dict[str, t.Any] = {
            "rep": rep,
            "arm": arm,
            "utc_start": provenance.utc_now(),
            "load_average_start": provenance.load_average(),
        }
        with contextlib.ExitStack() as running:
            stacks = self._stacks(rep, arm, running)
            _wait_ready([p for _, ports in stacks for p in ports])
            tmp = Path(running.enter_context(tempfile.TemporaryDirectory(prefix="tidal-fleet-")))
            clients = []
            for i, engine in enumerate(self.engines):
                (tmp / str(i)).mkdir()
                clients.append(OnlineClient(tmp / str(i), engine.url, engine.model, inputs.online[i]))
            for c in clients:
                c.ready()
            samplers = [running.enter_context(engine_stats.Sampler(e.url)) for e in self.engines]
            cpu_before = [c.seconds() for c in self.cpu]
            opens = time.monotonic() + LEAD_S
            for c in clients:
                c.start(opens)
            halves = fleet_report.split_evenly(inputs.batch, len(stacks)) if stacks else []
            submitted_s, done_s = _submit_and_follow(stacks, halves, opens, self.plan.window_s)
            cpu_after = [c.seconds() for c in self.cpu]
            records = [c.wait(timeout=900) for c in clients]
            for stack, _ in stacks:
                stack.cancel_all()
        for e in self.engines:
            engine_stats.wait_idle(e.url, timeout=300)
        finished = [d for d in done_s if d is not None]
        makespan = max(finished) if stacks and len(finished) == len(stacks) else None
        span = makespan or self.plan.window_s
        record.update(
            submitted_s=submitted_s,
            done_s=done_s,
            makespan_s=makespan,
            span_s=span,
            window_s=self.plan.window_s,
            batch_items=self.plan.batch_items if stacks else 0,
            replicas=[
                self._replica(i, samplers[i], opens, records[i], span, cpu_before[i], cpu_after[i])
                for i in range(len(self.engines))
            ],
            utc_end=provenance.utc_now(),
            load_average_end=provenance.load_average(),
        )
        record["batch_tokens_per_s"] = sum(r["batch_tokens"] for r in record["replicas"]) / span
        return record

    def _replica(
        self,
        i: int,
        sampler: engine_stats.Sampler,
        opens: float,
        records: list[dict],
        span: float,
        cpu_before: float | None,
        cpu_after: float | None,
    ) -> dict:
        at = [r.at - opens for r in sampler.readings]
        generated = [r.generation_tokens for r in sampler.readings]
        series = fleet_report.batch_series(at, generated, records, span, self.plan.interval)
        rate = self.plan.rate_fn(i, len(self.engines))
        rates = [rate(mid) for mid, _ in series]
        engine_tokens = fleet_report.interp(at, generated, span) - fleet_report.interp(at, generated, 0.0)
        batch_tokens = max(0.0, engine_tokens - fleet_report.online_tokens_between(records, 0.0, span))
        window = self.plan.window_s
        trace = self.engines[i].trace_path
        steps = Trace(trace).window(opens, opens + span) if trace else None
        return {
            "url": self.engines[i].url,
            "batch_tokens": batch_tokens,
            "r": fleet_report.pearson([v for _, v in series], rates),
            "answered_per_s": len(samples.ok(records)) / window,
            "offered_per_s": len(records) / window,
            "cpu_cores": (cpu_after - cpu_before) / window
            if cpu_before is not None and cpu_after is not None
            else None,
            "summary": samples.summary(records),
            "steps": steps.as_dict() if steps else None,
            "series": [{"t": mid, "online_rate": r, "batch_tokens_per_s": v} for (mid, v), r in zip(series, rates)],
            "metrics": [dataclasses.asdict(r) for r in sampler.readings],
            "records": records,
        }


def _submit_and_follow(
    stacks: list[tuple[TidalStack, list[int]]], halves: list[list[dict]], opens: float, window: float
) -> tuple[list[float], list[float | None]]:
    """Submit each Tidal its part of the batch at ``opens`` (in parallel), then follow each until its part is done
    or the window closes. Returns, per Tidal, seconds after ``opens`` when it was submitted and when it finished."""
    if (delay := opens - time.monotonic()) > 0:
        time.sleep(delay)
    submitted: list[float] = []
    if stacks:
        with concurrent.futures.ThreadPoolExecutor(len(stacks)) as pool:
            list(pool.map(lambda sh: sh[0][0].submit(sh[1]), zip(stacks, halves)))
        submitted = [time.monotonic() - opens] * len(stacks)
    done: list[float | None] = [None] * len(stacks)
    while (now := time.monotonic() - opens) < window:
        for k, ((stack, _), part) in enumerate(zip(stacks, halves)):
            if done[k] is None and stack.completed_items() >= len(part):
                done[k] = now
        if all(d is not None for d in done) and stacks:
            break
        time.sleep(0.5)
    if (rest := opens + window - time.monotonic()) > 0:
        time.sleep(rest)  # the online load runs the whole window whether or not the batch is done
    return submitted, done


def _wait_ready(ports: list[int]) -> None:
    """Block until every worker's /ready answers 200 (its store, Redis and engine checked): none starts late."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for port in ports:
        while True:
            try:
                requests.get(f"http://127.0.0.1:{port}/ready", timeout=5.0).raise_for_status()
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no worker ready on port {port} in {READY_TIMEOUT_S:.0f} s") from None
                time.sleep(0.5)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def plot(arms: list[dict], path: Path) -> None:
    """Per replica, the first repetition: its online rate and each batch arm's fill over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = {a["arm"]: a for a in arms if a["rep"] == 0}
    count = len(first[fleet_report.BASELINE]["replicas"])
    fig, axes = plt.subplots(count, 1, figsize=(9, 2.8 * count), sharex=True, squeeze=False)
    styles = {fleet_report.PLACEMENT: "-", fleet_report.SPLIT: "--", fleet_report.PINNING: ":"}
    for i, ax in enumerate(axes[:, 0]):
        series = first[fleet_report.BASELINE]["replicas"][i]["series"]
        ax.fill_between([p["t"] for p in series], [p["online_rate"] for p in series], color="tab:orange", alpha=0.25)
        ax.set_ylabel(f"replica {i}\nonline req/s")
        right = ax.twinx()
        for arm, style in styles.items():
            if arm not in first:
                continue
            pts = first[arm]["replicas"][i]["series"]
            r = first[arm]["replicas"][i]["r"]
            label = f"{arm} (r={r:+.2f})" if r is not None else arm
            right.plot([p["t"] for p in pts], [max(0.0, p["batch_tokens_per_s"]) for p in pts], style, label=label)
        right.set_ylabel("batch tokens/s")
        right.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds into the window (online rate shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
