"""`tidal bench bound`: the most batch tokens/s a GPU profile can give beside an online load, at any latency.

Every token a step computes costs its linear layers 2·N FLOPs (N non-embedding parameters), so no schedule
computes more than F / (2·N) tokens a second (F the profile's achieved dense FLOP/s: ``tidal_engine.step_time``'s
roofline, whose other terms, the weight and KV reads, attention and the step overhead, only lower it). Online
traffic computes its prompts and outputs, ``rate · (prompt + output)`` tokens a second, whatever runs beside it.
Batch work gets the rest, and each generated batch token costs ``(prompt + output) / output`` computed tokens (its
share of its request's prefill, and itself). So:

    batch tokens/s ≤ (F / 2N − rate · (prompt_o + output_o)) · output_b / (prompt_b + output_b)

An upper bound on harvest at any TTFT or TBT inflation, for any scheduler, A or B: the goals' latency bounds
can only lower it. Lengths are the means of the benchmark's distributions (``workload.py``). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses

from tidal_engine.step_time import Profile
from tidal_workers.bench.workload import Workload


@dataclasses.dataclass(frozen=True)
class Mix:
    """Mean request lengths in tokens, and the online arrival rate."""

    online_rate: float  # requests/s
    online_prompt: float
    online_output: float
    batch_prompt: float
    batch_output: float

    @classmethod
    def of(cls, workload: Workload, online_rate: float) -> Mix:
        return cls(
            online_rate,
            workload.online_prompt.mean(),
            workload.online_output.mean(),
            workload.batch_prompt.mean(),
            workload.batch_output.mean(),
        )


@dataclasses.dataclass(frozen=True)
class ComputeBound:
    compute_tokens_per_s: float  # F / 2N: the most tokens any schedule computes a second
    online_tokens_per_s: float  # what the online stream computes
    batch_tokens_per_s: float  # the most batch tokens generated a second beside it
    alone_tokens_per_s: float  # the same with no online traffic: the bound on any all-batch ceiling

    @property
    def online_share(self) -> float:
        """The share of the GPU's compute the online stream takes."""
        return self.online_tokens_per_s / self.compute_tokens_per_s

    def harvest(self, ceiling_tokens_per_s: float) -> float:
        """The bound as a share of a measured ceiling (batch tokens/s with every slot batch)."""
        return self.batch_tokens_per_s / ceiling_tokens_per_s


def compute_bound(profile: Profile, mix: Mix) -> ComputeBound:
    compute = profile.flops / (2 * profile.non_embedding_params)
    online = mix.online_rate * (mix.online_prompt + mix.online_output)
    per_generated = (mix.batch_prompt + mix.batch_output) / mix.batch_output
    return ComputeBound(
        compute_tokens_per_s=compute,
        online_tokens_per_s=online,
        batch_tokens_per_s=max(compute - online, 0.0) / per_generated,
        alone_tokens_per_s=compute / per_generated,
    )
