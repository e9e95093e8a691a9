"""Open-loop online load sent straight to vLLM at priority 0, as chat clients would.

Arrivals follow a rate function (flat or diurnal) regardless of how fast the
server answers, so queueing shows up as latency instead of being hidden by a
closed loop. Each request streams, so time-to-first-token (TTFT) and the gaps
between tokens (TBT) are measured from the client's side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
import typing as t

import httpx

from tidal_workers.bench import sse
from tidal_workers.bench.stats import percentile


@dataclasses.dataclass
class OnlineSample:
    start: float  # seconds since the run began
    ttft: float | None  # None: the request failed
    tbts: list[float]
    tokens: int
    error: str | None = None


def flat(rate: float) -> t.Callable[[float], float]:
    return lambda _t: rate


def diurnal(mean: float, amplitude: float, period_s: float) -> t.Callable[[float], float]:
    """A day compressed into ``period_s``: mean·(1 + amplitude·sin), starting at the trough."""
    return lambda now: max(0.0, mean * (1 + amplitude * math.sin(2 * math.pi * now / period_s - math.pi / 2)))


def step(before: float, after: float, at_s: float) -> t.Callable[[float], float]:
    """``before`` requests/s until ``at_s``, ``after`` from then on: issue 36's instant (1 -> 8/s)."""
    return lambda now: before if now < at_s else after


def arrivals(rate_fn: t.Callable[[float], float], duration: float, seed: int = 7) -> list[float]:
    """Poisson arrival times for a time-varying rate, by thinning."""
    rng = random.Random(seed)
    peak = max(rate_fn(x * duration / 200) for x in range(201)) or 1e-9
    now, out = 0.0, list[float]()
    while True:
        now += rng.expovariate(peak)
        if now >= duration:
            return out
        if rng.random() < rate_fn(now) / peak:
            out.append(now)


async def _one(client: httpx.AsyncClient, url: str, body: dict, t0: float) -> OnlineSample:
    start = time.perf_counter()
    sample = OnlineSample(start=start - t0, ttft=None, tbts=[], tokens=0)
    last = None
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                sample.error = f"http {resp.status_code}"
                return sample
            async for chunk in sse.events(resp):
                if chunk.get("usage"):  # the last chunk (stream_options.include_usage): exact token count
                    sample.tokens = chunk["usage"].get("completion_tokens", 0)
                # Every chunk with a choice is a step that produced a token for this request; its text
                # may be empty (the tiny model's random bytes are held back until they decode).
                choices = chunk.get("choices") or []
                if not choices or (
                    set(choices[0].get("delta") or {}) == {"role", "content"} and not choices[0]["delta"]["content"]
                ):
                    continue  # no choice (the usage chunk), or the role-only header sent with the first token
                now = time.perf_counter()
                if last is None:
                    sample.ttft = now - start
                else:
                    sample.tbts.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        sample.error = type(exc).__name__
    return sample


def request_body(model: str, prompt: str, max_tokens: int) -> dict:
    """A streaming chat request at priority 0 that reports its usage and generates exactly ``max_tokens``."""
    return {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "priority": 0,
        "messages": [{"role": "user", "content": prompt}],
    }


async def run_online(
    engine_url: str,
    model: str,
    times: list[float],
    prompt: str | t.Sequence[str],
    max_tokens: int,
    timeout: float = 120.0,
) -> list[OnlineSample]:
    """Fire one streaming request at each arrival time; return every sample. A sequence of prompts gives request
    ``i`` prompt ``i`` (distinct prompts: no prefix-cache hits between them)."""
    prompts = [prompt] * len(times) if isinstance(prompt, str) else list(prompt)
    url = f"{engine_url}/v1/chat/completions"
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for at, text in zip(times, prompts, strict=True):
            delay = at - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(client, url, request_body(model, text, max_tokens), t0)))
        return list(await asyncio.gather(*tasks))


def summarize(samples: list[OnlineSample], duration: float) -> dict:
    ok = [(s, s.ttft) for s in samples if s.ttft is not None]
    ttfts = [ttft for _, ttft in ok]
    tbts = [g for s, _ in ok for g in s.tbts]
    # Tokens reach the client bunched (several in one read) when the API server or the client is short of
    # CPU, so on a shared machine the raw gaps' median can be ~0; end-to-end latency is immune to that.
    e2es = [ttft + sum(s.tbts) for s, ttft in ok]  # time to the last token: immune to bunching
    return {
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "ttft_p50": percentile(ttfts, 0.5),
        "ttft_p99": percentile(ttfts, 0.99),
        "tbt_p50": percentile(tbts, 0.5),
        "tbt_p90": percentile(tbts, 0.9),
        "tbt_p99": percentile(tbts, 0.99),
        "e2e_p50": percentile(e2es, 0.5),
        "e2e_p99": percentile(e2es, 0.99),
        "tokens_per_s": sum(s.tokens for s, _ in ok) / duration if duration else 0.0,
    }
