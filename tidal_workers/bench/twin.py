"""`tidal bench twin`: does the timed twin step at its profile's T(P, C), and what does it cost in CPU?

Fidelity is measured on the whole engine step, not inside ``forward()`` (where it is a sleep): the interval
from one step's start to the next one's, read from the twin's step trace (``twin_model.TRACE_COLUMNS``), for
steps of the grid's shapes (``GRID``), each step against its own T(P, C). A step starts when the model
runner enters ``forward()``; in a synchronous engine the interval between two starts is one whole loop of
the engine core (output processing, scheduling, input preparation, forward), the same period as from one
step's scheduling to the next.

Each cell makes its steps with requests of exact token lengths (token-id prompts, ``ignore_eos``): a decode
cell runs n requests with c cached tokens each to their end, a prefill cell sends one request whose last
prompt chunk is P tokens after C cached ones (C a multiple of τ), followed at once by its decode step.

The floor of a step is what the twin cannot go below on this machine: the tiny model's real forward plus
the engine's own work outside it. A profile's cell is attainable here when its T(P, C) is above the floor.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import threading
import time
import typing as t
from pathlib import Path

import numpy as np
import psutil
import requests

from tidal_engine.step_time import Profile
from tidal_engine.step_time import decode_seconds
from tidal_engine.step_time import prefill_seconds
from tidal_workers.bench.stats import TooFewRepetitions
from tidal_workers.bench.stats import bootstrap
from tidal_workers.bench.step_trace import Row
from tidal_workers.bench.step_trace import Trace
from tidal_workers.bench.step_trace import is_overrun

VOCAB = 256  # the byte symbols of the twin's tokenizer: any of them is an ordinary token
TOLERANCE = 0.10  # the fidelity bound at p50
TAU = 2048  # every profile's max_num_batched_tokens
MAX_MODEL_LEN = 16384  # the longest prefill cell's prompt (8,192) plus its two tokens


@dataclasses.dataclass(frozen=True)
class Cell:
    kind: str  # "decode": n requests, one token each, c cached each; "prefill": one chunk of P after C cached
    tokens: int  # decode: requests n; prefill: P
    context: int  # decode: cached tokens per request (at the first decode step); prefill: C

    @property
    def label(self) -> str:
        return (
            f"{self.kind}(n={self.tokens}, c={self.context})"
            if self.kind == "decode"
            else (f"prefill(P={self.tokens}, C={self.context})")
        )

    def nominal_seconds(self, profile: Profile) -> float:
        if self.kind == "decode":
            return decode_seconds(profile, self.tokens, self.context)
        return prefill_seconds(profile, self.tokens, self.context)

    def selects(self, row: dict[str, float]) -> bool:
        if self.kind == "decode":
            return row["num_reqs"] == self.tokens and row["num_tokens"] == self.tokens
        return row["num_reqs"] == 1 and row["num_tokens"] == self.tokens and row["context"] == self.context


GRID = (
    Cell("decode", 1, 512),
    Cell("decode", 16, 1024),
    Cell("decode", 64, 1024),
    Cell("decode", 256, 512),
    Cell("prefill", 512, 0),
    Cell("prefill", 2048, 0),
    Cell("prefill", 2048, 2048),
    Cell("prefill", 2048, 6144),
)


def _prompt(rng: np.random.Generator, length: int) -> list[int]:
    """Random token ids: distinct prompts, so nothing is a prefix-cache hit."""
    return [int(x) for x in rng.integers(0, VOCAB, length)]


def _complete(
    url: str, model: str, prompt: list[int], max_tokens: int, priority: int = 0, timeout: float = 600
) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
    response = requests.post(f"{url}/v1/completions", json=body, timeout=timeout)
    response.raise_for_status()


def drive_cell(url: str, model: str, cell: Cell, steps: int, rng: np.random.Generator) -> None:
    """Make about ``steps`` steps of the cell's shape on the engine.

    A decode cell's requests are admitted over the steps their prefills take (n·c tokens, at most τ − n
    per step beside the decodes);
    each generates for that long and ``steps`` more, so that the last ``steps`` decode all n together.
    """
    if cell.kind == "decode":
        prompts = [_prompt(rng, cell.context) for _ in range(cell.tokens)]
        ramp = -(-cell.tokens * cell.context // (TAU - cell.tokens)) + 2  # decodes share τ with the prefills
        with concurrent.futures.ThreadPoolExecutor(cell.tokens) as pool:
            list(pool.map(lambda p: _complete(url, model, p, ramp + steps), prompts))
        return
    for _ in range(steps):
        _complete(url, model, _prompt(rng, cell.context + cell.tokens), 2)


def read_trace(path: Path) -> list[Row]:
    return Trace(path).rows()


@dataclasses.dataclass
class StepSample:
    interval_s: float  # this step's start to the next one's
    target_s: float  # T(P, C) of this step
    floor_s: float  # its real forward plus the engine's time outside forward
    overrun: bool  # the twin could not slow this step down to its target


def cell_samples(rows: list[dict[str, float]], start: float, end: float, cell: Cell) -> list[StepSample]:
    """Steps of the cell's shape that started in [start, end], each with the next step following it."""
    window = [r for r in rows if start <= r["started_s"] <= end]
    samples = []
    for row, following in itertools.pairwise(window):
        if cell.selects(row):
            samples.append(
                StepSample(
                    interval_s=following["started_s"] - row["started_s"],
                    target_s=row["target_s"],
                    floor_s=row["forward_s"] + row["outside_s"],
                    overrun=is_overrun(row),
                )
            )
    return samples


