"""Counters read from vLLM's /metrics, sampled over a run: generated tokens and budget fill."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
import typing as t

import requests
from prometheus_client.parser import text_string_to_metric_families


@dataclasses.dataclass
class Reading:
    at: float
    generation_tokens: float
    prompt_tokens: float
    iteration_tokens_sum: float
    iteration_count: float
    kv_usage: float
    running: float
    waiting: float
    prefix_queries: float
    prefix_hits: float
    finished: float  # requests finished (any reason), all time


#: The samples a Reading is made of, as vLLM's /metrics names them.
_NAMES = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "iteration_tokens_sum": "vllm:iteration_tokens_total_sum",
    "iteration_count": "vllm:iteration_tokens_total_count",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "finished": "vllm:request_success_total",
}


def named_totals(text: str, names: t.Collection[str]) -> dict[str, float]:
    """The values of ``names`` on a Prometheus page, each summed over its label sets (0 for one the page lacks), found
    by each line's name; the other lines are skipped unparsed and nothing is validated. What a sampler reads several
    times a second: the full parse of vLLM's page cost the dispatch benchmark a third of a core on the two it shares
    with what it measures."""
    values = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in values:  # `name{labels} value [timestamp]` or `name value [timestamp]`
            rest = line.rpartition("}")[2] if "{" in line else line.partition(" ")[2]
            values[name] += float(rest.split()[0])
    return values


def read(engine_url: str, timeout: float = 2.0) -> Reading:
    text = requests.get(f"{engine_url}/metrics", timeout=timeout).text
    values = named_totals(text, _NAMES.values())
    return Reading(at=time.monotonic(), **{field: values[name] for field, name in _NAMES.items()})


class Periodic:
    """``sample()`` every ``period`` seconds in a thread while the context lasts, and ``close_sample()`` on leaving
    it: the lifecycle every sampler of a run shares, so each says only what one reading is. A failed request is
    skipped (a busy server answers late: the next reading comes a period later); any other error ends the thread
    through ``failed``."""

    def __init__(self, period: float):
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """Take one reading and keep it."""
        raise NotImplementedError

    def close_sample(self) -> None:
        """The reading taken on leaving, after the thread has stopped."""
        self.sample()

    def failed(self, exc: Exception) -> None:
        """Raises ``exc`` in the thread (its traceback on stderr); override to keep it for the caller instead."""
        raise exc

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except requests.RequestException:
                pass
            except Exception as exc:
                self.failed(exc)
                return
            self._stop.wait(self.period)

    def __enter__(self) -> t.Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(requests.RequestException):
            self.close_sample()


class Sampler(Periodic):
    """Reads /metrics every ``period`` seconds in a thread until stopped."""

    def __init__(self, engine_url: str, period: float = 1.0, also: t.Callable[[], dict[str, float]] | None = None):
        super().__init__(period)
        self.engine_url = engine_url
        self.readings: list[Reading] = []
        self.also = also  # a second source read on the same clock (the worker's gate)
        self.also_readings: list[tuple[float, dict[str, float]]] = []

    def sample(self) -> None:
        self._read_engine()
        if self.also is not None:
            self.also_readings.append((self.readings[-1].at - self.readings[0].at, self.also()))

    def close_sample(self) -> None:
        """The engine alone: the second source is read only on the sampling clock."""
        self._read_engine()

    def _read_engine(self) -> None:
        self.readings.append(read(self.engine_url))


def budget_fill(readings: list[Reading], budget_tokens: int) -> list[tuple[float, float]]:
    """(seconds since start, tokens per step / budget) per sampling interval, from the iteration histogram."""
    out = []
    for a, b in itertools.pairwise(readings):
        steps = b.iteration_count - a.iteration_count
        if steps > 0:
            out.append(
                (b.at - readings[0].at, (b.iteration_tokens_sum - a.iteration_tokens_sum) / steps / budget_tokens)
            )
    return out


def generation_rate(readings: list[Reading], min_interval: float = 0.25) -> list[tuple[float, float]]:
    """(seconds since start, generated tokens/s) per sampling interval. Intervals under ``min_interval`` are
    left out: the closing read can come milliseconds after the last periodic one, and a rate over that is noise
    (a 3,700 % spike in one plot)."""
    return [
        (b.at - readings[0].at, (b.generation_tokens - a.generation_tokens) / (b.at - a.at))
        for a, b in itertools.pairwise(readings)
        if b.at - a.at >= min_interval
    ]


def delta(readings: list[Reading], field: str) -> float:
    return getattr(readings[-1], field) - getattr(readings[0], field) if len(readings) >= 2 else 0.0


def step_rate(readings: list[Reading]) -> dict:
    """Engine steps per second and mean tokens per step over the run: on a CPU the step time grows with the
    tokens in it, which is what bounds both the ceiling and online TBT."""
    if len(readings) < 2:
        return {}
    a, b = readings[0], readings[-1]
    steps = b.iteration_count - a.iteration_count
    elapsed = b.at - a.at
    return {
        "steps_per_s": steps / elapsed if elapsed else 0.0,
        "mean_step_ms": 1000 * elapsed / steps if steps else None,
        "tokens_per_step": (b.iteration_tokens_sum - a.iteration_tokens_sum) / steps if steps else None,
    }


def wait_idle(engine_url: str, timeout: float = 120.0) -> float:
    """Block until the engine has nothing running or waiting (leftovers of a phase would pollute the next).
    Returns the seconds waited."""
    started = time.monotonic()
    while True:
        r = read(engine_url)
        if r.running == 0 and r.waiting == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"engine at {engine_url} still busy after {timeout:.0f} s ({r.running} running)")
        time.sleep(0.5)


def read_plugin(metrics_url: str) -> dict[str, float]:
    """TidalScheduler's own series (``tidal_sched_*``), a labelled one kept per label value (``name:value``, as
    ``tidal_sched_mode:calm`` or ``tidal_sched_host_seconds:step``), so no two series add up to a figure neither is."""
    text = requests.get(metrics_url, timeout=2.0).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("tidal_sched_") or s.name.endswith("_created"):
                continue
            out[":".join([s.name, *s.labels.values()])] = s.value
    return out
