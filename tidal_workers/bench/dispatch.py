"""`tidal bench dispatch`: does the gate's target turn into requests at the engine?

A fixed-time engine (``fixed_engine``) answers every request in the same time, so the only thing between the
gate's target and the requests the engine holds is Tidal's dispatch. Per scenario (engine time, max_tokens)
and repetition, in ABBA order:

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
import threading
import time
import typing as t
from pathlib import Path

import requests

from config import Settings
from tidal_workers.bench.fixed_engine import MODEL
from tidal_workers.bench.fixed_engine import FixedEngine
from tidal_workers.bench.histograms import HISTOGRAMS
from tidal_workers.bench.histograms import delta
from tidal_workers.bench.histograms import summarize_histogram
from tidal_workers.bench.stack import TidalStack
from tidal_workers.bench.stats import interval


@dataclasses.dataclass(frozen=True)
class Scenario:
    delay_ms: float
    max_tokens: int

    @property
    def name(self) -> str:
        return f"{self.delay_ms:g}ms-max{self.max_tokens}"

    @property
    def body(self) -> dict[str, t.Any]:
        """The one request both arms send: the closed loop straight to the engine, Tidal as every batch line."""
        return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": self.max_tokens}


@dataclasses.dataclass(frozen=True)
class DispatchConfig:
    scenarios: tuple[Scenario, ...] = (Scenario(250, 64), Scenario(30, 8))
    target: int = 8
    reps: int = 3
    window: float = 15.0  # seconds measured per run
    warmup: float = 3.0  # seconds of flow before the window opens


@dataclasses.dataclass(frozen=True)
class Window:
    """What the engine saw over one measured window."""

    held_mean: float  # time-weighted mean of requests at the engine
    answers_per_s: float

    @classmethod
    def measure(cls, engine: FixedEngine, seconds: float) -> Window:
        t0, area0, n0 = engine.occupancy.mark()
        time.sleep(seconds)
        t1, area1, n1 = engine.occupancy.mark()
        return cls((area1 - area0) / (t1 - t0), (n1 - n0) / (t1 - t0))


def closed_loop(engine: FixedEngine, cfg: DispatchConfig, scenario: Scenario) -> Window:
    """``target`` clients, each sending its next request the moment the last is answered."""
    stop = threading.Event()
    body = scenario.body

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


def tidal_run(stack: TidalStack, engine: FixedEngine, cfg: DispatchConfig, scenario: Scenario) -> dict[str, t.Any]:
    """One backlog batch through Tidal; the window opens once it flows and closes before the backlog runs out."""
    per_s = cfg.target / (scenario.delay_ms / 1000)
    items = int(per_s * (cfg.warmup + cfg.window) * 1.5) + 4 * cfg.target
    before_items = stack.completed_items()
    batch_id = stack.submit([scenario.body] * items)
    deadline = time.monotonic() + 300
    while stack.completed_items() == before_items:
        if time.monotonic() > deadline:
            raise TimeoutError("no batch item completed; see the worker log")
        time.sleep(0.2)
    time.sleep(cfg.warmup)
    first = stack.histograms()
    window = Window.measure(engine, cfg.window)
    last = stack.histograms()
    gate = stack.gate()
    stack.client.post(f"/v1/batches/{batch_id}/cancel", headers=stack.headers)
    stack.wait_done(batch_id, 300)
    while engine.occupancy.held:  # the next run starts on an idle engine
        time.sleep(0.05)
    return {
        "window": dataclasses.asdict(window),
        "gate_target": gate.get("tidal_gate_target"),
        "items_submitted": items,
        "histograms": {name: delta(last[name], first[name]) for name in HISTOGRAMS},
    }


def run_scenario(cfg: DispatchConfig, scenario: Scenario, settings: Settings, home: Path) -> dict[str, t.Any]:
    engine = FixedEngine(scenario.delay_ms / 1000)
    runs: list[dict[str, t.Any]] = []
    try:
        with TidalStack(
            settings, engine.url, home / scenario.name, gate_mode="fixed", max_inflight=cfg.target
        ) as stack:
            for rep in range(cfg.reps):
                order = ("A", "B") if rep % 2 == 0 else ("B", "A")  # ABBA: drift hits both alike
                pair: dict[str, t.Any] = {"rep": rep, "order": "".join(order)}
                for which in order:
                    if which == "A":
                        pair["tidal"] = tidal_run(stack, engine, cfg, scenario)
                    else:
                        pair["closed_loop"] = dataclasses.asdict(closed_loop(engine, cfg, scenario))
                runs.append(pair)
    finally:
        engine.close()
    return {"scenario": dataclasses.asdict(scenario), "runs": runs, "summary": summarize(runs, scenario)}


def summarize(runs: list[dict[str, t.Any]], scenario: Scenario) -> dict[str, t.Any]:
    """Means over repetitions with 95 % intervals; histograms pooled over the repetitions' windows."""
    fill = [r["tidal"]["window"]["held_mean"] / r["tidal"]["gate_target"] for r in runs if r["tidal"]["gate_target"]]
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
        "tidal_held_mean": interval([r["tidal"]["window"]["held_mean"] for r in runs]),
        "closed_loop_held_mean": interval([r["closed_loop"]["held_mean"] for r in runs]),
        "batch_tokens_per_s": interval([r["tidal"]["window"]["answers_per_s"] * scenario.max_tokens for r in runs]),
        "closed_loop_tokens_per_s": interval([r["closed_loop"]["answers_per_s"] * scenario.max_tokens for r in runs]),
        "tokens_per_s_ratio": interval(ratio),
        "dispatch": pooled,
    }