def fidelity(
    url: str, model: str, trace: Path, grid: t.Sequence[Cell], reps: int, steps: int, seed: int = 0
) -> dict[str, list[list[StepSample]]]:
    """Per cell, per repetition: the sampled steps."""
    rng = np.random.default_rng(seed)
    results: dict[str, list[list[StepSample]]] = {c.label: [] for c in grid}
    for _ in range(reps):
        for cell in grid:
            start = time.monotonic()
            drive_cell(url, model, cell, steps, rng)
            time.sleep(0.2)  # the trace line of the last step is written after its sleep
            results[cell.label].append(cell_samples(read_trace(trace), start, time.monotonic(), cell))
    return results


def interval(per_rep: list[float]) -> dict[str, t.Any]:
    """The mean over repetitions with its bootstrap interval (bench.stats), or the refusal under 3 repetitions."""
    try:
        return bootstrap(per_rep).as_dict()
    except TooFewRepetitions as exc:
        return {"refused": str(exc)}


def summarize_cell(cell: Cell, reps: list[list[StepSample]], profiles: t.Sequence[Profile]) -> dict[str, t.Any]:
    """Per repetition the p50 of interval ÷ T over the cell's steps; their mean with a 95 % interval."""
    pooled = [s for rep in reps for s in rep]
    per_rep = [float(np.median([s.interval_s / s.target_s for s in rep])) for rep in reps if rep]
    ratio = interval(per_rep)
    floors = [s.floor_s for s in pooled]
    floor_p90 = float(np.percentile(floors, 90)) if floors else None
    return {
        "cell": dataclasses.asdict(cell),
        "steps": len(pooled),
        "interval_over_target_p50": ratio,
        "per_rep_p50": per_rep,
        "within_tolerance": "value" in ratio and abs(ratio["value"] - 1.0) <= TOLERANCE,
        "overrun_fraction": (sum(s.overrun for s in pooled) / len(pooled)) if pooled else None,
        "floor_s_p50": float(np.median(floors)) if floors else None,
        "floor_s_p90": floor_p90,
        "attainable": {
            p.name: {
                "T_s": cell.nominal_seconds(p),
                "attainable": floor_p90 is not None and cell.nominal_seconds(p) > floor_p90,
            }
            for p in profiles
        },
        "raw": [[dataclasses.asdict(s) for s in rep] for rep in reps],
    }


# --- CPU use under the seed's load ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    online_rate: float = 20.0  # requests/s, open loop
    online_prompt: int = 256
    online_max_tokens: int = 128
    batch_lanes: int = 48  # batch requests kept in flight (the GPU harvest's lanes)
    batch_prompt: int = 1024
    batch_max_tokens: int = 256
    warmup_s: float = 5.0
    window_s: float = 5.0  # CPU use is sampled per window


