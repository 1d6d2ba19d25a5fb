"""Evidently's drift statistics computed from two column sketches (:mod:`data.sketches`), each with a bound on how
far the sketch can move it.

Each keeps the meaning of Evidently 0.7.23's stattest of the same name (``evidently/legacy/calculations/
stattests/``): ``wasserstein`` (``wasserstein_distance_norm.py``: scipy's first Wasserstein distance over the
reference's standard deviation, at least 0.001) from the two quantile functions on a rank grid; ``ks``
(``ks_stattest.py``: scipy's two-sample KS p-value, Smirnov's asymptotic formula above 10,000 values a side) from
the two CDFs at both sides' quantile points; ``psi``, ``jensenshannon`` and ``kl_div`` (``utils.get_binned_data``:
numbers with more than 20 reference values in numpy's Sturges bins over both sides' range, else per value; PSI and
KL with Evidently's zero filling) from the CDFs at the bin edges or the counts; ``chisquare`` from the counts.
Exact sketches (every distinct value counted) give Evidently's scores to rounding.

A KLL sketch's CDF is within ``rank_error`` of the truth everywhere, so: a bin's share within twice that; KS's
statistic within both sides' errors added; the Wasserstein distance (the area between the CDFs) within each side's
error times its range, plus the rank grid's error (both ranges over :data:`RANK_GRID`), over the standard deviation;
binned distances within the largest change of the score when the CDF at each bin edge (or each count) moves by its
error, added up over the edges."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.spatial import distance

from data.sketches import CategoricalSketch, NumericSketch

RANK_GRID = 20_000
"""Points of the rank grid on which the quantile functions are compared (Wasserstein)."""
KS_POINTS = 4_000
"""Quantile points per side at which the two CDFs are compared (KS), besides min and max."""
SKETCH_METHODS = frozenset({"wasserstein", "ks", "psi", "jensenshannon", "kl_div", "chisquare"})
"""Stattests computed from sketches; any other needs raw values (a side's exact values or its seeded sample)."""


class Numbers:
    """The CDF and quantile function of a numeric sketch's finite values: exact from its counts, else its KLL."""

    def __init__(self, sketch: NumericSketch):
        self.sketch, self.exact, self.n = sketch, sketch.exact, sketch.count
        self.error = sketch.rank_error
        if self.exact:
            self.values, self.cum = sketch.values, np.cumsum(sketch.counts) / sketch.count

    def cdf(self, points: np.ndarray, *, inclusive: bool = True) -> np.ndarray:
        """Share of values <= each point (``inclusive``) or < it; ``points`` sorted and distinct."""
        if self.exact:
            index = np.searchsorted(self.values, points, "right" if inclusive else "left")
            return np.where(index > 0, self.cum[np.maximum(index - 1, 0)], 0.0)
        return np.asarray(self.sketch.kll.get_cdf(points.tolist(), inclusive)[:-1])

    def quantiles(self, ranks: np.ndarray) -> np.ndarray:
        """The smallest value whose CDF reaches each rank in (0, 1]."""
        if self.exact:
            return self.values[np.minimum(np.searchsorted(self.cum, ranks, "left"), len(self.values) - 1)]
        return np.asarray(self.sketch.kll.get_quantiles(ranks.tolist(), True))

    def points(self) -> np.ndarray:
        """Where this side's CDF steps: its distinct values, or its quantiles on a grid and its min and max."""
        if self.exact:
            return self.values
        grid = self.quantiles(np.arange(1, KS_POINTS + 1) / KS_POINTS)
        return np.unique(np.concatenate([grid, [self.sketch.min, self.sketch.max]]))

    @property
    def range(self) -> float:
        return self.sketch.max - self.sketch.min


def wasserstein_normed(ref: NumericSketch, cur: NumericSketch) -> tuple[float, float]:
    """Evidently's ``wasserstein`` score and its error bound."""
    a, b = Numbers(ref), Numbers(cur)
    norm = max(ref.std, 0.001)
    if a.exact and b.exact:
        x = np.union1d(a.values, b.values)
        return float(np.sum(np.abs(a.cdf(x[:-1]) - b.cdf(x[:-1])) * np.diff(x))) / norm, 0.0
    ranks = (np.arange(RANK_GRID) + 0.5) / RANK_GRID
    distance_ = float(np.mean(np.abs(a.quantiles(ranks) - b.quantiles(ranks))))
    error = a.error * a.range + b.error * b.range + (a.range + b.range) / RANK_GRID
    return distance_ / norm, error / norm


def ks_statistic(ref: NumericSketch, cur: NumericSketch) -> tuple[float, float]:
    """The largest CDF difference over both sides' quantile points, and its error bound (both rank errors)."""
    a, b = Numbers(ref), Numbers(cur)
    x = np.union1d(a.points(), b.points())
    return float(np.max(np.abs(a.cdf(x) - b.cdf(x)))), a.error + b.error


def ks_p_value(statistic: float, n_ref: int, n_cur: int) -> float:
    """scipy ``ks_2samp``'s two-sided asymptotic p-value (its method for more than 10,000 values a side)."""
    m, n = sorted([float(n_ref), float(n_cur)], reverse=True)
    return float(np.clip(stats.kstwo.sf(statistic, np.round(m * n / (m + n))), 0, 1))


def sturges_shares(ref: NumericSketch, cur: NumericSketch) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Each side's share of values per bin of ``np.histogram_bin_edges(both sides, bins="sturges")`` (Evidently's
    bins for numbers with more than 20 reference values), and each side's error of the CDF at a bin edge."""
    a, b = Numbers(ref), Numbers(cur)
    low, high = min(ref.min, cur.min), max(ref.max, cur.max)
    edges = _sturges_edges(low, high, ref.count + cur.count)
    shares = [np.diff(np.concatenate([[0.0], side.cdf(edges[1:-1], inclusive=False), [1.0]])) for side in (a, b)]
    return shares[0], shares[1], a.error, b.error


