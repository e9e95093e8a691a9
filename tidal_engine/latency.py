"""The step-latency model: how long a step of P tokens over C resident tokens takes.

    T̂(P, C) = k1·P + k2·P·(P + C) + k4·(P + C) + k5

k1 is the per-token MLP cost, k2 the attention cost of P queries over P + C
keys, k4 the per-resident-token cost of reading KV, k5 the fixed step cost.
It is fitted by least squares over a rolling window of observed steps; the
batch cap X is then the most batch tokens a step can carry while its predicted
time stays inside the budget. Pure: numpy only, no clock, no I/O.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

# Tokens are scaled to thousands before fitting so that P·(P + C) stays near 1
# and the normal equations are well conditioned.
TOKEN_SCALE = 1e-3


def features(num_tokens: npt.ArrayLike, context: npt.ArrayLike) -> npt.NDArray[np.float64]:
    p = np.asarray(num_tokens, dtype=np.float64) * TOKEN_SCALE
    c = np.asarray(context, dtype=np.float64) * TOKEN_SCALE
    return np.stack([p, p * (p + c), p + c, np.ones_like(p)], axis=-1)


@dataclasses.dataclass(frozen=True)
class Fit:
    coef: tuple[float, float, float, float]  # k1, k2, k4, k5 (per 1,000 tokens, seconds)
    r2: float
    num_samples: int

    def predict(self, num_tokens: npt.ArrayLike, context: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return features(num_tokens, context) @ np.asarray(self.coef, dtype=np.float64)


class LatencyModel:
    """Rolling least-squares fit of T̂ over the last ``window`` steps.

    Refitting every step would cost a 4,000-row solve per step, so the fit is
    redone every ``refit_every`` observations; between refits the previous
    coefficients stand.
    """

    def __init__(self, window: int = 4000, refit_every: int = 16, min_samples: int = 32):
        self.window = window
        self.refit_every = refit_every
        self.min_samples = min_samples
        self._rows = np.zeros((window, 3))  # P, C, seconds
        self._num_seen = 0
        self._since_fit = 0
        self.fit: Fit | None = None

    @property
    def num_samples(self) -> int:
        return min(self._num_seen, self.window)

    def observe(self, num_tokens: int, context: int, seconds: float) -> None:
        self._rows[self._num_seen % self.window] = (num_tokens, context, seconds)
        self._num_seen += 1
        self._since_fit += 1
        if self._since_fit >= self.refit_every and self.num_samples >= self.min_samples:
            self.refit()

    def refit(self) -> Fit | None:
        self._since_fit = 0
        rows = self._rows[: self.num_samples]
        x, y = features(rows[:, 0], rows[:, 1]), rows[:, 2]
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        ss_res = float(np.sum((y - x @ coef) ** 2))
        # Steps that all look alike (ss_tot ≈ 0) say nothing about the slope:
        # report R² = 0 so the model is not trusted.
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-18 else 0.0
        k1, k2, k4, k5 = (float(k) for k in coef)
        self.fit = Fit((k1, k2, k4, k5), r2, len(y))
        return self.fit

    def trusted(self, r2_min: float) -> Fit | None:
        """The current fit if its R² reaches ``r2_min``; None while the model is not to be trusted."""
        return self.fit if self.fit is not None and self.fit.r2 >= r2_min else None


def batch_cap(fit: Fit, online_tokens: int, context: int, budget_s: float, max_tokens: int) -> int:
    """Largest batch token count B ≤ max_tokens − online_tokens such that every step
    of online_tokens + b tokens, b ≤ B, is predicted to fit ``budget_s``.

    Requiring every smaller b to fit keeps a fit that bends down at large P
    (a negative k2 from noise) from granting a cap past a region it forbids.
    """
    room = max(max_tokens - online_tokens, 0)
    b = np.arange(room + 1)
    fits = fit.predict(online_tokens + b, np.full(b.shape, context)) <= budget_s
    if fits.all():
        return room
    return int(np.argmin(fits)) - 1 if fits[0] else 0
