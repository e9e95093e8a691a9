"""`tidal bench dispatch`: does the gate's target turn into requests at the engine?

A fixed-time engine (``fixed_engine``) answers every request in the same time, so the only thing between the
gate's target and the requests the engine holds is Tidal's dispatch. With ``engine="twin"`` the engine is the
GPU-timed twin instead (seed profile), whose requests take the GPU's time for their tokens, and the requests it
holds are read from its /metrics (running + waiting, sampled every 50 ms). Per scenario (engine time, max_tokens;
on the twin the time only sizes the backlog) and repetition, in ABBA order:

* **A, Tidal:** a backlog batch through the real API code and a real `tidal worker` (fixed gate at ``target``)
  and its ops worker; over a steady window, the engine's time-weighted mean of requests held, its answers/s
  (× max_tokens = batch tokens/s), and the worker's dispatch histograms (token freed → next POST, POST time,
  POST end → lease released) from its /metrics.
* **B, closed loop:** ``target`` threads POSTing back to back straight at the engine: the most that holding
  ``target`` requests can give.

Figures are means over repetitions with 95 % intervals; the raw per-repetition numbers are in the JSON.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import typing as t
from pathlib import Path

import requests

from config import Settings
from tidal_workers.bench import engine_stats
from tidal_workers.bench.engines import EngineRequest
from tidal_workers.bench.engines import started
from tidal_workers.bench.fixed_engine import FixedEngine
from tidal_workers.bench.histograms import HISTOGRAMS
from tidal_workers.bench.histograms import POST
from tidal_workers.bench.histograms import buckets
from tidal_workers.bench.histograms import delta
from tidal_workers.bench.histograms import quantile
from tidal_workers.bench.histograms import summarize_histogram
from tidal_workers.bench.histograms import sums
from tidal_workers.bench.stack import TidalStack
from tidal_workers.bench.stats import interval
from tidal_workers.bench.stats import ratio_of_means
from tidal_workers.bench.stats import ratio_text
from tidal_workers.bench.step_trace import Trace


@dataclasses.dataclass(frozen=True)
class Scenario:
    delay_ms: float
    max_tokens: int

    @property
    def name(self) -> str:
        return f"{self.delay_ms:g}ms-max{self.max_tokens}"

    def body(self, model: str) -> dict[str, t.Any]:
        """The one request both arms send: the closed loop straight to the engine, Tidal as every batch line
        (exactly ``max_tokens`` generated: a model's end-of-sequence is ignored)."""
        return {
            "model": model,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
        }


@dataclasses.dataclass(frozen=True)
class DispatchConfig:
    scenarios: tuple[Scenario, ...] = (Scenario(250, 64), Scenario(30, 8))
    target: int = 8
    reps: int = 3
    window: float = 15.0  # seconds measured per run
    warmup: float = 3.0  # seconds of flow before the window opens
    engine: str = "fixed"  # or "twin": the GPU-timed twin (``profile``)
    profile: str = "qwen2.5-7b@a6000"
    prefetch: int | None = None  # the worker's TIDAL_DISPATCH_PREFETCH; None: the settings' own


class Occupancy(t.Protocol):
    """Requests an engine holds over time: ``mark()`` is (now, request-seconds so far, answered so far)."""

    def mark(self) -> tuple[float, float, int]: ...

    @property
    def held(self) -> int: ...


class Target(t.Protocol):
    """The engine both arms send to."""

    @property
    def url(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def occupancy(self) -> Occupancy: ...

    @property
    def trace(self) -> Trace | None: ...


class SampledOccupancy:
    """A vLLM engine's requests (running + waiting) from its /metrics, read every ``period`` seconds: the same
    integral as the fixed engine keeps, stepwise between readings. Five readings a second (60 in a 12-s window)
    are plenty for a mean; at twenty, rendering the page took the twin's API server more time than its chat
    requests, on the cores it shares with the worker being measured."""

    def __init__(self, url: str, period: float = 0.2):
        self.sampler = engine_stats.Sampler(url, period)

    def __enter__(self) -> SampledOccupancy:
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)

    def mark(self) -> tuple[float, float, int]:
        readings = list(self.sampler.readings)
        return readings[-1].at, held_area(readings), int(readings[-1].finished)

    @property
    def held(self) -> int:
        last = self.sampler.readings[-1]
        return int(last.running + last.waiting)


def held_area(readings: t.Sequence[engine_stats.Reading]) -> float:
    """Request-seconds: each reading's running + waiting held until the next reading."""
    return sum((b.at - a.at) * (a.running + a.waiting) for a, b in itertools.pairwise(readings))


@dataclasses.dataclass
class TwinTarget:
    url: str
    model: str
    occupancy: SampledOccupancy
    trace: Trace | None


@dataclasses.dataclass(frozen=True)
class Window:
    """What the engine saw over one measured window."""

    held_mean: float  # time-weighted mean of requests at the engine
    answers_per_s: float
    steps: dict[str, t.Any] | None  # the twin's steps in the window (step_trace.py); None for the fixed engine

    @classmethod
    def measure(cls, engine: Target, seconds: float) -> Window:
        t0, area0, n0 = engine.occupancy.mark()
        mark = engine.trace.mark() if engine.trace else 0
        time.sleep(seconds)
        t1, area1, n1 = engine.occupancy.mark()
        steps = engine.trace.window(t0, t1, since=mark) if engine.trace else None
        return cls((area1 - area0) / (t1 - t0), (n1 - n0) / (t1 - t0), steps.as_dict() if steps else None)


def closed_loop(engine: Target, cfg: DispatchConfig, scenario: Scenario) -> Window:
    """``target`` clients, each sending its next request the moment the last is answered."""
    stop = threading.Event()
    body = scenario.body(engine.model)

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                session.post(engine.url + "/v1/chat/completions", json=body, timeout=60)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(cfg.target)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(cfg.warmup)
        return Window.measure(engine, cfg.window)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)


