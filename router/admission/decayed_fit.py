"""Exponentially decayed least squares: ``y ~ intercept + sum(slope_i x x_i)``, learned online.

Invariants:
- Every sample's weight is multiplied by ``decay`` when a newer one arrives, so the fit
  follows a worker that changes speed; the sums hold O(features^2) numbers, never samples.
- Slopes are never negative: a time cannot fall as load or tokens grow, and a negative
  slope fitted from noise would promise work for free. A feature whose slope comes out
  negative, or that the samples do not vary (or vary only together with another), is
  left out and the rest refitted; the intercept is never below 0.
- Of subsets that explain the samples alike, the one over earlier features wins: list
  the simplest (the one to extrapolate with) first.
- With no usable feature, only the mean rate over the first feature is known: the line
  through the origin and the means (``y / x_0``), or nothing while ``x_0`` is 0.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations


class DecayedFit:
    __slots__ = ("_features", "_sum_x", "_sum_xx", "_sum_xy", "_sum_y", "_weight", "samples")

    def __init__(self, features: int = 1) -> None:
        self._features = features
        self._weight = 0.0
        self._sum_x = [0.0] * features
        self._sum_y = 0.0
        self._sum_xx = [[0.0] * features for _ in range(features)]
        self._sum_xy = [0.0] * features
        self.samples = 0

    def __repr__(self) -> str:
        return f"DecayedFit(features={self._features}, samples={self.samples})"

    def add(self, x: Sequence[float], y: float, decay: float) -> None:
        self._weight = self._weight * decay + 1.0
        self._sum_y = self._sum_y * decay + y
        for i, xi in enumerate(x):
            self._sum_x[i] = self._sum_x[i] * decay + xi
            self._sum_xy[i] = self._sum_xy[i] * decay + xi * y
            row = self._sum_xx[i]
            for j, xj in enumerate(x):
                row[j] = row[j] * decay + xi * xj
        self.samples += 1

    def solve(self, min_samples: int) -> tuple[float, tuple[float, ...]] | None:
        """(intercept, slopes), or None while fewer than ``min_samples`` or ``x_0`` is 0."""
        if self.samples < max(1, min_samples):
            return None
        w = self._weight
        mean = [s / w for s in self._sum_x]
        mean_y = self._sum_y / w
        cov = [
            [self._sum_xx[i][j] / w - mean[i] * mean[j] for j in range(self._features)]
            for i in range(self._features)
        ]
        cov_y = [self._sum_xy[i] / w - mean[i] * mean_y for i in range(self._features)]
        # All samples (nearly) one value of a feature: it explains nothing.
        varying = [i for i in range(self._features) if cov[i][i] > 1e-6 * max(1.0, mean[i] ** 2)]
        best: tuple[float, dict[int, float]] | None = None  # (explained variance, slopes)
        for size in range(len(varying), 0, -1):
            for subset in combinations(varying, size):
                slopes = _solve([[cov[i][j] for j in subset] for i in subset],
                                [cov_y[i] for i in subset])  # fmt: skip
                if slopes is None or min(slopes) <= 0:
                    continue
                explained = sum(b * cov_y[i] for b, i in zip(slopes, subset, strict=True))
                # Ties (two sizes fit a line and a square alike) keep the earlier
                # features: callers list the simplest first.
                if best is None or explained > best[0] * (1 + 1e-9) + 1e-15:
                    best = (explained, dict(zip(subset, slopes, strict=True)))
            if best is not None:
                break  # the most features that fit; fewer only when none of these do
        if best is None:
            if mean[0] <= 0:
                return None
            return 0.0, (mean_y / mean[0],) + (0.0,) * (self._features - 1)
        slopes = tuple(best[1].get(i, 0.0) for i in range(self._features))
        intercept = mean_y - sum(b * m for b, m in zip(slopes, mean, strict=True))
        return max(0.0, intercept), slopes


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``a x = b`` by Gaussian elimination with partial pivoting; None when (nearly)
    singular, i.e. the features move together and their split is not identifiable."""
    n = len(b)
    scale = max(abs(a[i][i]) for i in range(n))
    rows = [[*a[i], b[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) <= 1e-9 * scale:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [v - factor * p for v, p in zip(rows[r], rows[col], strict=True)]
    return [rows[i][n] / rows[i][i] for i in range(n)]
