"""Technique B against A on real vLLM-CPU servers: online TBT beside a batch backlog (issue 7, item 3).

A is a stock engine (`tiny_engine`) with the backlog held to a fixed in-flight
limit, as the workers' gate would hold it; B is the same engine with
TidalScheduler loaded (`tiny_plugin_engine`, default settings) and the same
backlog. Batch requests carry long prompts that never share a prefix, so every
admission is a real prefill: the stock scheduler runs it whole in one step
(beside the online decodes), the plugin, with online traffic present, gives
batch at most its cap per step (25% of max_num_batched_tokens: its latency
model is not trusted on this CPU) and chunks the prefill.
"""
from __future__ import annotations

import pytest

from tidal_workers.bench import harvest as hv
from tidal_workers.bench import online

pytestmark = pytest.mark.engine

LANES = 2  # batch requests in flight: 2 x ~1,060 tokens fill about two thirds of the 3,072-token KV pool
BATCH_PROMPT = "Summarise this report: " + "tide data " * 100  # about 1,050 tokens with the chat template and number
BATCH_MAX_TOKENS = 8  # short outputs: a new prefill every few steps
SECONDS = 5.0  # per window
ROUNDS = 3  # A and B alternate (A B, B A, A B) so that drifting machine load hits both alike
RATE = 3.0  # online requests/s


def _window(engine) -> list[online.OnlineSample]:
    cfg = hv.HarvestConfig(engine_url=engine.url, model=engine.model, duration=SECONDS, online_rate=RATE,
                           online_max_tokens=48, batch_prompt=BATCH_PROMPT, batch_max_tokens=BATCH_MAX_TOKENS)
    return hv.online_beside_backlog(cfg, LANES)


# Two engine starts (about 25 s each on an idle machine, up to 240 s each at load averages of 20+) and
# about 45 s of measurement.
@pytest.mark.timeout(600)
@pytest.mark.xfail(strict=False, reason=(
    "not reliably met on the 2-core CPU engine: under a loaded machine B's online TBT p90 was worse than A's in "
    "3 of 3 attempts (83/10/11 ms against 3/3/6 ms); on the idle machine p90 split 1-1 (11.1 vs 17.7, 11.5 vs "
    "5.9 ms) while B's p99 was better in both (16.2 vs 42.4, 17.2 vs 42.7 ms). The CPU step's cost follows the "
    "step count, not its tokens (latency model R² 0.36-0.71: the plugin stays on its static cap). Issue 7 stays "
    "open; docs/benchmarks.md has the runs"))
def test_plugin_keeps_online_tbt_tighter_than_a_gated_stock_engine(tiny_engine, tiny_plugin_engine):
    samples: dict[str, list[online.OnlineSample]] = {"A": [], "B": []}
    for i in range(ROUNDS):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        for name in order:
            samples[name] += _window(tiny_engine if name == "A" else tiny_plugin_engine)
    q = {}
    for name, got in samples.items():
        assert got and all(s.error is None for s in got), [s.error for s in got if s.error][:3]
        gaps = [g for s in got for g in s.tbts]
        q[name] = {p: online.percentile(gaps, p) for p in (0.5, 0.9, 0.99)}
    print("online TBT ms beside the backlog: " + "; ".join(
        f"{name} " + " ".join(f"p{int(p * 100)} {v * 1000:.1f}" for p, v in qs.items()) for name, qs in q.items()))
    assert q["B"][0.9] <= q["A"][0.9], q