def tidal_run(stack: TidalStack, engine: Target, cfg: DispatchConfig, scenario: Scenario) -> dict[str, t.Any]:
    """One backlog batch through Tidal; the window opens once it flows and closes before the backlog runs out."""
    per_s = cfg.target / (scenario.delay_ms / 1000)
    items = int(per_s * (cfg.warmup + cfg.window) * 1.5) + 4 * cfg.target
    before_items = stack.completed_items()
    batch_id = stack.submit([scenario.body(engine.model)] * items)
    deadline = time.monotonic() + 300
    while stack.completed_items() == before_items:
        if time.monotonic() > deadline:
            raise TimeoutError("no batch item completed; see the worker log")
        time.sleep(0.2)
    time.sleep(cfg.warmup)
    first, opened = stack.metrics_page(), time.monotonic()
    window = Window.measure(engine, cfg.window)
    last, closed = stack.metrics_page(), time.monotonic()
    buckets_first, buckets_last = buckets(first), buckets(last)
    gate = stack.gate()
    stack.client.post(f"/v1/batches/{batch_id}/cancel", headers=stack.headers)
    stack.wait_done(batch_id, 300)
    while engine.occupancy.held:  # the next run starts on an idle engine
        time.sleep(0.05)
    return {
        "window": dataclasses.asdict(window),
        "sent_mean": (sums(last)[POST] - sums(first)[POST]) / (closed - opened),
        "gate_target": gate.get("tidal_gate_target"),
        "items_submitted": items,
        "histograms": {name: delta(buckets_last[name], buckets_first[name]) for name in HISTOGRAMS},
    }


def run_scenario(cfg: DispatchConfig, scenario: Scenario, engine: Target, settings: Settings, home: Path) -> dict:
    runs: list[dict[str, t.Any]] = []
    if cfg.prefetch is not None:
        settings = settings.replace(dispatch_prefetch=cfg.prefetch)
    with TidalStack(settings, engine.url, home / scenario.name, gate_mode="fixed", max_inflight=cfg.target) as stack:
        for rep in range(cfg.reps):
            order = (
                ("tidal", "closed_loop") if rep % 2 == 0 else ("closed_loop", "tidal")
            )  # ABBA: drift hits both alike
            pair: dict[str, t.Any] = {"rep": rep, "order": ",".join(order)}
            for which in order:
                if which == "tidal":
                    pair["tidal"] = tidal_run(stack, engine, cfg, scenario)
                else:
                    pair["closed_loop"] = dataclasses.asdict(closed_loop(engine, cfg, scenario))
            runs.append(pair)
    return {"scenario": dataclasses.asdict(scenario), "runs": runs, "summary": summarize(runs, scenario)}