def _stream(url: str, model: str, prompt: list[int], max_tokens: int) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "priority": 0,
        "stream": True,
    }
    with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=600) as response:
        response.raise_for_status()
        for _ in response.iter_lines():
            pass


def twin_processes(server_pid: int) -> dict[str, list[psutil.Process]]:
    """The API server and its children (the engine core and, on this build, its model-runner worker)."""
    server = psutil.Process(server_pid)
    groups: dict[str, list[psutil.Process]] = {"api_server": [server], "engine_core": [], "worker": []}
    for child in server.children(recursive=True):
        name = child.name()
        key = "worker" if "Worker" in name else "engine_core" if "EngineCore" in name else "api_server"
        groups[key].append(child)
    return groups


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_use(url: str, model: str, server_pid: int, cfg: LoadConfig, duration: float, seed: int = 0) -> dict[str, t.Any]:
    """Cores used by each of the twin's processes, per window, under online arrivals plus a batch backlog."""
    rng, arrival_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1000)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def prompt(n: int) -> list[int]:
        with lock:
            return _prompt(rng, n)

    def batch_lane() -> None:
        while not stop.is_set():
            try:
                _complete(url, model, prompt(cfg.batch_prompt), cfg.batch_max_tokens, priority=10)
            except requests.RequestException as exc:
                errors.append(repr(exc))

    def online() -> None:
        try:
            _stream(url, model, prompt(cfg.online_prompt), cfg.online_max_tokens)
        except requests.RequestException as exc:
            errors.append(repr(exc))

    groups = twin_processes(server_pid)
    windows: dict[str, list[float]] = {k: [] for k in [*groups, "total"]}
    lanes = [threading.Thread(target=batch_lane, daemon=True) for _ in range(cfg.batch_lanes)]
    pool = concurrent.futures.ThreadPoolExecutor(256)
    try:
        for lane in lanes:
            lane.start()
        started = time.monotonic()
        end = started + cfg.warmup_s + duration
        next_window = started + cfg.warmup_s
        marks: dict[str, float] | None = None
        arrivals = started
        while True:
            now = time.monotonic()
            if now >= next_window:
                cpu = {k: _cpu_seconds(v) for k, v in groups.items()}
                if marks is not None:
                    span = now - marks["_t"]
                    for k in groups:
                        windows[k].append((cpu[k] - marks[k]) / span)
                    windows["total"].append(sum(cpu[k] - marks[k] for k in groups) / span)
                marks = {**cpu, "_t": now}
                next_window += cfg.window_s
            if now >= end:
                break
            if now >= arrivals:
                pool.submit(online)
                arrivals += arrival_rng.exponential(1.0 / cfg.online_rate)
            time.sleep(max(min(arrivals, next_window) - time.monotonic(), 0.0))
    finally:
        stop.set()
        # Arrivals not yet sent are dropped; requests in flight end on their own (the engine outlives them).
        pool.shutdown(wait=False, cancel_futures=True)
    return {"cores_per_window": windows, "errors": errors[:20], "num_errors": len(errors)}


def summarize_cpu(reps: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    """Per process group, cores used: each repetition's mean over its windows; their mean with a 95 % interval."""
    keys = reps[0]["cores_per_window"].keys() if reps else []
    return {k: interval([float(np.mean(rep["cores_per_window"][k])) for rep in reps]) for k in keys}


def report(results: dict[str, t.Any]) -> dict[str, t.Any]:
    """The figures without the raw samples: per cell the p50 ratio with its interval, overruns, attainability."""
    cells = {
        c["cell"]["kind"] + f"({c['cell']['tokens']}, {c['cell']['context']})": {
            "steps": c["steps"],
            "p50_interval_over_T": c["interval_over_target_p50"],
            "within_10pct": c["within_tolerance"],
            "overrun_fraction": c["overrun_fraction"],
            "floor_ms_p90": None if c["floor_s_p90"] is None else round(1000 * c["floor_s_p90"], 2),
            "attainable": {k: v["attainable"] for k, v in c["attainable"].items()},
        }
        for c in results.get("cells", [])
    }
    return {
        "profile": results["profile"]["name"],
        "cells": cells,
        "cpu_cores": results.get("cpu", {}).get("cores"),
        "overruns": results.get("overruns"),
    }