def _sturges_edges(low: float, high: float, n: int) -> np.ndarray:
    """numpy's ``histogram_bin_edges(..., bins="sturges")`` of ``n`` values from ``low`` to ``high``
    (``numpy/lib/_histograms_impl.py``: width ptp / (log2(n) + 1), ceil(ptp / width) equal bins)."""
    if low == high:
        return np.array([low - 0.5, high + 0.5])
    width = (high - low) / (np.log2(n) + 1.0)
    return np.linspace(low, high, int(np.ceil((high - low) / width)) + 1)


def value_shares(ref_values: np.ndarray, ref_counts: np.ndarray, cur_values: np.ndarray,
                 cur_counts: np.ndarray, ref_total: int, cur_total: int) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' shares per value of the union of their values (Evidently's unbinned shares); mass the counts
    do not name (a frequent-items sketch's rare categories) becomes one more value, ``other``."""
    keys = np.union1d(ref_values, cur_values)
    out = []
    for values, counts, total in ((ref_values, ref_counts, ref_total), (cur_values, cur_counts, cur_total)):
        shares = np.zeros(len(keys) + 1)
        shares[np.searchsorted(keys, values)] = counts / total
        shares[-1] = max(0.0, 1 - shares[:-1].sum()) if counts.sum() < total else 0.0
        out.append(shares)
    if out[0][-1] == 0 and out[1][-1] == 0:
        out = [shares[:-1] for shares in out]
    return out[0], out[1]


def numeric_counts(sketch: NumericSketch) -> tuple[np.ndarray, np.ndarray]:
    """A numeric sketch's distinct values and counts, or (when not exact) its quantile points with the KLL's
    estimated count at each (the unbinned comparison of a reference with at most 20 values to a current batch with
    very many)."""
    if sketch.exact:
        return sketch.values, sketch.counts
    view = Numbers(sketch)
    points = view.points()
    return points, np.round((view.cdf(points) - view.cdf(points, inclusive=False)) * sketch.count).astype("int64")


def category_counts(sketch: CategoricalSketch) -> tuple[np.ndarray, np.ndarray]:
    values, counts = sketch.category_counts()
    return values.astype(str), counts


def binned_distance(method: str, ref: np.ndarray, cur: np.ndarray) -> float:
    """Evidently's ``psi``, ``jensenshannon`` or ``kl_div`` of two share vectors."""
    if method == "jensenshannon":
        return float(distance.jensenshannon(ref, cur))
    ref, cur = _fill_zeroes(ref), _fill_zeroes(cur)
    if method == "psi":
        return float(np.sum((ref - cur) * np.log(ref / cur)))
    assert method == "kl_div", method
    return float(stats.entropy(ref, cur))


def _fill_zeroes(shares: np.ndarray) -> np.ndarray:
    """``get_binned_data(..., feel_zeroes=True)``: zero shares become the smallest share / 1e6 (at most 1e-4)."""
    shares = shares.copy()
    smallest = shares[shares != 0].min()
    shares[shares == 0] = smallest / 10**6 if smallest <= 0.0001 else 0.0001
    return shares


def distance_error(method: str, ref: np.ndarray, cur: np.ndarray, ref_error: float, cur_error: float, *,
                   cumulative: bool) -> float:
    """Bound on the change of :func:`binned_distance` when the shares move within their error: each share by its
    side's error (``cumulative`` False: counts), or each CDF value at an inner bin edge by it, moving the two
    adjacent shares in opposite directions (``cumulative``: bins of a KLL CDF). Adds up, per share or edge, the
    larger change of the two directions."""
    base, total = binned_distance(method, ref, cur), 0.0
    for side, error in ((0, ref_error), (1, cur_error)):
        for j in range(len(ref) - 1 if cumulative else len(ref)) if error else ():
            worst = 0.0
            for sign in (1.0, -1.0):
                moved = [ref.copy(), cur.copy()]
                moved[side][j] += sign * error
                if cumulative:
                    moved[side][j + 1] -= sign * error
                moved[side] = np.clip(moved[side], 0.0, 1.0)
                worst = max(worst, abs(binned_distance(method, *moved) - base))
            total += worst
    return total


def chisquare_p_value(ref: np.ndarray, cur: np.ndarray, n_cur: int) -> float:
    """Evidently's ``chisquare`` p-value from both sides' shares per value: scipy's ``chisquare`` of the current
    counts against the reference counts scaled to the current size."""
    return float(stats.chisquare(cur * n_cur, ref * n_cur)[1])


def max_share_difference(ref: np.ndarray, cur: np.ndarray) -> float:
    return float(np.max(np.abs(ref - cur)))


def resolvable(effect: float, error: float) -> bool:
    """Whether a difference between the two sides (``effect``) is larger than the sketches' error can make it."""
    return error == 0 or effect > error


def is_binned(ref: NumericSketch) -> bool:
    """Evidently bins a numeric column with more than 20 distinct reference values (``get_binned_data``)."""
    return not ref.exact or len(ref.values) > 20


def distinct_in_both(ref: NumericSketch, cur: NumericSketch) -> float:
    """Evidently's ``n_values`` for its default stattest: the reference's distinct values when more than 5, else
    those of both sides together (inf when a side has too many to count)."""
    if not ref.exact:
        return math.inf
    if len(ref.values) > 5:
        return len(ref.values)
    return len(np.union1d(ref.values, cur.values)) if cur.exact else math.inf