def run(cfg: DispatchConfig, settings: Settings, home: Path) -> list[dict[str, t.Any]]:
    """Every scenario: each on a fixed engine of its own time, or all on one twin (started here, stopped after)."""
    if cfg.engine == "fixed":
        results = []
        for scenario in cfg.scenarios:
            fixed = FixedEngine(scenario.delay_ms / 1000)
            try:
                results.append(run_scenario(cfg, scenario, fixed, settings, home))
            finally:
                fixed.close()
        return results
    request = EngineRequest("twin", cfg.profile, 0)
    with (
        started(request, settings, plugin=False, log_path=home / "twin.log") as twin,
        SampledOccupancy(twin.url) as occupancy,
    ):
        target = TwinTarget(twin.url, twin.model, occupancy, Trace(twin.trace_path) if twin.trace_path else None)
        return [run_scenario(cfg, scenario, target, settings, home) for scenario in cfg.scenarios]


def summarize(runs: list[dict[str, t.Any]], scenario: Scenario) -> dict[str, t.Any]:
    """Means over repetitions with 95 % intervals; histograms pooled over the repetitions' windows."""
    targeted = [r for r in runs if r["tidal"]["gate_target"]]
    fill = [r["tidal"]["window"]["held_mean"] / r["tidal"]["gate_target"] for r in targeted]
    sent = [r["tidal"]["sent_mean"] / r["tidal"]["gate_target"] for r in targeted]
    held_vs_loop = [r["tidal"]["window"]["held_mean"] / r["closed_loop"]["held_mean"] for r in runs]
    ratio = [r["tidal"]["window"]["answers_per_s"] / r["closed_loop"]["answers_per_s"] for r in runs]
    pooled: dict[str, dict[str, float | None]] = {}
    for name in HISTOGRAMS:
        summed: dict[float, float] = {}
        for r in runs:
            for le, count in r["tidal"]["histograms"][name]:
                summed[le] = summed.get(le, 0.0) + count
        pooled[name] = summarize_histogram(sorted(summed.items()))
    return {
        "engine_held_over_target": interval(fill),
        "sent_over_target": interval(sent),
        "engine_held_over_closed_loop": interval(held_vs_loop),
        "tidal_held_mean": interval([r["tidal"]["window"]["held_mean"] for r in runs]),
        "closed_loop_held_mean": interval([r["closed_loop"]["held_mean"] for r in runs]),
        "batch_tokens_per_s": interval([r["tidal"]["window"]["answers_per_s"] * scenario.max_tokens for r in runs]),
        "closed_loop_tokens_per_s": interval([r["closed_loop"]["answers_per_s"] * scenario.max_tokens for r in runs]),
        "tokens_per_s_ratio": interval(ratio),
        "dispatch": pooled,
    }


#: The medians ``compare`` reads from each repetition's dispatch histograms, by the name it gives them (ms).
COMPARED = {
    "release_p50_ms": "tidal_dispatch_release_seconds",
    "token_to_post_p50_ms": "tidal_dispatch_token_to_post_seconds",
}


def _p50_ms(run: dict[str, t.Any], histogram: str) -> float | None:
    p50 = quantile([(float(le), count) for le, count in run["tidal"]["histograms"][histogram]], 0.5)
    return p50 * 1000 if p50 is not None else None


def compare(old: t.Sequence[dict[str, t.Any]], new: t.Sequence[dict[str, t.Any]]) -> dict[str, t.Any]:
    """Two versions of the code, each run as whole ``tidal bench dispatch`` commands in ABBA order: per scenario and
    figure (``COMPARED``), each arm's per-repetition values and mean with its 95 % interval, and new ÷ old with its
    interval (``stats.ratio_of_means``) and its verdict ("no measurable change" when the interval spans 1.0)."""
    runs: dict[str, dict[str, list[dict[str, t.Any]]]] = {}
    for arm, docs in (("old", old), ("new", new)):
        for doc in docs:
            for result in doc["scenarios"]:
                name = Scenario(**result["scenario"]).name
                runs.setdefault(name, {"old": [], "new": []})[arm] += result["runs"]
    out: dict[str, t.Any] = {}
    for name, arms in runs.items():
        figures: dict[str, t.Any] = {}
        for figure, histogram in COMPARED.items():
            samples = {arm: [v for r in rs if (v := _p50_ms(r, histogram)) is not None] for arm, rs in arms.items()}
            ratio = ratio_of_means(samples["old"], samples["new"])
            figures[figure] = {
                "old": interval(samples["old"]),
                "new": interval(samples["new"]),
                "new_over_old": ratio.as_dict(),
                "verdict": ratio_text(ratio),
                "samples": samples,
            }
        out[name] = figures
    return out
