"""The gate's latency target (issue 36): batch requests at the engine sized so that online inter-token latency
stays within ``alpha_set`` of what online work alone would see.

On a stock vLLM every running request gets one token per step, so the engine's mean inter-token latency (ITL) over
a scrape period is the online ITL. Between two scrapes the gate reads it from vLLM's
``vllm:inter_token_latency_seconds`` histogram (sum and count deltas). Locally ITL grows linearly in the batch
working set O (each batch decode adds its KV read and its share of the step): ITL ≈ r + s·O, with r the
online-alone reference. Then inflation = ITL ÷ r and the working set that meets the budget is

    O* = O · (alpha_set − 1) ÷ (inflation − 1)

(the slope s read off the point itself, (ITL − r) ÷ O). Above the budget the target drops to O* at once (at most
halving in a period, so one bad reading cannot empty the engine), and no further while the engine still holds
more than the target: a cut reaches the engine only as admitted requests finish, and cutting again for the same
excess would undershoot. Below it the target climbs by half the gap, at
least one and at most half again: increases sized to the gap, not one a second, and each only once the smoothed
working set has caught up with the last (``next_target``). Inflation and O are smoothed
alike (``SMOOTHING``) before O* is read off them.

The reference r is given (``TIDAL_GATE_REFERENCE_ITL_MS``: a constant, so right at the online load it was taken
at), or the engine's profile's at the online load it serves (``TIDAL_GATE_PROFILE``: profile_reference.py), or
estimated by regressing ITL on O down to O = 0, with exponential forgetting (``ItlFit``): a busy node rarely sees a
period with no batch work, but the gate's own moves spread O enough to fit. Until the fit has that spread (``MIN_SPREAD``
requests of standard deviation) the reference is unknown and the gate grows as the KV rule lets it, which makes
the spread.

The fit has no online term. The online requests running are not the online load but a consequence of the
latency: by Little's law they grow with the step time the batch causes. Taken as a regressor they explained the
batch's cost as online load, and the reference swung with ITL itself (17-55 ms on the A6000 twin at 8 requests/s,
where online alone stepped 41 ms; replayed from the frontier's second sitting). Without it a change of the online
rate moves the intercept only as forgetting lets (~100 readings): a rise reads as inflation and cuts the batch
(safe, at a cost in harvest), a fall reads as room for a while.

Online waiting is not a cut here: an open-loop arrival stream waits a step in its normal course; its cost shows
in the ITL it causes. KV pressure and preemptions still halve (aimd.py).

Pure: readings in, a target out.
"""

from __future__ import annotations

import dataclasses
import math

FORGET = 0.99  # per reading: a reading ~100 periods old weighs a third of a new one
MIN_SPREAD = 2.0  # requests: the fit's weighted standard deviation of O before its intercept is trusted
GAIN_UP = 0.5  # share of the gap to O* closed in one period when under the budget
MAX_CUT = 0.5  # the most one period removes, as a share of the target
MAX_GROWTH = 0.5  # the most one period adds, as a share of the target (at least one)
# Weight of one period's reading in the smoothed inflation: a second's mean ITL swings ±10-15 % with the prefills
# that land in it (an online prompt's step is twice a decode step), and the gate saw that swing as its signal
# (the first real run sawed 1 ↔ 12 requests at α_set 1.05); ~5 periods still answer a step of the online load.
SMOOTHING = 0.2
# With the engine's profile the target follows the profile's inflation and O* (profile_reference.py), which carry
# none of a period's noise, unless the measured inflation reads this far over α_set: then a step of the online load
# or a batch the profile misprices is news the profile has not yet priced, and the measured point rules.
GUARD = 0.25


@dataclasses.dataclass(frozen=True)
class ItlFit:
    """Exponentially weighted least squares of ITL = r + s·O, kept as the weighted sums its normal equations need
    (O: the batch working set)."""

    weight: float = 0.0
    sum_o: float = 0.0
    sum_oo: float = 0.0
    sum_itl: float = 0.0
    sum_o_itl: float = 0.0

    def add(self, working_set: float, itl: float, forget: float = FORGET) -> ItlFit:
        o = working_set
        return ItlFit(
            forget * self.weight + 1.0,
            forget * self.sum_o + o,
            forget * self.sum_oo + o * o,
            forget * self.sum_itl + itl,
            forget * self.sum_o_itl + o * itl,
        )

    def reference(self) -> float | None:
        """r, the fitted ITL with no batch work; None until O has spread ``MIN_SPREAD`` or when ITL does not rise
        with O (then the fit says nothing about the batch's cost)."""
        if self.weight <= 0:
            return None
        mean_o, mean_itl = self.sum_o / self.weight, self.sum_itl / self.weight
        variance = self.sum_oo / self.weight - mean_o**2
        if variance < MIN_SPREAD**2:
            return None
        slope = (self.sum_o_itl / self.weight - mean_o * mean_itl) / variance
        r = mean_itl - slope * mean_o
        return r if slope > 0 and r > 0 else None


def budget_working_set(working_set: float, inflation: float, alpha_set: float) -> float:
    """O*, the batch requests at the engine at which inflation would be ``alpha_set`` (module docstring); infinite
    where the batch shows no cost (inflation ≤ 1)."""
    if inflation <= 1.0:
        return math.inf
    return working_set * (alpha_set - 1.0) / (inflation - 1.0)


def next_target(
    target: int,
    smoothed_set: float,
    inflation: float,
    alpha_set: float,
    lo: int,
    hi: int,
    wanted: float | None = None,
) -> int:
    """The target after one period: ``inflation`` and ``smoothed_set`` (O) smoothed alike, so that O* reads the
    slope off one consistent point; or O* ``wanted`` as the engine's profile prices it (profile_reference.py).

    It grows only once the smoothed working set has reached the target: until then the smoothed inflation still
    describes fewer requests than the last growth allowed, and growing on it again compounds the step before its
    cost is seen (on the twin at 5/s the target sawed 3 ↔ 15 in ~20 s periods, growing half again each second)."""
    wanted = budget_working_set(smoothed_set, inflation, alpha_set) if wanted is None else wanted
    if inflation > alpha_set:
        cut = min(target, max(math.floor(wanted), math.ceil(target * (1 - MAX_CUT)), lo))
        if cut == target and smoothed_set <= target and target > lo:
            cut -= 1  # at the target, settled there, and still over: one less (O* rounds to it)
        return cut  # while the engine still drains what a cut allowed before (O > target), no further cut
    gap = wanted - target  # infinite where the batch shows no cost: then half again at the most
    step = max(1, math.floor(min(GAIN_UP * gap, MAX_GROWTH * max(target, 2)))) if gap >= 1 else 0
    if smoothed_set < target - 1:  # the engine does not hold what the target allows, or not for long enough
        step = 0
    return max(lo, min(hi, target + step))
