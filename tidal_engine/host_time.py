"""The host's time in a step: what one cycle of the engine (a ``schedule()`` to the next) takes beyond T̂ of the step
it ran, as a fixed part and a part per request the step carried.

An online token waits the whole cycle: T̂, the forward's time, plus the host's (scheduling, the plugin's own plan,
each request's sampling and output). The relative budget priced T̂ alone, so a batch decode cost online more than
its KV read; and by Little's law the online requests running grow with the cycle, not the step, which the budget's
reference then took for online work (on the A6000 twin at 8/s, α_set 1.1: the mean step in the profile's time
1.13× online alone's, the host's time between steps 7.6 ms against 4.2 alone, online ITL p50 1.12×;
docs/engine.md, "The host's time"). So each cycle's residual, measured less T̂ of what the step scheduled, is
regressed on the requests it scheduled, and the budget charges the fitted part to every request it prices, the
reference's online ones included. Where the host's time overlaps the forward (async scheduling on a GPU) or is
nothing (the virtual clock), the fit finds about none and the budget is T̂'s.

Forgetting sums, so the fit follows the host as it is now. Pure: numbers in, seconds out.
"""

from __future__ import annotations

import dataclasses

FORGET = 0.999  # per cycle: ~1,000 cycles, 30-70 s of steps at 8 online requests/s on the A6000 twin
MIN_CYCLES = 100  # cycles seen before the fit is used: a cold engine charges no host time
STALL = 2.0  # a residual over this many times T̂ is a stall (a pause, a neighbour's burst), not the host's share


@dataclasses.dataclass(frozen=True)
class HostTime:
    """Seconds a cycle takes beyond T̂: ``per_step`` plus ``per_request`` for each request the step carries."""

    per_step: float = 0.0
    per_request: float = 0.0

    def seconds(self, requests: float) -> float:
        return self.per_step + self.per_request * requests


NONE = HostTime()  # a host that adds nothing: the virtual clock's, and a cold engine's


@dataclasses.dataclass
class HostFit:
    """Least squares of a cycle's residual on the requests it scheduled, over forgetting sums."""

    cycles: int = 0
    requests: float = 0.0  # Σ n
    residual: float = 0.0  # Σ r
    requests_sq: float = 0.0  # Σ n²
    cross: float = 0.0  # Σ n·r
    host: HostTime = NONE

    def observe(self, requests: int, residual: float, predicted: float) -> None:
        """One cycle: ``requests`` scheduled, taking ``residual`` seconds beyond its T̂ of ``predicted``."""
        if residual > STALL * predicted:
            return
        f = FORGET
        self.cycles += 1
        self.requests = f * self.requests + requests
        self.residual = f * self.residual + residual
        self.requests_sq = f * self.requests_sq + requests * requests
        self.cross = f * self.cross + requests * residual
        if self.cycles >= MIN_CYCLES:
            self.host = self._fitted()

    def _fitted(self) -> HostTime:
        """The line through the sums, neither part below zero (a host does not make steps shorter)."""
        w = (1 - FORGET**self.cycles) / (1 - FORGET)  # Σ of the cycles' weights
        mean_n, mean_r = self.requests / w, self.residual / w
        spread = self.requests_sq / w - mean_n * mean_n
        slope = (self.cross / w - mean_n * mean_r) / spread if spread > 1e-9 else 0.0
        slope = max(slope, 0.0)
        intercept = mean_r - slope * mean_n
        if intercept < 0:  # the line through the origin instead
            slope = max(self.cross / self.requests_sq, 0.0) if self.requests_sq > 0 else 0.0
            intercept = 0.0
        return HostTime(intercept, slope)
